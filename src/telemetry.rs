//! Agent telemetry: monotonic counters, per-stage latency percentiles, gauges, process RSS and
//! device memory, snapshotted into the `telemetry` message.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

/// Samples kept per stage for the percentiles.
const WINDOW: usize = 2048;

/// Device memory figures, in bytes (absent where the device cannot tell).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct DeviceMemory {
    pub total: Option<u64>,
    pub free: Option<u64>,
    pub used: Option<u64>,
    /// Allocator figures of this process on the device (CUDA pool), when known.
    pub process_used: Option<u64>,
    pub process_reserved: Option<u64>,
    pub process_high_water: Option<u64>,
}

/// Where device memory figures come from; the CUDA implementation belongs to the memory planner.
pub trait MemorySource: Send + Sync {
    fn query(&self) -> DeviceMemory;
}

/// The CPU device: `MemTotal`/`MemAvailable` from /proc/meminfo, capped by the cgroup limit.
pub struct CpuMemory;

impl MemorySource for CpuMemory {
    fn query(&self) -> DeviceMemory {
        let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let kb = |key: &str| {
            info.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
                .map(|v| v * 1024)
        };
        let (mut total, mut free) = (kb("MemTotal:"), kb("MemAvailable:"));
        if let Some((limit, current)) = cgroup_memory() {
            total = Some(total.map_or(limit, |t| t.min(limit)));
            let cg_free = limit.saturating_sub(current);
            free = Some(free.map_or(cg_free, |f| f.min(cg_free)));
        }
        let rss = process_rss();
        DeviceMemory {
            total,
            free,
            used: total.zip(free).map(|(t, f)| t.saturating_sub(f)),
            process_used: rss,
            process_reserved: rss,
            process_high_water: process_hwm(),
        }
    }
}

/// Reports nothing: a device whose figures are not wired up yet (CUDA until the planner lands).
pub struct UnknownMemory;
impl MemorySource for UnknownMemory {
    fn query(&self) -> DeviceMemory {
        DeviceMemory::default()
    }
}

/// cgroup v2 (or v1) memory limit and usage of this process, when limited.
fn cgroup_memory() -> Option<(u64, u64)> {
    let read = |p: &str| std::fs::read_to_string(p).ok().and_then(|s| s.trim().parse::<u64>().ok());
    let cg = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let v2 = cg.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or("/");
    let base = format!("/sys/fs/cgroup{}", if v2 == "/" { "" } else { v2 });
    if let (Some(limit), Some(cur)) = (read(&format!("{base}/memory.max")), read(&format!("{base}/memory.current"))) {
        return Some((limit, cur));
    }
    match (read("/sys/fs/cgroup/memory/memory.limit_in_bytes"), read("/sys/fs/cgroup/memory/memory.usage_in_bytes")) {
        (Some(l), Some(c)) if l < (1 << 60) => Some((l, c)),
        _ => None,
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
/// Peak resident set size of this process.
pub fn process_hwm() -> Option<u64> {
    status_kb("VmHWM:")
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

/// p50/p90/p99 in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Percentiles {
    pub p50: f32,
    pub p90: f32,
    pub p99: f32,
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

/// Builds the `telemetry` message.
pub fn snapshot(stats: &Stats, mem: &DeviceMemory, fps: f64, uptime_s: f64, base: serde_json::Value) -> serde_json::Value {
    let g = |a: &AtomicU64| a.load(Relaxed);
    let mut v = base;
    let last_oom = g(&stats.last_oom_unix_ms);
    v["uptime_s"] = serde_json::json!((uptime_s * 1000.0).round() / 1000.0);
    v["device_memory"] = serde_json::json!({ "total": mem.total, "free": mem.free, "used": mem.used });
    v["process_memory"] = serde_json::json!({
        "used": mem.process_used, "reserved": mem.process_reserved, "high_water": mem.process_high_water,
        "rss": process_rss(),
    });
    v["batch"] = serde_json::json!({
        "current": g(&stats.batch_current), "startup": g(&stats.batch_startup),
        "oom_fallbacks": g(&stats.oom_fallbacks),
        "last_oom_ms": if last_oom == 0 { None } else { Some(last_oom) },
    });
    v["fps"] = serde_json::json!((fps * 100.0).round() / 100.0);
    v["frames"] = serde_json::json!({
        "in": g(&stats.frames_in), "ok": g(&stats.frames_ok), "failed": g(&stats.frames_failed),
        "batches": g(&stats.batches), "inputs_rejected": g(&stats.inputs_rejected),
    });
    v["latency_ms"] = serde_json::json!({
        "decode": stats.percentiles(Stage::Decode), "infer": stats.percentiles(Stage::Infer),
        "post": stats.percentiles(Stage::Post), "publish": stats.percentiles(Stage::Publish),
    });
    v["queues"] = serde_json::json!({
        "intake": g(&stats.q_intake), "decoded": g(&stats.q_decoded), "results": g(&stats.q_results),
    });
    v["mqtt"] = serde_json::json!({
        "queued": g(&stats.mqtt_queued), "spooled": g(&stats.spool_len), "spool_bytes": g(&stats.spool_bytes),
        "spooled_total": g(&stats.spooled_total), "spool_replayed": g(&stats.spool_replayed),
        "published": g(&stats.detections_published), "acked": g(&stats.detections_acked),
        "reconnects": g(&stats.reconnects), "connect_refused": g(&stats.connect_refused),
        "events_dropped": g(&stats.events_dropped),
    });
    v["config"] = serde_json::json!({ "applied": g(&stats.config_applied), "rejected": g(&stats.config_rejected), "model_reloads": g(&stats.model_reloads) });
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_memory() {
        let s = Stats::default();
        for i in 1..=100 {
            s.record(Stage::Infer, i as f64);
        }
        let p = s.percentiles(Stage::Infer);
        assert_eq!((p.p50.round(), p.p90.round(), p.p99.round()), (51.0, 90.0, 99.0));
        let m = CpuMemory.query();
        assert!(m.total.unwrap() > 0 && m.free.unwrap() <= m.total.unwrap());
        assert!(process_rss().unwrap() > 0);
    }
}
