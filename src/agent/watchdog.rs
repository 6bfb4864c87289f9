//! The memory watchdog: reads the memory in use every `[watchdog] interval_s` and publishes
//! `memory_high` when it reaches the `memory_high` share of its limit, then `memory_ok` once it
//! is back at or below the `memory_ok` share. The gap between the two shares is the hysteresis
//! that keeps a reading hovering near one threshold from flapping: each crossing is reported
//! once.
//!
//! What is watched:
//! - by default, the device against its own limit: on a discrete GPU the memory every process
//!   holds against the device's total; on the CPU and on an integrated GPU (Jetson's unified
//!   memory) host memory in use against the tightest of MemTotal and every cgroup limit above
//!   the agent, which is what the kernel's OOM killer acts on;
//! - with `memory_limit`, this process against that cap: the CUDA pool's reservation, or the
//!   resident set on the CPU.
//!
//! While memory is high the inference thread also halves its batch at every reading, down to 1
//! (`watchdog.lower_batch`, on by default; `agent::pipeline`), and probes back up only after
//! `memory_ok` and the OOM quiet period.
//!
//! It works on [`DeviceMemory`] readings (the publisher queries them) and does no I/O itself.

use crate::agent::config::WatchdogConfig;
use crate::agent::messages::{EventBody, MemoryScope, MemoryWatch};
use crate::agent::telemetry::DeviceMemory;

/// The limit name of a reading against `watchdog.memory_limit`.
pub const CONFIG_LIMIT: &str = "config:watchdog.memory_limit";

/// One reading: memory in use against its limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub scope: MemoryScope,
    pub used: u64,
    pub limit: u64,
    pub limit_name: String,
}

impl Reading {
    /// The reading `cfg` asks for from `mem`; None where the device cannot tell.
    pub fn from_memory(mem: &DeviceMemory, cfg: &WatchdogConfig) -> Option<Self> {
        match cfg.memory_limit {
            Some(limit) => Some(Self { scope: MemoryScope::Process, used: mem.process_reserved?, limit, limit_name: CONFIG_LIMIT.into() }),
            None => Some(Self {
                scope: MemoryScope::Device,
                used: mem.used?,
                limit: mem.total?,
                limit_name: mem.limit.clone().unwrap_or_else(|| "device".into()),
            }),
        }
    }

    /// `used / limit` (a limit of 0 reads as full).
    pub fn share(&self) -> f64 {
        if self.limit == 0 {
            return f64::INFINITY;
        }
        self.used as f64 / self.limit as f64
    }
}

/// The watchdog's state: whether memory is high (since the last `memory_high`).
#[derive(Debug, Default)]
pub struct Watchdog {
    high: bool,
}

impl Watchdog {
    /// Whether memory is held high now.
    pub fn is_high(&self) -> bool {
        self.high
    }

    /// Takes one reading under the thresholds of `cfg`; the event it calls for, if any.
    pub fn observe(&mut self, r: &Reading, cfg: &WatchdogConfig) -> Option<EventBody> {
        let share = r.share();
        let threshold = if !self.high && share >= cfg.high {
            cfg.high
        } else if self.high && share <= cfg.ok {
            cfg.ok
        } else {
            return None;
        };
        self.high = !self.high;
        let figures = MemoryWatch {
            scope: r.scope,
            used: r.used,
            limit: r.limit,
            limit_name: r.limit_name.clone(),
            share: if share.is_finite() { (share * 1e4).round() / 1e4 } else { f64::MAX },
            threshold,
        };
        Some(if self.high { EventBody::MemoryHigh(figures) } else { EventBody::MemoryOk(figures) })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const GIB: u64 = 1 << 30;

    fn cfg(memory_limit: Option<u64>) -> WatchdogConfig {
        WatchdogConfig { interval: Duration::from_secs(2), high: 0.9, ok: 0.8, memory_limit, lower_batch: true }
    }

    fn mem(total: u64, free: u64, reserved: u64) -> DeviceMemory {
        DeviceMemory {
            total: Some(total),
            free: Some(free),
            used: Some(total - free),
            limit: Some("cgroup:/box memory.max".into()),
            process_used: Some(reserved),
            process_reserved: Some(reserved),
            process_high_water: None,
        }
    }

    fn kinds(w: &mut Watchdog, c: &WatchdogConfig, used: &[u64], total: u64) -> Vec<&'static str> {
        used.iter().filter_map(|&u| w.observe(&Reading::from_memory(&mem(total, total - u, 0), c).unwrap(), c)).map(|e| e.kind()).collect()
    }

    #[test]
    fn each_crossing_is_reported_once_with_hysteresis() {
        let c = cfg(None);
        let mut w = Watchdog::default();
        // 85 % hovers between the thresholds: nothing; 90 % is high once, however long it stays;
        // 85 % again is still high; 80 % is ok once
        let used = [50, 85, 89, 90, 95, 99, 85, 88, 81, 80, 70, 85, 89, 91];
        assert_eq!(kinds(&mut w, &c, &used.map(|p| p * GIB / 100), GIB), vec!["memory_high", "memory_ok", "memory_high"]);
        assert!(w.is_high());
    }

    #[test]
    fn device_readings_name_the_binding_limit() {
        let r = Reading::from_memory(&mem(4 * GIB, GIB, 100), &cfg(None)).unwrap();
        assert_eq!(r, Reading { scope: MemoryScope::Device, used: 3 * GIB, limit: 4 * GIB, limit_name: "cgroup:/box memory.max".into() });
        let mut w = Watchdog::default();
        let c = WatchdogConfig { high: 0.7, ok: 0.5, ..cfg(None) };
        let Some(EventBody::MemoryHigh(f)) = w.observe(&r, &c) else { panic!("75 % is above 0.7") };
        assert_eq!((f.share, f.threshold, f.scope), (0.75, 0.7, MemoryScope::Device));
    }

    #[test]
    fn a_cap_watches_this_process_and_follows_config_edits() {
        let m = mem(64 * GIB, 60 * GIB, 600 << 20);
        let mut w = Watchdog::default();
        // lowered below what the process holds: high; raised again: ok
        let low = cfg(Some(512 << 20));
        let Some(EventBody::MemoryHigh(f)) = w.observe(&Reading::from_memory(&m, &low).unwrap(), &low) else { panic!() };
        assert_eq!((f.scope, f.used, f.limit, f.limit_name.as_str()), (MemoryScope::Process, 600 << 20, 512 << 20, CONFIG_LIMIT));
        assert!(f.share > 1.0);
        assert_eq!(w.observe(&Reading::from_memory(&m, &low).unwrap(), &low), None);
        let high = cfg(Some(4 * GIB));
        let Some(EventBody::MemoryOk(f)) = w.observe(&Reading::from_memory(&m, &high).unwrap(), &high) else { panic!() };
        assert_eq!(f.threshold, 0.8);
    }

    #[test]
    fn unknown_figures_give_no_reading() {
        let none = DeviceMemory::default();
        assert_eq!(Reading::from_memory(&none, &cfg(None)), None);
        assert_eq!(Reading::from_memory(&none, &cfg(Some(GIB))), None);
        let zero = Reading { scope: MemoryScope::Device, used: 0, limit: 0, limit_name: "x".into() };
        let Some(EventBody::MemoryHigh(f)) = Watchdog::default().observe(&zero, &cfg(None)) else { panic!() };
        assert_eq!(f.share, f64::MAX);
    }
}
