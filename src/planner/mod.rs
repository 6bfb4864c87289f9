//! Memory-aware batch planning: a budget from the device's free memory, a memory model fitted
//! to measured peaks (fixed + per-image bytes), the largest batch whose predicted peak fits,
//! verified by a real forward pass and stepped down on failure.
//!
//! The planning logic is generic over a [`Prober`] (one measured forward pass at a batch size),
//! so it is tested on the CPU with synthetic probers; [`DetectorProber`] is the real one.
//! What it avoids (the known failure modes of ultralytics' AutoBatch): extrapolating only from
//! tiny probes (the chosen batch is always verified, and a verified point re-fits the model),
//! whole-GiB rounding (bytes throughout), counting other processes' memory as ours (the peak
//! is this process's allocator high-water mark, the budget the device's free memory), and
//! returning a batch at or above one that failed.
//!
//! One job per file: [`budget`] (what may be used), [`fit`] (the memory model), [`search`] (the
//! largest batch that fits, verified), [`probe`] (measured passes of the real detector),
//! [`shape`] (the plan at another input shape), [`report`] (the figures telemetry carries).
//!
//! May use: the detector, the backend's memory queries, and the vision types of a probe input.

mod budget;
mod fit;
mod probe;
mod report;
mod search;
mod shape;

pub use budget::Budget;
pub use fit::MemoryFit;
pub use probe::{DetectorProber, Peaks, Soak, StageTimes, MEASURED_PASSES};
pub use report::MemoryTelemetry;
pub use search::{plan, Plan, Step};
#[cfg(test)]
pub(crate) use shape::test_plan;
pub use shape::{ShapeDecision, ShapePlan, ShapeProbe};

use serde::Serialize;

use crate::backend::devmem;

pub const MIB: f64 = 1024.0 * 1024.0;

/// Why planning failed.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("invalid planner setting: {0}")]
    Config(String),
    #[error("not even batch 1 fits: {0}")]
    NothingFits(String),
    #[error("probe at batch {batch} failed: {reason}")]
    Probe { batch: usize, reason: String },
    #[error(transparent)]
    Memory(#[from] devmem::DevMemError),
}

/// A failed probe.
#[derive(Debug)]
pub enum ProbeError {
    /// The device ran out of memory (the planner steps down).
    Oom(String),
    /// Anything else (the planner gives up).
    Other(String),
}

/// One measured forward pass: the peak bytes it needed above what was resident before it.
pub trait Prober {
    fn peak_at(&mut self, batch: usize) -> Result<u64, ProbeError>;

    /// The bytes the pass's tensors held at once in the last successful [`Self::peak_at`] (the
    /// pool's *used* high-water mark), where the prober can read it; the planner reports the
    /// model's own memory from it beside the pool's reservation.
    fn last_used(&self) -> Option<u64> {
        None
    }
}

/// Planner settings.
#[derive(Debug, Clone, Serialize)]
pub struct PlannerConfig {
    /// Cap on the memory the agent may use, below the device's free memory (bytes).
    pub memory_limit: Option<u64>,
    /// Share of min(free, memory_limit) that the agent plans to use.
    pub memory_fraction: f64,
    /// Largest batch the agent will run.
    pub max_batch: usize,
    /// Batches measured to fit the memory model (ascending, small).
    pub probe_batches: Vec<usize>,
    /// Whether partial batches run padded up to a ladder of CUDA graphs (powers of two up to
    /// the chosen batch, [`crate::detector::graph_rung`]): then every rung below the chosen batch
    /// is measured once the batch is chosen, so that each batch the agent runs is predicted from
    /// its own reading. Memory between two distant readings is not a straight line (yolov9m
    /// read 536 MiB at batch 8 where the line from 4 to 60 gave 381).
    pub rungs: bool,
}

impl Default for PlannerConfig {
    fn default() -> Self {
        Self { memory_limit: None, memory_fraction: 0.8, max_batch: 256, probe_batches: vec![1, 2, 4], rungs: false }
    }
}

impl PlannerConfig {
    pub fn validate(&self) -> Result<(), PlanError> {
        if !(self.memory_fraction > 0.0 && self.memory_fraction <= 1.0) {
            return Err(PlanError::Config(format!("memory_fraction {} must be in (0, 1]", self.memory_fraction)));
        }
        if self.max_batch == 0 || self.max_batch > 65536 {
            return Err(PlanError::Config(format!("max_batch {} must be in 1..=65536", self.max_batch)));
        }
        if self.probe_batches.is_empty() || self.probe_batches.contains(&0) || self.probe_batches.windows(2).any(|w| w[0] >= w[1]) {
            return Err(PlanError::Config(format!("probe_batches {:?} must be ascending and positive", self.probe_batches)));
        }
        if self.memory_limit == Some(0) {
            return Err(PlanError::Config("memory_limit must be positive".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
