//! The memory the planner may use: the device's free memory (or a configured limit) times the
//! configured fraction.

use serde::Serialize;

use super::*;
use crate::backend::devmem::DeviceMemory;

/// The memory the agent may use.
#[derive(Debug, Clone, Serialize)]
pub struct Budget {
    pub free: u64,
    pub total: u64,
    pub memory_limit: Option<u64>,
    pub memory_fraction: f64,
    pub source: devmem::MemorySource,
    /// min(free, memory_limit) x memory_fraction, bytes.
    pub bytes: u64,
}

impl Budget {
    pub fn new(mem: DeviceMemory, cfg: &PlannerConfig) -> Self {
        let base = cfg.memory_limit.map_or(mem.free, |l| l.min(mem.free));
        Self {
            free: mem.free,
            total: mem.total,
            memory_limit: cfg.memory_limit,
            memory_fraction: cfg.memory_fraction,
            source: mem.source,
            bytes: (base as f64 * cfg.memory_fraction) as u64,
        }
    }
}
