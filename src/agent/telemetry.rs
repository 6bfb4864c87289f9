//! Agent telemetry: monotonic counters, per-stage latency percentiles and histograms, gauges,
//! frames by source (a bounded label set), readiness, process RSS and device memory, snapshotted
//! into the `telemetry` message (and read by `agent::metrics` for `/metrics`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Reading and decoding the picture (file or payload bytes).
    Decode = 0,
    /// One batch's forward pass, candidates and NMS.
    Infer = 1,
    /// Building the detection message.
    Post = 2,
    /// From handing a detection to the MQTT client to its PUBACK.
    Publish = 3,
    /// Letterboxing the decoded picture to the model's input size.
    Preprocess = 4,
    /// From a decoded picture being ready to its batch starting on the inference thread.
    QueueWait = 5,
}

impl Stage {
    pub const ALL: [Stage; 6] = [Stage::Decode, Stage::Preprocess, Stage::QueueWait, Stage::Infer, Stage::Post, Stage::Publish];

    /// The stage's name, as the `stage` label of `/metrics`.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Decode => "decode",
            Stage::Preprocess => "preprocess",
            Stage::QueueWait => "queue_wait",
            Stage::Infer => "infer",
            Stage::Post => "post",
            Stage::Publish => "publish",
        }
    }
}

/// Upper bounds (seconds) of the latency histograms' buckets; `+Inf` follows.
pub const LATENCY_BUCKETS_S: [f64; 16] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// A cumulative latency histogram (lock-free): per-bucket counts, the count and the sum.
#[derive(Default)]
pub struct LatencyHistogram {
    /// Non-cumulative counts per bucket of [`LATENCY_BUCKETS_S`], then the `+Inf` bucket.
    buckets: [AtomicU64; LATENCY_BUCKETS_S.len() + 1],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

/// A reading of a [`LatencyHistogram`].
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramReading {
    /// `(upper bound in seconds, count in this bucket)`, non-cumulative; the last bound is `f64::MAX` (`+Inf`).
    pub buckets: Vec<(f64, u64)>,
    pub count: u64,
    pub sum_s: f64,
}

impl LatencyHistogram {
    pub fn observe(&self, seconds: f64) {
        let s = if seconds.is_finite() { seconds.max(0.0) } else { 0.0 };
        let i = LATENCY_BUCKETS_S.iter().position(|&b| s <= b).unwrap_or(LATENCY_BUCKETS_S.len());
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add((s * 1e9) as u64, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    pub fn read(&self) -> HistogramReading {
        let mut buckets: Vec<(f64, u64)> = LATENCY_BUCKETS_S.iter().zip(&self.buckets).map(|(&b, c)| (b, c.load(Relaxed))).collect();
        buckets.push((f64::MAX, self.buckets[LATENCY_BUCKETS_S.len()].load(Relaxed)));
        // the count is what the buckets hold (read in one pass, so that `+Inf` == `_count`)
        let count = buckets.iter().map(|b| b.1).sum();
        HistogramReading { buckets, count, sum_s: self.sum_ns.load(Relaxed) as f64 / 1e9 }
    }
}

/// Most distinct `source` label values of the frame counters; later sources count as [`OTHER_SOURCE`].
/// Configured sources are bounded by the config, but MQTT source ids come from the messages.
pub const MAX_SOURCE_LABELS: usize = 32;
/// The `source` label of frames past [`MAX_SOURCE_LABELS`].
pub const OTHER_SOURCE: &str = "other";
/// The `source` label of frames rejected before a source id was known (intake full, bad id).
pub const UNKNOWN_SOURCE: &str = "unknown";

/// The result of one picture, as the `result` label of the frame counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FrameResult {
    Ok,
    Failed,
}

impl FrameResult {
    pub fn name(self) -> &'static str {
        match self {
            FrameResult::Ok => "ok",
            FrameResult::Failed => "failed",
        }
    }
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
    pub dead_letters: AtomicU64,
    pub reconnects: AtomicU64,
    pub connect_refused: AtomicU64,
    pub events_dropped: AtomicU64,
    pub inputs_rejected: AtomicU64,
    pub oom_fallbacks: AtomicU64,
    pub last_oom_unix_ms: AtomicU64,
    pub batch_current: AtomicU64,
    pub batch_startup: AtomicU64,
    /// The batch the input shapes of the last minute allow, and the shape that sets it (width,
    /// height; 0: no picture yet).
    pub batch_ceiling: AtomicU64,
    pub ceiling_shape_w: AtomicU64,
    pub ceiling_shape_h: AtomicU64,
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
    /// Messages handed to the MQTT client and not yet acknowledged.
    pub mqtt_inflight: AtomicU64,
    pub mqtt_connected: AtomicBool,
    /// Whether the spool has room for another detection.
    pub spool_accepting: AtomicBool,
    /// A model is loaded (and warmed up on CUDA) and the pipeline runs it; false while a model
    /// (re)loads.
    pub model_ready: AtomicBool,
    /// SIGTERM/SIGINT came: intake stopped, draining.
    pub shutting_down: AtomicBool,
    /// The memory watchdog holds memory high (`agent::watchdog`).
    pub memory_high: AtomicBool,
    latencies: [Mutex<VecDeque<f32>>; 6],
    histograms: [LatencyHistogram; 6],
    /// Pictures by source and result, at most [`MAX_SOURCE_LABELS`] sources (then `other`).
    frames_by_source: Mutex<BTreeMap<(String, FrameResult), u64>>,
    /// The configured camera and video streams (a stream removed from the config leaves).
    streams: Mutex<BTreeMap<String, Arc<StreamStats>>>,
}

/// What a stream is doing now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum StreamState {
    Connecting = 0,
    Running = 1,
    Reconnecting = 2,
    Ended = 3,
}

