//! What the plan reports beyond its choice: the memory figures the agent's telemetry carries.

use serde::Serialize;

use super::*;
use crate::backend::devmem::{self, DeviceMemory};

/// Telemetry values for the agent (the memory gauges of `telemetry`).
#[derive(Debug, Clone, Serialize)]
pub struct MemoryTelemetry {
    pub device_total: u64,
    pub device_free: u64,
    /// The limit that sets `device_free` (`devmem::Limit`, e.g. `meminfo:MemAvailable`).
    pub device_limit: String,
    pub process_used: u64,
    pub process_reserved: u64,
    pub process_high_water: u64,
    pub predicted_peak: u64,
    pub verified_peak: u64,
    pub startup_batch: usize,
    pub current_batch: usize,
    pub oom_fallbacks: u64,
    /// Unix seconds of the last out-of-memory fallback.
    pub last_oom_unix: Option<u64>,
}

impl MemoryTelemetry {
    pub fn new(plan: &Plan, mem: DeviceMemory, usage: devmem::Usage) -> Self {
        Self {
            device_total: mem.total,
            device_free: mem.free,
            device_limit: mem.limit.to_string(),
            process_used: usage.used,
            process_reserved: usage.reserved,
            process_high_water: usage.used_high,
            predicted_peak: plan.predicted_peak,
            verified_peak: plan.verified_peak,
            startup_batch: plan.batch,
            current_batch: plan.batch,
            oom_fallbacks: 0,
            last_oom_unix: None,
        }
    }

    /// Records an out-of-memory fallback to `new_batch`.
    pub fn record_oom(&mut self, new_batch: usize) {
        self.oom_fallbacks += 1;
        self.current_batch = new_batch;
        self.last_oom_unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_secs());
    }
}
