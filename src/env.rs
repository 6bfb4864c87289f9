//! The process environment, read once: the only module that reads environment variables (the
//! logging filter `RUST_LOG` aside, which `main` hands to tracing). Operator settings live in the
//! validated config and on the command line, not here; what remains are the variables that
//! place files and that the CUDA driver itself reads.
//!
//! | variable | use |
//! |---|---|
//! | `CUDA_CACHE_PATH` | the driver's JIT compute cache, when the operator set one |
//! | `YOLO_EDGE_CUDA_CACHE` | yolo-edge's place for that cache otherwise |
//! | `XDG_CACHE_HOME`, `HOME` | the default place: `$XDG_CACHE_HOME/yolo-edge/nv-compute-cache`, else `~/.cache/...` |
//! | `CUDA_CACHE_MAXSIZE` | left alone when set, else set to 1 GiB |
//!
//! May use: the standard library only.

use std::path::PathBuf;
use std::sync::OnceLock;

/// yolo-edge's own variable for the compute cache's folder.
pub const CUDA_CACHE_VAR: &str = "YOLO_EDGE_CUDA_CACHE";

/// The variables this process reads, as they were at the first look.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environment {
    pub cuda_cache_path: Option<String>,
    pub yolo_edge_cuda_cache: Option<String>,
    pub xdg_cache_home: Option<String>,
    pub home: Option<String>,
    pub cuda_cache_maxsize: Option<String>,
}

impl Environment {
    fn read() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Self {
            cuda_cache_path: var("CUDA_CACHE_PATH"),
            yolo_edge_cuda_cache: var(CUDA_CACHE_VAR),
            xdg_cache_home: var("XDG_CACHE_HOME"),
            home: var("HOME"),
            cuda_cache_maxsize: var("CUDA_CACHE_MAXSIZE"),
        }
    }

    /// The compute-cache folder: `CUDA_CACHE_PATH` when the operator set one, else
    /// `$YOLO_EDGE_CUDA_CACHE`, else `$XDG_CACHE_HOME/yolo-edge/nv-compute-cache`, else
    /// `~/.cache/yolo-edge/nv-compute-cache`.
    pub fn compute_cache_dir(&self) -> Option<PathBuf> {
        if let Some(p) = self.cuda_cache_path.as_ref().or(self.yolo_edge_cuda_cache.as_ref()) {
            return Some(PathBuf::from(p));
        }
        let base =
            self.xdg_cache_home.as_ref().map(PathBuf::from).or_else(|| self.home.as_ref().map(|h| PathBuf::from(h).join(".cache")))?;
        Some(base.join("yolo-edge").join("nv-compute-cache"))
    }
}

/// The environment as this process first saw it.
pub fn get() -> &'static Environment {
    static ENV: OnceLock<Environment> = OnceLock::new();
    ENV.get_or_init(Environment::read)
}

/// Points the CUDA driver at a persistent compute cache (1 GiB unless the operator chose a size)
/// and returns the folder. Must run before the first CUDA device is opened (the driver reads the
/// variables once); later calls return the same answer and change nothing.
pub fn configure_compute_cache() -> Option<PathBuf> {
    static DONE: OnceLock<Option<PathBuf>> = OnceLock::new();
    DONE.get_or_init(|| {
        let env = get();
        let dir = env.compute_cache_dir()?;
        std::fs::create_dir_all(&dir).ok()?;
        if env.cuda_cache_path.is_none() {
            std::env::set_var("CUDA_CACHE_PATH", &dir);
        }
        if env.cuda_cache_maxsize.is_none() {
            std::env::set_var("CUDA_CACHE_MAXSIZE", (1u64 << 30).to_string());
        }
        Some(dir)
    })
    .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_dir_precedence() {
        let s = |v: &str| Some(v.to_string());
        let e = Environment { cuda_cache_path: s("/a"), yolo_edge_cuda_cache: s("/b"), home: s("/h"), ..Default::default() };
        assert_eq!(e.compute_cache_dir(), Some("/a".into()));
        let e = Environment { yolo_edge_cuda_cache: s("/b"), home: s("/h"), ..Default::default() };
        assert_eq!(e.compute_cache_dir(), Some("/b".into()));
        let e = Environment { xdg_cache_home: s("/x"), home: s("/h"), ..Default::default() };
        assert_eq!(e.compute_cache_dir(), Some("/x/yolo-edge/nv-compute-cache".into()));
        let e = Environment { home: s("/h"), ..Default::default() };
        assert_eq!(e.compute_cache_dir(), Some("/h/.cache/yolo-edge/nv-compute-cache".into()));
        assert_eq!(Environment::default().compute_cache_dir(), None);
    }
}