impl StreamState {
    pub fn name(self) -> &'static str {
        ["connecting", "running", "reconnecting", "ended"][self as usize]
    }
}

/// One stream's counters, shared by its source thread, the pipeline and the publisher.
#[derive(Default)]
pub struct StreamStats {
    pub kind: String,
    pub decoder_requested: String,
    /// The decoder element in use (set once the codec is known).
    pub decoder: Mutex<Option<String>>,
    state: std::sync::atomic::AtomicU8,
    pub frames_in: AtomicU64,
    pub dropped: AtomicU64,
    pub skipped: AtomicU64,
    pub published: AtomicU64,
    pub reconnects: AtomicU64,
    /// Old pipelines whose stop has not returned after its wait (`agent::sources::camera`); shared
    /// with the threads that stop them.
    pub stuck_teardowns: Arc<AtomicU64>,
    capture_to_publish: Mutex<VecDeque<f32>>,
    capture_to_publish_hist: LatencyHistogram,
}

impl StreamStats {
    pub fn new(kind: &str, decoder_requested: &str) -> Self {
        Self { kind: kind.into(), decoder_requested: decoder_requested.into(), ..Self::default() }
    }

    pub fn set_state(&self, s: StreamState) {
        self.state.store(s as u8, Relaxed);
    }

    pub fn state(&self) -> StreamState {
        match self.state.load(Relaxed) {
            1 => StreamState::Running,
            2 => StreamState::Reconnecting,
            3 => StreamState::Ended,
            _ => StreamState::Connecting,
        }
    }

    pub fn decoder(&self) -> Option<String> {
        self.decoder.lock().ok().and_then(|d| d.clone())
    }

    /// One frame's detections published, `ms` after its capture.
    pub fn record_published(&self, ms: f64) {
        self.published.fetch_add(1, Relaxed);
        self.capture_to_publish_hist.observe(ms / 1e3);
        if let Ok(mut q) = self.capture_to_publish.lock() {
            if q.len() == WINDOW {
                q.pop_front();
            }
            q.push_back(ms as f32);
        }
    }

    pub fn capture_to_publish(&self) -> Percentiles {
        percentiles_of(self.capture_to_publish.lock().map(|q| q.iter().copied().collect()).unwrap_or_default())
    }

    pub fn capture_to_publish_histogram(&self) -> HistogramReading {
        self.capture_to_publish_hist.read()
    }
}

