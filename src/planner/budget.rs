//! The memory the planner may use: the device's free memory (already capped by every cgroup
//! limit where the device is host memory, see `crate::backend::hostmem`), or the configured
//! `memory_limit` where that is tighter, times the configured fraction; and which limit bound it.

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
    /// The limit that set min(free, memory_limit): the device's (`meminfo:MemAvailable`,
    /// `cgroup:/system.slice/yolo-edge.service memory.max`, `cuda:cuMemGetInfo free`) or
    /// `config:memory_limit`.
    pub limit: String,
    /// min(free, memory_limit) x memory_fraction, bytes.
    pub bytes: u64,
}

/// [`Budget::limit`] when the configured `memory_limit` is the tightest.
pub const CONFIG_LIMIT: &str = "config:memory_limit";

impl Budget {
    pub fn new(mem: DeviceMemory, cfg: &PlannerConfig) -> Self {
        let (base, limit) = match cfg.memory_limit {
            Some(l) if l < mem.free => (l, CONFIG_LIMIT.to_string()),
            _ => (mem.free, mem.limit.to_string()),
        };
        Self {
            limit,
            free: mem.free,
            total: mem.total,
            memory_limit: cfg.memory_limit,
            memory_fraction: cfg.memory_fraction,
            source: mem.source,
            bytes: (base as f64 * cfg.memory_fraction) as u64,
        }
    }
}
