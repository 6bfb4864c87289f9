//! Agent telemetry: monotonic counters, per-stage latency percentiles, gauges, process RSS and
//! device memory, snapshotted into the `telemetry` message.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

pub use crate::agent::messages::Percentiles;
use crate::agent::messages::{
    self, BatchTelemetry, ConfigCounters, DeviceMemoryFigures, FrameCounters, MqttCounters, ProcessMemory, Queues, StageLatency, Telemetry,
};
use crate::backend::devmem::{self, PeakMeter, SysRoot};

/// Samples kept per stage for the percentiles.
const WINDOW: usize = 2048;

/// Device memory figures, in bytes (absent where the device cannot tell).
#[derive(Debug, Clone, Default, Serialize)]
pub struct DeviceMemory {
    pub total: Option<u64>,
    pub free: Option<u64>,
    pub used: Option<u64>,
    /// The limit that sets `free` (see `devmem::Limit`).
    pub limit: Option<String>,
    /// Allocator figures of this process on the device (CUDA pool), when known.
    pub process_used: Option<u64>,
    pub process_reserved: Option<u64>,
    pub process_high_water: Option<u64>,
}

/// Where device memory figures come from (a trait, so that tests can stand in for a device).
pub trait MemorySource: Send + Sync {
    fn query(&self) -> DeviceMemory;
}

/// The figures of one device through [`devmem`], read afresh at every query: the CUDA driver and
/// the stream-ordered pool; on the CPU and an integrated GPU, MemAvailable capped by every cgroup
/// limit above the agent (so telemetry shows the headroom that is left under the limit that binds
/// now) and this process's RSS/VmHWM.
pub struct DeviceMemorySource {
    device: candle_core::Device,
    meter: PeakMeter,
    root: SysRoot,
}

impl DeviceMemorySource {
    pub fn new(device: &candle_core::Device) -> Self {
        Self::with_root(device, SysRoot::host())
    }

    /// Host memory files read under `root` instead of `/` (tests).
    pub fn with_root(device: &candle_core::Device, root: SysRoot) -> Self {
        Self { device: device.clone(), meter: PeakMeter::new(device), root }
    }
}

impl MemorySource for DeviceMemorySource {
    fn query(&self) -> DeviceMemory {
        let mem = devmem::device_memory_in(&self.device, &self.root).ok();
        // no synchronisation: telemetry must not stall the inference stream
        let usage = self.meter.snapshot().ok();
        DeviceMemory {
            total: mem.as_ref().map(|m| m.total),
            free: mem.as_ref().map(|m| m.free),
            used: mem.as_ref().map(|m| m.total.saturating_sub(m.free)),
            limit: mem.as_ref().map(|m| m.limit.to_string()),
            process_used: usage.map(|u| u.used),
            process_reserved: usage.map(|u| u.reserved),
            process_high_water: usage.map(|u| u.used_high),
        }
    }
}

fn status_kb(key: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|v| v * 1024)
}

/// Resident set size of this process.
pub fn process_rss() -> Option<u64> {
    status_kb("VmRSS:")
}

/// Pipeline stages whose latency is tracked.
#[derive(Debug, Clone, Copy)]
pub enum Stage {
    Decode = 0,
    Infer = 1,
    Post = 2,
    Publish = 3,
}

/// Counters and gauges shared by all parts of the agent.
#[derive(Default)]
pub struct Stats {
    pub frames_in: AtomicU64,
    pub frames_ok: AtomicU64,
    pub frames_failed: AtomicU64,
    pub batches: AtomicU64,
    pub detections_published: AtomicU64,
    pub detections_acked: AtomicU64,
    pub spooled_total: AtomicU64,
    pub spool_replayed: AtomicU64,
    pub reconnects: AtomicU64,
    pub connect_refused: AtomicU64,
    pub events_dropped: AtomicU64,
    pub inputs_rejected: AtomicU64,
    pub oom_fallbacks: AtomicU64,
    pub last_oom_unix_ms: AtomicU64,
    pub batch_current: AtomicU64,
    pub batch_startup: AtomicU64,
    /// The planner's predicted and verified peak bytes at the startup batch (0: not planned).
    pub plan_predicted_peak: AtomicU64,
    pub plan_verified_peak: AtomicU64,
    /// The planner's memory budget in bytes (0: not planned).
    pub plan_budget: AtomicU64,
    /// Set on CUDA after a plan: the pool's reserved bytes before the plan's passes (model
    /// weights). What the pool reserves above this is held against `plan_budget`.
    pub budget_watch: std::sync::OnceLock<u64>,
    pub model_reloads: AtomicU64,
    pub config_applied: AtomicU64,
    pub config_rejected: AtomicU64,
    // gauges
    pub q_intake: AtomicU64,
    pub q_decoded: AtomicU64,
    pub q_results: AtomicU64,
    pub mqtt_queued: AtomicU64,
    pub spool_len: AtomicU64,
    pub spool_bytes: AtomicU64,
    latencies: [Mutex<VecDeque<f32>>; 4],
}