fn percentiles_of(mut v: Vec<f32>) -> Percentiles {
    if v.is_empty() {
        return Percentiles::default();
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let p = |q: f32| v[((v.len() - 1) as f32 * q).round() as usize];
    Percentiles { p50: p(0.5), p90: p(0.9), p99: p(0.99) }
}

impl Stats {
    pub fn record(&self, stage: Stage, ms: f64) {
        self.histograms[stage as usize].observe(ms / 1e3);
        self.window(stage, ms);
    }

    /// Records one picture's decoding and letterbox: two histograms, and their sum in the
    /// telemetry message's `decode` percentiles (read, decode and letterbox).
    pub fn record_decode(&self, decode_ms: f64, letterbox_ms: Option<f64>) {
        self.histograms[Stage::Decode as usize].observe(decode_ms / 1e3);
        if let Some(l) = letterbox_ms {
            self.histograms[Stage::Preprocess as usize].observe(l / 1e3);
        }
        self.window(Stage::Decode, decode_ms + letterbox_ms.unwrap_or(0.0));
    }

    fn window(&self, stage: Stage, ms: f64) {
        if let Ok(mut q) = self.latencies[stage as usize].lock() {
            if q.len() == WINDOW {
                q.pop_front();
            }
            q.push_back(ms as f32);
        }
    }

    /// The latency histogram of a stage.
    pub fn histogram(&self, stage: Stage) -> HistogramReading {
        self.histograms[stage as usize].read()
    }

    /// Counts one picture's result (`frames_ok` or `frames_failed`, and by source; `None`: the
    /// source was not known yet).
    pub fn count_frame(&self, source: Option<&str>, result: FrameResult) {
        match result {
            FrameResult::Ok => self.frames_ok.fetch_add(1, Relaxed),
            FrameResult::Failed => self.frames_failed.fetch_add(1, Relaxed),
        };
        let source = source.unwrap_or(UNKNOWN_SOURCE);
        if let Ok(mut m) = self.frames_by_source.lock() {
            if let Some(n) = m.get_mut(&(source.to_string(), result)) {
                *n += 1;
                return;
            }
            let known = m.keys().any(|(s, _)| s == source);
            let label = if known || distinct_sources(&m) < MAX_SOURCE_LABELS { source } else { OTHER_SOURCE };
            *m.entry((label.to_string(), result)).or_insert(0) += 1;
        }
    }

    /// Pictures by `(source label, result)`.
    pub fn frames_by_source(&self) -> Vec<(String, FrameResult, u64)> {
        self.frames_by_source.lock().map(|m| m.iter().map(|((s, r), n)| (s.clone(), *r, *n)).collect()).unwrap_or_default()
    }

    /// Whether the agent can do its work: `Err` says why not (`/readyz`).
    pub fn readiness(&self) -> Result<(), &'static str> {
        if self.shutting_down.load(Relaxed) {
            return Err("shutting down");
        }
        if !self.model_ready.load(Relaxed) {
            return Err("model loading");
        }
        if !self.mqtt_connected.load(Relaxed) && !self.spool_accepting.load(Relaxed) {
            return Err("MQTT broker not connected and the spool is full");
        }
        Ok(())
    }

    pub fn percentiles(&self, stage: Stage) -> Percentiles {
        percentiles_of(self.latencies[stage as usize].lock().map(|q| q.iter().copied().collect()).unwrap_or_default())
    }

    /// Registers a stream (a stream of the same id is replaced: its counters start again).
    pub fn add_stream(&self, id: &str, s: Arc<StreamStats>) {
        if let Ok(mut m) = self.streams.lock() {
            m.insert(id.to_string(), s);
        }
    }

    /// Forgets a stream removed from the config.
    pub fn remove_stream(&self, id: &str) {
        if let Ok(mut m) = self.streams.lock() {
            m.remove(id);
        }
    }

    /// A stream's counters.
    pub fn stream(&self, id: &str) -> Option<Arc<StreamStats>> {
        self.streams.lock().ok().and_then(|m| m.get(id).cloned())
    }

    /// Every stream, by id.
    pub fn streams(&self) -> Vec<(String, Arc<StreamStats>)> {
        self.streams.lock().map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default()
    }

    /// The streams as `telemetry` reports them.
    pub fn stream_telemetry(&self) -> Vec<messages::StreamTelemetry> {
        self.streams()
            .into_iter()
            .map(|(id, s)| messages::StreamTelemetry {
                id,
                kind: s.kind.clone(),
                decoder: s.decoder(),
                state: s.state().name().to_string(),
                frames_in: s.frames_in.load(Relaxed),
                dropped: s.dropped.load(Relaxed),
                skipped: s.skipped.load(Relaxed),
                published: s.published.load(Relaxed),
                reconnects: s.reconnects.load(Relaxed),
                stuck_teardowns: s.stuck_teardowns.load(Relaxed),
                capture_to_publish_ms: s.capture_to_publish(),
            })
            .collect()
    }
}

