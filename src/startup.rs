//! Startup cost control: a persistent place for the CUDA driver's JIT compute cache (candle's
//! kernels ship as PTX and are compiled on first use, 5-6 s cold on an H200), and warm-up
//! forward passes whose timings are reported as the cold and warm start.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::{Device, Tensor};
use serde::Serialize;

use crate::detector::Detector;

/// Environment variable that overrides where yolo-edge keeps the driver's compute cache.
pub const CACHE_ENV: &str = "YOLO_EDGE_CUDA_CACHE";

/// The compute-cache directory to use: `CUDA_CACHE_PATH` when the operator set one, else
/// `$YOLO_EDGE_CUDA_CACHE`, else `$XDG_CACHE_HOME/yolo-edge/nv-compute-cache`, else
/// `~/.cache/yolo-edge/nv-compute-cache`.
pub fn compute_cache_dir(env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    if let Some(p) = env("CUDA_CACHE_PATH").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = env(CACHE_ENV).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let base = env("XDG_CACHE_HOME").filter(|p| !p.is_empty()).map(PathBuf::from).or_else(|| env("HOME").filter(|p| !p.is_empty()).map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("yolo-edge").join("nv-compute-cache"))
}

/// Points the CUDA driver at a persistent compute cache (1 GiB) before any CUDA call; returns
/// the directory. Must run before the first CUDA device is opened (the driver reads the
/// variables once).
pub fn configure_compute_cache() -> Option<PathBuf> {
    let dir = compute_cache_dir(|k| std::env::var(k).ok())?;
    if std::fs::create_dir_all(&dir).is_err() {
        return None;
    }
    if std::env::var_os("CUDA_CACHE_PATH").is_none() {
        std::env::set_var("CUDA_CACHE_PATH", &dir);
    }
    if std::env::var_os("CUDA_CACHE_MAXSIZE").is_none() {
        std::env::set_var("CUDA_CACHE_MAXSIZE", (1u64 << 30).to_string());
    }
    Some(dir)
}

/// Timings of the first forward passes after loading.
#[derive(Debug, Clone, Serialize)]
pub struct StartupTimes {
    pub load_ms: f64,
    /// First forward (batch 1): kernel JIT or cache load, cuBLAS handles, allocator growth.
    pub first_forward_ms: f64,
    /// Second forward (batch 1): the warm steady state.
    pub second_forward_ms: f64,
    pub compute_cache: Option<String>,
}

/// Runs two batch-1 forward passes and times them (synchronised).
pub fn warm_up(det: &Detector, load_ms: f64) -> candle_core::Result<StartupTimes> {
    let s = det.imgsz();
    let dev: &Device = det.device();
    let x = Tensor::rand(0f32, 1f32, (1, 3, s, s), dev)?.to_dtype(det.dtype())?;
    let mut t = [0.0; 2];
    for slot in &mut t {
        dev.synchronize()?;
        let t0 = Instant::now();
        let y = det.model().forward(&x)?;
        dev.synchronize()?;
        *slot = t0.elapsed().as_secs_f64() * 1e3;
        drop(y);
    }
    Ok(StartupTimes { load_ms, first_forward_ms: t[0], second_forward_ms: t[1], compute_cache: std::env::var("CUDA_CACHE_PATH").ok() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_dir_precedence() {
        let env = |pairs: &'static [(&'static str, &'static str)]| move |k: &str| pairs.iter().find(|p| p.0 == k).map(|p| p.1.to_string());
        assert_eq!(compute_cache_dir(env(&[("CUDA_CACHE_PATH", "/a"), (CACHE_ENV, "/b"), ("HOME", "/h")])), Some("/a".into()));
        assert_eq!(compute_cache_dir(env(&[(CACHE_ENV, "/b"), ("HOME", "/h")])), Some("/b".into()));
        assert_eq!(compute_cache_dir(env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])), Some("/x/yolo-edge/nv-compute-cache".into()));
        assert_eq!(compute_cache_dir(env(&[("HOME", "/h")])), Some("/h/.cache/yolo-edge/nv-compute-cache".into()));
        assert_eq!(compute_cache_dir(env(&[])), None);
    }
}