impl Stats {
    pub fn record(&self, stage: Stage, ms: f64) {
        if let Ok(mut q) = self.latencies[stage as usize].lock() {
            if q.len() == WINDOW {
                q.pop_front();
            }
            q.push_back(ms as f32);
        }
    }

    pub fn percentiles(&self, stage: Stage) -> Percentiles {
        let mut v: Vec<f32> = self.latencies[stage as usize].lock().map(|q| q.iter().copied().collect()).unwrap_or_default();
        if v.is_empty() {
            return Percentiles::default();
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let p = |q: f32| v[((v.len() - 1) as f32 * q).round() as usize];
        Percentiles { p50: p(0.5), p90: p(0.9), p99: p(0.99) }
    }
}

/// Computes fps between two snapshots.
pub struct FpsMeter {
    last: Instant,
    last_frames: u64,
}

impl FpsMeter {
    pub fn new(frames: u64) -> Self {
        Self { last: Instant::now(), last_frames: frames }
    }
    pub fn tick(&mut self, frames: u64) -> f64 {
        let dt = self.last.elapsed().as_secs_f64();
        let fps = if dt > 0.0 { (frames - self.last_frames.min(frames)) as f64 / dt } else { 0.0 };
        self.last = Instant::now();
        self.last_frames = frames;
        fps
    }
}

fn nonzero(v: u64) -> Option<u64> {
    (v != 0).then_some(v)
}

/// Builds the `telemetry` message; `ts` is the time of the snapshot (RFC 3339).
pub fn snapshot(stats: &Stats, mem: &DeviceMemory, fps: f64, uptime_s: f64, device_id: &str, boot_id: &str, ts: String) -> Telemetry {
    let g = |a: &AtomicU64| a.load(Relaxed);
    Telemetry {
        v: messages::VERSION,
        device_id: device_id.to_string(),
        boot_id: boot_id.to_string(),
        ts,
        uptime_s: (uptime_s * 1000.0).round() / 1000.0,
        device_memory: DeviceMemoryFigures { total: mem.total, free: mem.free, used: mem.used, limit: mem.limit.clone() },
        process_memory: ProcessMemory {
            used: mem.process_used,
            reserved: mem.process_reserved,
            high_water: mem.process_high_water,
            rss: process_rss(),
        },
        batch: BatchTelemetry {
            current: g(&stats.batch_current),
            startup: g(&stats.batch_startup),
            oom_fallbacks: g(&stats.oom_fallbacks),
            last_oom_ms: nonzero(g(&stats.last_oom_unix_ms)),
            predicted_peak: nonzero(g(&stats.plan_predicted_peak)),
            verified_peak: nonzero(g(&stats.plan_verified_peak)),
            budget: nonzero(g(&stats.plan_budget)),
        },
        fps: (fps * 100.0).round() / 100.0,
        frames: FrameCounters {
            frames_in: g(&stats.frames_in),
            ok: g(&stats.frames_ok),
            failed: g(&stats.frames_failed),
            batches: g(&stats.batches),
            inputs_rejected: g(&stats.inputs_rejected),
        },
        latency_ms: StageLatency {
            decode: stats.percentiles(Stage::Decode),
            infer: stats.percentiles(Stage::Infer),
            post: stats.percentiles(Stage::Post),
            publish: stats.percentiles(Stage::Publish),
        },
        queues: Queues { intake: g(&stats.q_intake), decoded: g(&stats.q_decoded), results: g(&stats.q_results) },
        mqtt: MqttCounters {
            queued: g(&stats.mqtt_queued),
            spooled: g(&stats.spool_len),
            spool_bytes: g(&stats.spool_bytes),
            spooled_total: g(&stats.spooled_total),
            spool_replayed: g(&stats.spool_replayed),
            published: g(&stats.detections_published),
            acked: g(&stats.detections_acked),
            reconnects: g(&stats.reconnects),
            connect_refused: g(&stats.connect_refused),
            events_dropped: g(&stats.events_dropped),
        },
        config: ConfigCounters {
            applied: g(&stats.config_applied),
            rejected: g(&stats.config_rejected),
            model_reloads: g(&stats.model_reloads),
        },
    }
}

/// Whether the process's reserved memory crossed the planner's budget since the last reading:
/// `Some(true)` when it went over, `Some(false)` when it came back under, `None` otherwise (also
/// when there is no budget or no reading). The pool's reservation for the same batch is not
/// repeatable (up to +12.6 % over a long run measured; BENCHMARKS.md), so the agent says when it
/// holds more than it planned rather than leaving it to a dashboard to notice.
pub fn budget_crossing(was_over: bool, reserved: Option<u64>, budget: u64) -> Option<bool> {
    let reserved = reserved?;
    if budget == 0 {
        return None;
    }
    let over = reserved > budget;
    (over != was_over).then_some(over)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_crossings_are_reported_once_each_way() {
        assert_eq!(budget_crossing(false, Some(90), 100), None);
        assert_eq!(budget_crossing(false, Some(101), 100), Some(true));
        assert_eq!(budget_crossing(true, Some(120), 100), None);
        assert_eq!(budget_crossing(true, Some(100), 100), Some(false));
        // no plan (fixed batch) or no reading: nothing to say
        assert_eq!(budget_crossing(false, Some(u64::MAX), 0), None);
        assert_eq!(budget_crossing(true, None, 100), None);
    }

    #[test]
    fn percentiles_and_memory() {
        let s = Stats::default();
        for i in 1..=100 {
            s.record(Stage::Infer, i as f64);
        }
        let p = s.percentiles(Stage::Infer);
        assert_eq!((p.p50.round(), p.p90.round(), p.p99.round()), (51.0, 90.0, 99.0));
        let m = DeviceMemorySource::new(&candle_core::Device::Cpu).query();
        assert!(m.process_used.unwrap() > 0 && m.process_high_water.unwrap() >= m.process_used.unwrap());
        assert!(m.total.unwrap() > 0 && m.free.unwrap() <= m.total.unwrap());
        assert!(process_rss().unwrap() > 0);
    }

    /// Under a cgroup limit every query re-reads the limit and the usage: telemetry follows the
    /// headroom as the cgroup fills, and names the limit that binds.
    #[test]
    fn telemetry_rereads_the_cgroup_headroom() {
        let dir = tempfile::tempdir().unwrap();
        let g = 1u64 << 30;
        let svc = dir.path().join("sys/fs/cgroup/system.slice/yolo-edge.service");
        std::fs::create_dir_all(&svc).unwrap();
        std::fs::create_dir_all(dir.path().join("proc/self")).unwrap();
        std::fs::write(dir.path().join("proc/meminfo"), "MemTotal: 16777216 kB\nMemFree: 524288 kB\nMemAvailable: 8388608 kB\n").unwrap();
        std::fs::write(dir.path().join("proc/self/cgroup"), "0::/system.slice/yolo-edge.service\n").unwrap();
        std::fs::write(svc.join("memory.max"), (3 * g).to_string()).unwrap();
        std::fs::write(svc.join("memory.current"), g.to_string()).unwrap();
        let source = DeviceMemorySource::with_root(&candle_core::Device::Cpu, SysRoot::under(dir.path()));
        let m = source.query();
        assert_eq!((m.total, m.free, m.used), (Some(3 * g), Some(2 * g), Some(g)));
        assert_eq!(m.limit.as_deref(), Some("cgroup:/system.slice/yolo-edge.service memory.max"));
        std::fs::write(svc.join("memory.current"), (5 * g / 2).to_string()).unwrap();
        let m = source.query();
        assert_eq!((m.free, m.used), (Some(g / 2), Some(5 * g / 2)));
        // the limit lifted: MemAvailable binds again
        std::fs::write(svc.join("memory.max"), "max\n").unwrap();
        let m = source.query();
        assert_eq!((m.total, m.free), (Some(16 * g), Some(8 * g)));
        assert_eq!(m.limit.as_deref(), Some("meminfo:MemAvailable"));
        let t = snapshot(&Stats::default(), &m, 0.0, 1.0, "box", "boot", "ts".into());
        assert_eq!(t.device_memory.limit.as_deref(), Some("meminfo:MemAvailable"));
        assert_eq!(t.device_memory.free, Some(8 * g));
    }
}