/// Distinct `source` labels in the frame counters, `other` not counted.
fn distinct_sources(m: &BTreeMap<(String, FrameResult), u64>) -> usize {
    let mut n = 0;
    let mut last: Option<&str> = None;
    // keys are sorted by source first: each source's entries are adjacent
    for (s, _) in m.keys() {
        if last != Some(s.as_str()) && s != OTHER_SOURCE {
            n += 1;
        }
        last = Some(s.as_str());
    }
    n
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
        device_memory: DeviceMemoryFigures {
            total: mem.total,
            free: mem.free,
            used: mem.used,
            limit: mem.limit.clone(),
            high: stats.memory_high.load(Relaxed),
        },
        process_memory: ProcessMemory {
            used: mem.process_used,
            reserved: mem.process_reserved,
            high_water: mem.process_high_water,
            rss: process_rss(),
        },
        batch: BatchTelemetry {
            current: g(&stats.batch_current),
            startup: g(&stats.batch_startup),
            ceiling: g(&stats.batch_ceiling),
            shape: match (g(&stats.ceiling_shape_w), g(&stats.ceiling_shape_h)) {
                (0, _) | (_, 0) => None,
                (w, h) => Some([w as u32, h as u32]),
            },
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
            dead_letters: g(&stats.dead_letters),
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
        streams: stats.stream_telemetry(),
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

    #[test]
    fn latency_histograms_bucket_count_and_sum() {
        let s = Stats::default();
        for ms in [0.2, 0.7, 3.0, 3.0, 120_000.0] {
            s.record(Stage::QueueWait, ms);
        }
        let h = s.histogram(Stage::QueueWait);
        assert_eq!(h.count, 5);
        assert!((h.sum_s - 120.0069).abs() < 1e-6, "{}", h.sum_s);
        let at = |le: f64| h.buckets.iter().find(|b| b.0 == le).unwrap().1;
        assert_eq!((at(0.0005), at(0.001), at(0.005), at(60.0), at(f64::MAX)), (1, 1, 2, 0, 1));
        assert_eq!(h.buckets.len(), LATENCY_BUCKETS_S.len() + 1);
        assert_eq!(s.histogram(Stage::Infer).count, 0);
        // the percentile window of the telemetry message sees the same samples
        assert_eq!(s.percentiles(Stage::QueueWait).p50, 3.0);
        // decoding and letterbox: two histograms, their sum in the message's `decode`
        s.record_decode(2.0, Some(1.0));
        s.record_decode(2.0, Some(1.0));
        s.record_decode(4.0, None);
        assert_eq!((s.histogram(Stage::Decode).count, s.histogram(Stage::Preprocess).count), (3, 2));
        assert!((s.histogram(Stage::Decode).sum_s - 0.008).abs() < 1e-9);
        assert_eq!(s.percentiles(Stage::Decode).p50, 3.0);
    }

    #[test]
    fn frames_by_source_hold_a_bounded_label_set() {
        let s = Stats::default();
        s.count_frame(Some("cam"), FrameResult::Ok);
        s.count_frame(Some("cam"), FrameResult::Ok);
        s.count_frame(Some("cam"), FrameResult::Failed);
        s.count_frame(None, FrameResult::Failed);
        for i in 0..100 {
            s.count_frame(Some(&format!("mqtt-{i}")), FrameResult::Ok);
        }
        // a source seen before the cap keeps its label
        s.count_frame(Some("cam"), FrameResult::Ok);
        let v = s.frames_by_source();
        let get = |src: &str, r: FrameResult| v.iter().find(|(s, x, _)| s == src && *x == r).map(|t| t.2);
        assert_eq!(get("cam", FrameResult::Ok), Some(3));
        assert_eq!(get("cam", FrameResult::Failed), Some(1));
        assert_eq!(get(UNKNOWN_SOURCE, FrameResult::Failed), Some(1));
        // cam, unknown and 30 MQTT ids: 32 labels, the other 70 pictures under `other`
        assert_eq!(get("mqtt-29", FrameResult::Ok), Some(1));
        assert_eq!(get("mqtt-30", FrameResult::Ok), None);
        assert_eq!(get(OTHER_SOURCE, FrameResult::Ok), Some(70));
        let labels: std::collections::BTreeSet<&str> = v.iter().map(|t| t.0.as_str()).collect();
        assert_eq!(labels.len(), MAX_SOURCE_LABELS + 1);
        assert_eq!((s.frames_ok.load(Relaxed), s.frames_failed.load(Relaxed)), (103, 2));
    }

    #[test]
    fn readiness_needs_the_model_and_the_broker_or_the_spool() {
        let s = Stats::default();
        assert_eq!(s.readiness(), Err("model loading"));
        s.model_ready.store(true, Relaxed);
        assert!(s.readiness().unwrap_err().contains("spool is full"));
        s.spool_accepting.store(true, Relaxed);
        assert_eq!(s.readiness(), Ok(()));
        s.spool_accepting.store(false, Relaxed);
        s.mqtt_connected.store(true, Relaxed);
        assert_eq!(s.readiness(), Ok(()));
        s.model_ready.store(false, Relaxed);
        assert_eq!(s.readiness(), Err("model loading"));
        s.model_ready.store(true, Relaxed);
        s.shutting_down.store(true, Relaxed);
        assert_eq!(s.readiness(), Err("shutting down"));
    }

    /// Under a cgroup limit every query re-reads the limit and the usage: telemetry follows the
    /// headroom as the cgroup fills, and names the limit that binds.
    #[test]
    fn telemetry_rereads_the_cgroup_headroom() {
        let dir = tempfile::tempdir().unwrap();
        let g = 1u64 << 30;
        let svc = crate::backend::hostmem::fixtures::capped_service(dir.path());
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
