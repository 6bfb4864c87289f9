//! What an operator may tune in the acceleration layer, with the defaults that were measured
//! best (BENCHMARKS.md, "Settled experiments" and "GPU throughput and latency").
//!
//! The agent reads these from the config's optional `[tuning]` table, the other subcommands from
//! their command line; both are validated before anything runs and installed once, before the
//! first model is built ([`install`]). The layer reads them through [`get`]. A change needs a
//! restart: kernels, plans and the arena are set up with these values.

use std::path::PathBuf;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::units::ByteSize;

/// Where a pass's activations are placed on a CUDA device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Allocator {
    /// Deterministic best-fit placement over one reserved range ([`super::arena`]), so that the
    /// planner's readings repeat; needs a build with feature `arena`, else it is the pool.
    #[default]
    Arena,
    /// CUDA's stream-ordered pool alone.
    Pool,
}

/// The acceleration layer's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Tuning {
    /// Smallest workspace the cuDNN algorithm search is offered per convolution.
    pub cudnn_workspace_min: ByteSize,
    /// Workspace offered per convolution as a multiple of its input + output bytes (capped at
    /// 8 GiB); the fast FP16 tensor-core algorithms need it to grow with the batch.
    pub cudnn_workspace_scale: f64,
    /// How much slower than the fastest a cuDNN algorithm may be and still be chosen for needing
    /// at least 1 MiB less workspace (0.05 = 5 %; 0 = always the fastest, like PyTorch's
    /// `cudnn.benchmark`; the choice: `backend::conv::choose_algo`).
    pub cudnn_algo_slack: f64,
    /// Passes on CUDA replay captured CUDA graphs, one per input shape and batch size (small
    /// batches are launch-bound otherwise).
    pub cuda_graphs: bool,
    /// f16 convolutions run with their epilogue (bias, SiLU, residual, the write into a
    /// concatenation) as one cuDNN kernel where that times faster
    /// (`backend::cuda::cudnn_fused`): lower latency at small batches, but each new input shape
    /// and batch size first compiles its fused kernels (seconds of start-up per batch size).
    pub cudnn_fusion: bool,
    /// File that keeps each fused-convolution decision (GPU model, cuDNN and yolo-edge
    /// versions, shape -> the engine config that ran fastest, or not fused), so that a restart
    /// builds only the kept plans instead of timing several per shape (`backend::fusion_cache`);
    /// its folder must exist. Relative to the agent's config file. Unused while `cudnn_fusion`
    /// is off.
    pub cudnn_fusion_cache: Option<PathBuf>,
    /// Threads that pack a batch's pictures into the pinned upload buffer; 0 = the available
    /// cores, at most 8.
    pub upload_threads: usize,
    /// How activations are placed on a CUDA device.
    pub allocator: Allocator,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            cudnn_workspace_min: ByteSize(256 << 20),
            cudnn_workspace_scale: 6.0,
            cudnn_algo_slack: 0.05,
            cuda_graphs: true,
            cudnn_fusion: false,
            cudnn_fusion_cache: None,
            upload_threads: 0,
            allocator: Allocator::Arena,
        }
    }
}

/// A setting out of its range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("tuning.{key}: {why}")]
pub struct TuningError {
    pub key: &'static str,
    pub why: String,
}

impl Tuning {
    /// Checks every value's range.
    pub fn validate(&self) -> Result<(), TuningError> {
        let bad = |key, why: &str| Err(TuningError { key, why: why.to_string() });
        if !(self.cudnn_workspace_scale.is_finite() && (0.0..=64.0).contains(&self.cudnn_workspace_scale)) {
            return bad("cudnn_workspace_scale", "must be a number from 0 to 64");
        }
        if !(self.cudnn_algo_slack.is_finite() && (0.0..=1.0).contains(&self.cudnn_algo_slack)) {
            return bad("cudnn_algo_slack", "must be a number from 0 to 1");
        }
        if self.cudnn_workspace_min.0 > 8 << 30 {
            return bad("cudnn_workspace_min", "must be at most 8GiB");
        }
        if self.upload_threads > 256 {
            return bad("upload_threads", "must be from 0 (automatic) to 256");
        }
        if let Some(p) = &self.cudnn_fusion_cache {
            if p.is_dir() {
                return bad("cudnn_fusion_cache", &format!("{} is a folder, not a file", p.display()));
            }
            let folder = p.parent().filter(|f| !f.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
            if !folder.is_dir() {
                return bad("cudnn_fusion_cache", &format!("folder {} does not exist", folder.display()));
            }
        }
        Ok(())
    }

    /// Upload threads with 0 resolved to the available cores, at most 8.
    pub fn upload_threads(&self) -> usize {
        match self.upload_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get().min(8)),
            n => n,
        }
    }

    /// Whether the arena places activations: asked for, and built in.
    pub fn arena(&self) -> bool {
        cfg!(feature = "arena") && self.allocator == Allocator::Arena
    }
}

static INSTALLED: OnceLock<Tuning> = OnceLock::new();

/// Makes `t` the process's settings. The first call wins; a later call with other values is an
/// error (they are baked into plans and kernels already), one with the same values is not.
pub fn install(t: Tuning) -> Result<(), TuningError> {
    t.validate()?;
    let now = INSTALLED.get_or_init(|| t.clone());
    if *now != t {
        return Err(TuningError { key: "*", why: format!("already set to {now:?} in this process; a change needs a restart") });
    }
    Ok(())
}

/// The process's settings: those installed, else the defaults.
pub fn get() -> &'static Tuning {
    static DEFAULT: OnceLock<Tuning> = OnceLock::new();
    INSTALLED.get().unwrap_or_else(|| DEFAULT.get_or_init(Tuning::default))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_parse_from_an_empty_table() {
        let t: Tuning = toml::from_str("").unwrap();
        assert_eq!(t, Tuning::default());
        t.validate().unwrap();
        assert!(t.upload_threads() >= 1);
    }

    #[test]
    fn values_and_ranges() {
        let t: Tuning = toml::from_str(
            "cudnn_workspace_min = \"64MiB\"\ncuda_graphs = false\ncudnn_fusion = true\nallocator = \"pool\"\nupload_threads = 3",
        )
        .unwrap();
        assert_eq!(t.cudnn_workspace_min.0, 64 << 20);
        assert!(!t.cuda_graphs && t.cudnn_fusion && !t.arena());
        assert_eq!(t.upload_threads(), 3);
        let bad: Tuning = toml::from_str("cudnn_algo_slack = 2.0").unwrap();
        assert_eq!(bad.validate().unwrap_err().key, "cudnn_algo_slack");
        assert!(toml::from_str::<Tuning>("allocator = \"slab\"").is_err());
        assert!(toml::from_str::<Tuning>("cuda_graph = true").is_err());
    }

    #[test]
    fn the_fusion_cache_needs_an_existing_folder() {
        let dir = tempfile::tempdir().unwrap();
        let ok = Tuning { cudnn_fusion_cache: Some(dir.path().join("fusion.jsonl")), ..Tuning::default() };
        ok.validate().unwrap();
        let missing = Tuning { cudnn_fusion_cache: Some(dir.path().join("nowhere/fusion.jsonl")), ..Tuning::default() };
        let e = missing.validate().unwrap_err();
        assert_eq!(e.key, "cudnn_fusion_cache");
        assert!(e.why.contains("nowhere") && e.why.contains("does not exist"), "{}", e.why);
        let folder = Tuning { cudnn_fusion_cache: Some(dir.path().to_path_buf()), ..Tuning::default() };
        assert!(folder.validate().unwrap_err().why.contains("is a folder"));
    }
}
