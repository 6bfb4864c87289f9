//! The MQTT wire format: one typed message for every topic the agent publishes under
//! `{prefix}/{device_id}/`. The agent serialises these types, the demo's subscriber and the tests
//! parse them, and `docs/messages.schema.json` is generated from them ([`json_schema`]).
//!
//! | topic leaf | type | QoS | retained |
//! | --- | --- | --- | --- |
//! | `detections/{source}` | [`Detections`] | `mqtt.qos` | no |
//! | `telemetry` | [`Telemetry`] | 1 | no |
//! | `events` | [`Event`] | 1 | no |
//! | `info` | [`Info`] | 1 | yes |
//! | `status` | [`Status`] (plain text) | 1 | yes (also the last will) |
//!
//! Timestamps (`ts`, `started`) are RFC 3339 UTC with milliseconds, e.g.
//! `2026-12-01T10:00:00.123Z`. Byte counts are bytes; durations are in the unit their name ends
//! with (`_ms`, `_s`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::vision::postprocess::Detection;

/// The `v` field of every JSON message: the version of this wire format.
pub const VERSION: u32 = 1;

// ---------------------------------------------------------------------------------------------
// detections/{source}

/// The detections of one picture (topic `{prefix}/{device_id}/detections/{source}`, QoS
/// `mqtt.qos`, not retained). Consumers de-duplicate QoS 1 redeliveries by `(boot_id, seq)`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Detections {
    /// Wire format version: 1 (`messages::VERSION`).
    pub v: u32,
    /// The agent's `mqtt.device_id`.
    pub device_id: String,
    /// A fresh id at every start of the agent; `seq` restarts with it.
    pub boot_id: String,
    /// 1, 2, 3... per boot, over all sources, in the order pictures were finished.
    pub seq: u64,
    /// When the message was built (RFC 3339 UTC, milliseconds).
    pub ts: String,
    /// The source id (`[[sources]] id`), also the last topic level.
    pub source: String,
    /// Which picture, and its size.
    pub image: FrameImage,
    /// The model that ran: `variant:sha256[..12]` (the `model.label` of [`Info`]).
    pub model: String,
    /// Pictures in the batch this one was inferred in.
    pub batch_size: usize,
    /// Time spent on this picture, per stage.
    pub latency_ms: FrameLatency,
    /// The objects found, highest confidence first.
    pub detections: Vec<Detection>,
}

/// The picture of a detection message: a hot-folder file (`path`) or an MQTT image (`id`), with
/// its size in pixels.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(untagged, deny_unknown_fields)]
pub enum FrameImage {
    /// A file of a folder source.
    Path {
        /// The file's path when it was taken (it then moves to `done/`).
        path: String,
        /// Width in pixels.
        w: u32,
        /// Height in pixels.
        h: u32,
    },
    /// A message of an MQTT source.
    Id {
        /// The topic level named by `id_from_topic_level` (or the whole topic).
        id: String,
        /// Width in pixels.
        w: u32,
        /// Height in pixels.
        h: u32,
    },
    /// A frame of a camera or video stream (`type = "rtsp" | "video" | "v4l2" | "uri"`).
    Stream {
        /// The stream's source id.
        stream: String,
        /// The frame's index in the stream: 0, 1, 2... for every frame the decoder delivered
        /// since the source started (across reconnects); a gap is a frame dropped or skipped.
        frame: u64,
        /// The frame's presentation timestamp in the stream (ms; null: the stream has none).
        pts_ms: Option<f64>,
        /// When the decoded frame reached the agent (RFC 3339 UTC, milliseconds).
        capture_ts: String,
        /// Width in pixels.
        w: u32,
        /// Height in pixels.
        h: u32,
    },
}

impl FrameImage {
    /// The path, id or stream.
    pub fn name(&self) -> &str {
        match self {
            Self::Path { path, .. } => path,
            Self::Id { id, .. } => id,
            Self::Stream { stream, .. } => stream,
        }
    }

    /// Width and height in pixels.
    pub fn size(&self) -> (u32, u32) {
        match self {
            Self::Path { w, h, .. } | Self::Id { w, h, .. } | Self::Stream { w, h, .. } => (*w, *h),
        }
    }
}

/// A picture named in an event: a hot-folder file (`path`) or an MQTT image (`id`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(untagged, deny_unknown_fields)]
pub enum ImageName {
    /// A file of a folder source.
    Path {
        /// The file's path when it was taken.
        path: String,
    },
    /// A message of an MQTT source.
    Id {
        /// The topic level named by `id_from_topic_level` (or the whole topic).
        id: String,
    },
    /// A frame of a stream.
    Stream {
        /// The stream's source id.
        stream: String,
        /// The frame's index in the stream.
        frame: u64,
    },
}

impl ImageName {
    /// The path, id or stream.
    pub fn name(&self) -> &str {
        match self {
            Self::Path { path } => path,
            Self::Id { id } => id,
            Self::Stream { stream, .. } => stream,
        }
    }
}

/// Per-picture latency of one detection message, in milliseconds (rounded to microseconds).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FrameLatency {
    /// Reading and decoding the picture, and letterboxing it (ms).
    pub decode: f64,
    /// The forward pass and NMS of the whole batch this picture was in (ms).
    pub infer: f64,
    /// Building this message (ms).
    pub post: f64,
    /// Stream frames only: from the decoded frame reaching the agent (`capture_ts`) to this
    /// message being built (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture_to_publish: Option<f64>,
}

// ---------------------------------------------------------------------------------------------
// telemetry

/// Counters, gauges and latency percentiles (topic `{prefix}/{device_id}/telemetry`, QoS 1, not
/// retained), every `telemetry.interval_s` while connected. Counters count since the start of
/// this boot and never go down.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Telemetry {
    /// Wire format version: 1 (`messages::VERSION`).
    pub v: u32,
    /// The agent's `mqtt.device_id`.
    pub device_id: String,
    /// A fresh id at every start of the agent.
    pub boot_id: String,
    /// When the snapshot was taken (RFC 3339 UTC, milliseconds).
    pub ts: String,
    /// Seconds since the publisher started (rounded to milliseconds).
    pub uptime_s: f64,
    /// The device's memory (null where the device cannot tell).
    pub device_memory: DeviceMemoryFigures,
    /// This process's memory on the device (null where the device cannot tell).
    pub process_memory: ProcessMemory,
    /// The batch size and the memory plan behind it.
    pub batch: BatchTelemetry,
    /// Pictures finished per second since the previous snapshot (rounded to 0.01).
    pub fps: f64,
    /// Picture counters.
    pub frames: FrameCounters,
    /// Latency percentiles over the last 2048 samples of each stage (ms).
    pub latency_ms: StageLatency,
    /// Queue lengths now.
    pub queues: Queues,
    /// Delivery counters and gauges.
    pub mqtt: MqttCounters,
    /// Config file updates.
    pub config: ConfigCounters,
    /// Camera and video streams, by source id (absent when there are none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub streams: Vec<StreamTelemetry>,
}

/// One stream's figures in `telemetry`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamTelemetry {
    /// The source id.
    pub id: String,
    /// `rtsp`, `video`, `v4l2` or `uri`.
    pub kind: String,
    /// The decoder element in use (e.g. `avdec_h264`, `nvh264dec`); null before the first
    /// connection has found the codec.
    pub decoder: Option<String>,
    /// `connecting`, `running`, `reconnecting` or `ended` (a video file at its end).
    pub state: String,
    /// Frames the decoder delivered.
    pub frames_in: u64,
    /// Frames replaced in the waiting queue by a newer one before inference took them.
    pub dropped: u64,
    /// Frames skipped for `max_fps`.
    pub skipped: u64,
    /// Frames whose detections were published.
    pub published: u64,
    /// Connections lost (error, end of a live stream, or no frame for `stall_timeout_ms`).
    pub reconnects: u64,
    /// Old pipelines of this stream that did not stop within 3 s of being told to and have not
    /// stopped since (GStreamer's `rtspsrc` can hang in its own teardown); each holds its threads,
    /// sockets and buffers until it does. A count that stays above 0 is memory and file
    /// descriptors held.
    pub stuck_teardowns: u64,
    /// Capture to publish over the last 2048 frames (ms).
    pub capture_to_publish_ms: Percentiles,
}

/// One stream as `info` names it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamInfo {
    /// The source id.
    pub id: String,
    /// `rtsp`, `video`, `v4l2` or `uri`.
    pub kind: String,
    /// `decoder` as configured: `auto`, `cpu`, `nvdec` or `nvv4l2`.
    pub decoder_requested: String,
    /// The decoder element in use (null until the first connection found the codec).
    pub decoder: Option<String>,
}

/// Memory of the device the model runs on, in bytes.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceMemoryFigures {
    /// Total device memory (bytes; on the CPU and an integrated GPU: host memory, or the tightest
    /// cgroup limit above the agent where that is lower).
    pub total: Option<u64>,
    /// Free device memory, read now (bytes; on the CPU and an integrated GPU: MemAvailable, or
    /// the least any cgroup limit above the agent still allows where that is lower).
    pub free: Option<u64>,
    /// `total - free` (bytes).
    pub used: Option<u64>,
    /// The limit that sets `free` now, as in `PlanBudget.limit` (null where the device cannot tell).
    pub limit: Option<String>,
    /// Whether the memory watchdog holds memory high now: from its `memory_high` event to the
    /// next `memory_ok`.
    #[serde(default)]
    pub high: bool,
}

/// Memory of this process on the device, in bytes.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessMemory {
    /// Bytes in use by tensors (CUDA pool) or resident (CPU).
    pub used: Option<u64>,
    /// Bytes the memory pool holds from the device, used or cached (CUDA); resident (CPU).
    pub reserved: Option<u64>,
    /// Highest `used` since the plan finished (bytes).
    pub high_water: Option<u64>,
    /// Resident set size of the process (bytes, `/proc/self/status` VmRSS).
    pub rss: Option<u64>,
}

/// The batch size now, at startup, and the planner's figures.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchTelemetry {
    /// The working batch size (lower than `startup` after an out-of-memory fallback).
    pub current: u64,
    /// The batch size the agent started with (fixed or planned).
    pub startup: u64,
    /// The largest batch the input shapes of the last minute allow: the plan scaled by their
    /// pixels (`shape_planned`); `startup` before the first picture, or with a fixed batch.
    pub ceiling: u64,
    /// The network input shape (width, height) that sets `ceiling` (null before the first
    /// picture).
    pub shape: Option<[u32; 2]>,
    /// Out-of-memory errors that split a batch or failed a frame.
    pub oom_fallbacks: u64,
    /// Unix time of the last out-of-memory error (ms; null: none yet).
    pub last_oom_ms: Option<u64>,
    /// The planner's predicted peak at the startup batch (bytes; null: not planned).
    pub predicted_peak: Option<u64>,
    /// The planner's measured peak at the startup batch (bytes; null: not planned).
    pub verified_peak: Option<u64>,
    /// The planner's memory budget (bytes; null: not planned).
    pub budget: Option<u64>,
}

/// Picture counters since the start of this boot.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FrameCounters {
    /// Pictures taken in by the sources.
    #[serde(rename = "in")]
    pub frames_in: u64,
    /// Pictures whose detections were handed to the publisher.
    pub ok: u64,
    /// Pictures that failed (intake, decode or inference).
    pub failed: u64,
    /// Batches run.
    pub batches: u64,
    /// Inputs rejected (each also an `input_rejected` event).
    pub inputs_rejected: u64,
}

/// Latency percentiles per pipeline stage, in milliseconds.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StageLatency {
    /// Read, decode and letterbox one picture.
    pub decode: Percentiles,
    /// One batch's forward pass and NMS.
    pub infer: Percentiles,
    /// Building one detection message.
    pub post: Percentiles,
    /// From publishing a detection to its PUBACK.
    pub publish: Percentiles,
}

/// p50/p90/p99 in milliseconds (0 before the first sample).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Percentiles {
    /// Median (ms).
    pub p50: f32,
    /// 90th percentile (ms).
    pub p90: f32,
    /// 99th percentile (ms).
    pub p99: f32,
}

/// Lengths of the pipeline's queues (items).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Queues {
    /// Pictures taken in, waiting for decoding.
    pub intake: u64,
    /// Decoded pictures waiting for a batch.
    pub decoded: u64,
    /// Results waiting for the publisher.
    pub results: u64,
}

/// Delivery counters and gauges of the publisher.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MqttCounters {
    /// Messages in flight or waiting to be re-sent (gauge).
    pub queued: u64,
    /// Detection messages in the spool now (gauge).
    pub spooled: u64,
    /// Bytes in the spool now (gauge).
    pub spool_bytes: u64,
    /// Detection messages ever written to the spool.
    pub spooled_total: u64,
    /// Spooled messages delivered after a reconnect.
    pub spool_replayed: u64,
    /// Detection messages the broker refused, kept in the spool's dead-letter folder.
    pub dead_letters: u64,
    /// Detection messages handed to the MQTT client.
    pub published: u64,
    /// Detection messages acknowledged by the broker.
    pub acked: u64,
    /// Connections after the first.
    pub reconnects: u64,
    /// Connections the broker refused.
    pub connect_refused: u64,
    /// Events lost to a full queue (they were still logged).
    pub events_dropped: u64,
}

/// Config file updates since the start of this boot.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfigCounters {
    /// Valid edits applied (`config_applied` events).
    pub applied: u64,
    /// Invalid edits rejected (`config_rejected` events).
    pub rejected: u64,
    /// Model swaps (`model_reloaded` events).
    pub model_reloads: u64,
}

// ---------------------------------------------------------------------------------------------
// status

/// The agent's presence (topic `{prefix}/{device_id}/status`, QoS 1, retained). The payload is
/// the plain text `online` or `offline`, not JSON: `online` after every connect, `offline` at a
/// clean shutdown and as the last will the broker publishes when the connection is lost.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Connected and running.
    Online,
    /// Stopped, or the connection was lost (last will).
    Offline,
}

impl Status {
    /// The payload bytes: `online` or `offline`.
    pub fn as_payload(self) -> &'static str {
        match self {
            Self::Online => "online",
            Self::Offline => "offline",
        }
    }

    /// Reads a payload; None when it is neither `online` nor `offline`.
    pub fn parse(payload: &[u8]) -> Option<Self> {
        match payload {
            b"online" => Some(Self::Online),
            b"offline" => Some(Self::Offline),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// info

/// What runs on this device (topic `{prefix}/{device_id}/info`, QoS 1, retained): published
/// after every connect and again after `model_reloaded`, `config_applied` and `batch_change`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Info {
    /// Wire format version: 1 (`messages::VERSION`).
    pub v: u32,
    /// The agent's `mqtt.device_id`.
    pub device_id: String,
    /// A fresh id at every start of the agent.
    pub boot_id: String,
    /// The agent's version (Cargo package version).
    pub version: String,
    /// When this boot's agent started (RFC 3339 UTC, milliseconds).
    pub started: String,
    /// The model running now.
    pub model: ModelInfo,
    /// The device the model runs on (e.g. `cpu`, `cuda:0 (NVIDIA H200)`).
    pub device: String,
    /// The model's floating-point type (`f32`, `f16`, `bf16`).
    pub dtype: String,
    /// The network's input size (pixels, square).
    pub imgsz: usize,
    /// The batch size and why.
    pub batch_plan: BatchPlan,
    /// Warm-up timings (CUDA only; null on the CPU).
    pub startup: Option<StartupTimes>,
    /// SHA-256 of the running config file's text (hex).
    pub config_sha256: String,
    /// The source ids, in config order.
    pub sources: Vec<String>,
    /// The MQTT protocol version in use.
    pub protocol: MqttProtocol,
    /// The camera and video streams and their decoders (absent when there are none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub streams: Vec<StreamInfo>,
}

/// The model of an [`Info`] message.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelInfo {
    /// The YOLOv9 variant (e.g. `yolov9t`).
    pub variant: String,
    /// Class names, by class id.
    pub classes: Vec<String>,
    /// Number of classes.
    pub nc: usize,
    /// SHA-256 of the model file (hex).
    pub sha256: String,
    /// The model file's path.
    pub path: String,
    /// `variant:sha256[..12]`, the `model` field of [`Detections`].
    pub label: String,
}

/// The batch size the agent started with, the current one, and the decision behind it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchPlan {
    /// The batch size the agent started with.
    pub startup: u64,
    /// The working batch size now.
    pub current: u64,
    /// `device.max_batch`.
    pub max_batch: usize,
    /// Why the startup batch (fixed by config, planned, or the planner's failure).
    pub reason: String,
    /// `device.memory_fraction`: share of min(free, memory_limit) the planner may use.
    pub memory_fraction: f64,
    /// `device.memory_limit` (bytes; null: none).
    pub memory_limit: Option<u64>,
    /// The planner's decision (null: the batch was fixed, or nothing fitted).
    pub plan: Option<PlanReport>,
}

/// The planner's decision and how it got there (see `src/planner/`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlanReport {
    /// The memory budget planned against.
    pub budget: PlanBudget,
    /// The largest batch the planner considered.
    pub max_batch: usize,
    /// Peak reserved bytes as a line over the batch size.
    pub fit: MemoryFit,
    /// The same line fitted to the peaks in use (tensors alone), where the device tells them.
    pub used_fit: Option<MemoryFit>,
    /// The chosen batch.
    pub batch: usize,
    /// Predicted peak at the chosen batch (bytes).
    pub predicted_peak: u64,
    /// Measured peak at the chosen batch (bytes).
    pub verified_peak: u64,
    /// Every forward pass the planner ran, in order.
    pub steps: Vec<PlanStep>,
    /// The decision in words.
    pub reasons: Vec<String>,
}

/// The planner's memory budget.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlanBudget {
    /// Free device memory with the model loaded (bytes).
    pub free: u64,
    /// Total device memory (bytes).
    pub total: u64,
    /// `device.memory_limit` (bytes; null: none).
    pub memory_limit: Option<u64>,
    /// `device.memory_fraction`.
    pub memory_fraction: f64,
    /// Where the free figure came from.
    pub source: MemorySourceKind,
    /// The limit that set min(free, memory_limit): `cuda:cuMemGetInfo free` (a discrete GPU),
    /// `meminfo:MemAvailable` (host memory, no tighter cgroup limit), `cgroup:<path> <file>` (the
    /// cgroup limit with the least headroom, e.g. `cgroup:/system.slice/yolo-edge.service
    /// memory.max`), or `config:memory_limit`.
    pub limit: String,
    /// min(free, memory_limit) x memory_fraction (bytes).
    pub bytes: u64,
}

/// Where a free-memory figure came from.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MemorySourceKind {
    /// `cuMemGetInfo` of a discrete GPU.
    CudaDriver,
    /// An integrated GPU sharing host memory: `/proc/meminfo` MemAvailable, capped by the cgroup
    /// limits above the agent.
    IntegratedMeminfo,
    /// The CPU device: MemAvailable, capped by the cgroup limits above the agent.
    HostMeminfo,
}

/// Peak bytes as `fixed + per_image x batch`, and the points it was fitted to.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryFit {
    /// Bytes at batch 0.
    pub fixed: f64,
    /// Bytes per picture.
    pub per_image: f64,
    /// Measured `[batch, peak bytes]` pairs.
    pub points: Vec<(usize, u64)>,
}

/// One forward pass of the planner.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlanStep {
    /// Its batch size.
    pub batch: usize,
    /// `probe` (to fit the line), `verify` (a candidate batch) or `rung` (a batch of the ladder
    /// of CUDA graphs below the chosen one, measured after the choice: partial batches run
    /// padded up to it).
    pub purpose: String,
    /// The fit's prediction (bytes; null for probes; for a rung, the prediction before it was
    /// measured).
    pub predicted: Option<u64>,
    /// The measured peak (bytes; null when the pass failed).
    pub measured: Option<u64>,
    /// `ok`, or why it did not fit.
    pub outcome: String,
}

/// Timings of the first forward passes after loading (milliseconds).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartupTimes {
    /// Loading the model file (ms).
    pub load_ms: f64,
    /// First forward at batch 1: kernel JIT or cache load, library handles, pool growth (ms).
    pub first_forward_ms: f64,
    /// Second forward at batch 1: the warm steady state (ms).
    pub second_forward_ms: f64,
    /// The compute (JIT) cache directory, when one is configured.
    pub compute_cache: Option<String>,
}

/// MQTT protocol version.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MqttProtocol {
    /// MQTT 3.1.1.
    V311,
    /// MQTT 5.
    V5,
}

impl From<crate::agent::config::Protocol> for MqttProtocol {
    fn from(p: crate::agent::config::Protocol) -> Self {
        match p {
            crate::agent::config::Protocol::V311 => Self::V311,
            crate::agent::config::Protocol::V5 => Self::V5,
        }
    }
}

impl From<crate::backend::devmem::MemorySource> for MemorySourceKind {
    fn from(s: crate::backend::devmem::MemorySource) -> Self {
        match s {
            crate::backend::devmem::MemorySource::CudaDriver => Self::CudaDriver,
            crate::backend::devmem::MemorySource::IntegratedMeminfo => Self::IntegratedMeminfo,
            crate::backend::devmem::MemorySource::HostMeminfo => Self::HostMeminfo,
        }
    }
}

impl From<&crate::planner::MemoryFit> for MemoryFit {
    fn from(f: &crate::planner::MemoryFit) -> Self {
        Self { fixed: f.fixed, per_image: f.per_image, points: f.points.clone() }
    }
}

impl From<&crate::planner::Plan> for PlanReport {
    fn from(p: &crate::planner::Plan) -> Self {
        let b = &p.budget;
        Self {
            budget: PlanBudget {
                free: b.free,
                total: b.total,
                memory_limit: b.memory_limit,
                memory_fraction: b.memory_fraction,
                source: b.source.into(),
                limit: b.limit.clone(),
                bytes: b.bytes,
            },
            max_batch: p.max_batch,
            fit: (&p.fit).into(),
            used_fit: p.used_fit.as_ref().map(MemoryFit::from),
            batch: p.batch,
            predicted_peak: p.predicted_peak,
            verified_peak: p.verified_peak,
            steps: p
                .steps
                .iter()
                .map(|s| PlanStep {
                    batch: s.batch,
                    purpose: s.purpose.to_string(),
                    predicted: s.predicted,
                    measured: s.measured,
                    outcome: s.outcome.clone(),
                })
                .collect(),
            reasons: p.reasons.clone(),
        }
    }
}

impl From<&crate::detector::warmup::StartupTimes> for StartupTimes {
    fn from(t: &crate::detector::warmup::StartupTimes) -> Self {
        Self {
            load_ms: t.load_ms,
            first_forward_ms: t.first_forward_ms,
            second_forward_ms: t.second_forward_ms,
            compute_cache: t.compute_cache.clone(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// events

/// Something the agent did or noticed (topic `{prefix}/{device_id}/events`, QoS 1, not
/// retained): the envelope, with the body's fields (and its `type`) beside it in one object.
/// Events are queued while the broker is away (the oldest beyond 1000 are dropped and counted).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
pub struct Event {
    /// Wire format version: 1 (`messages::VERSION`).
    pub v: u32,
    /// The agent's `mqtt.device_id`.
    pub device_id: String,
    /// A fresh id at every start of the agent.
    pub boot_id: String,
    /// When the publisher took the event (RFC 3339 UTC, milliseconds).
    pub ts: String,
    /// `type` and the fields of this kind of event.
    #[serde(flatten)]
    pub body: EventBody,
}

/// The kinds of event, by their `type`, each with its fields.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum EventBody {
    /// Inference ran out of device memory: the batch is split in two and retried (the working
    /// batch drops to the larger half), or at batch 1 the frame fails.
    OomFallback {
        /// Size of the batch that failed.
        batch: usize,
        /// `frame_failed` when a single picture did not fit (then the split fields are absent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        action: Option<OomAction>,
        /// The two halves retried, larger first.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_as: Option<[usize; 2]>,
        /// Working batch size before the error.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        batch_before: Option<usize>,
        /// Working batch size after it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        batch_after: Option<usize>,
        /// The device's error (first line).
        error: String,
    },
    /// The working batch size changed.
    BatchChange {
        /// Batch size before.
        from: usize,
        /// Batch size now.
        to: usize,
        /// The batch size the agent started with (the ceiling when probing up).
        startup: usize,
        /// Why.
        reason: BatchChangeReason,
    },
    /// A picture shape not seen before reached the model, and the batch it runs at: the startup
    /// plan (made at the `imgsz` square) scaled by the shape's pixels; above the startup batch
    /// only once a measured pass at that batch and shape fits the budget (else halfway to the
    /// startup batch, measured the same way, else the startup batch). The working batch follows
    /// the smallest over the shapes of the last minute (`batch_change` with reason `shape`).
    /// Once per shape and model (a reloaded model measures again); only with `batch = "auto"`.
    ShapePlanned {
        /// Network input width and height of the shape.
        width: u32,
        height: u32,
        /// Its pixels over the planned square's.
        area_ratio: f64,
        /// The batch the plan scaled by pixels gives (at most `max_batch`).
        estimated: usize,
        /// The plan's predicted peak for that batch (bytes).
        predicted_peak: u64,
        /// The batch this shape runs at.
        batch: usize,
        /// The measured peak at `batch` (bytes), where it was measured (above the startup batch, on a
        /// discrete GPU).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        verified_peak: Option<u64>,
        /// The plan's budget (bytes).
        budget: u64,
        /// The batch planned at the square.
        startup: usize,
    },
    /// A valid config edit was applied live.
    ConfigApplied {
        /// The config file.
        path: String,
        /// SHA-256 of the applied config text (hex).
        sha256: String,
        /// Sections that changed and took effect (`model.thresholds`, `model.path`, `mqtt`,
        /// `telemetry`, `oom`, `shutdown`).
        changed: Vec<String>,
        /// Sections that changed but take effect only after a restart (`device`, `sources`...).
        restart_required: Vec<String>,
    },
    /// A config edit was rejected; the running config stays.
    ConfigRejected {
        /// The config file.
        path: String,
        /// Why, with file, line and key where the parser tells them.
        error: String,
        /// SHA-256 of the config that keeps running (hex).
        running_sha256: String,
    },
    /// A new model (`model.path` changed) replaced the running one between batches.
    ModelReloaded {
        /// Label of the previous model (`variant:sha256[..12]`).
        from: String,
        /// Label of the new model.
        to: String,
        /// The new model's file.
        path: String,
        /// SHA-256 of the new model file (hex).
        sha256: String,
    },
    /// A picture was not processed (also counted in telemetry's `frames.inputs_rejected`).
    InputRejected {
        /// The source id (absent when the intake was full or the message's source id was refused:
        /// then `topic` names the message).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source: Option<String>,
        /// The picture (absent when the intake was full).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        image: Option<ImageName>,
        /// The MQTT topic of an image the full intake turned away.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        topic: Option<String>,
        /// Where it failed.
        stage: InputStage,
        /// Why.
        reason: String,
    },
    /// A folder source cannot be read (or its done/failed folders cannot be made); a stream
    /// is lost (an error, the end of a live stream, or no frame for `stall_timeout_ms`) and
    /// reconnects with backoff. Once per loss.
    SourceError {
        /// The source id.
        source: String,
        /// The folder, or the stream's location (URL without credentials, file, device).
        path: String,
        /// The error.
        error: String,
    },
    /// A folder source that had failed can be read again; a lost stream delivers frames again.
    SourceRecovered {
        /// The source id.
        source: String,
        /// The folder, or the stream's location.
        path: String,
    },
    /// A stream's requested decoder element is not installed: the software decoder runs instead.
    DecoderFallback {
        /// The source id.
        source: String,
        /// The stream's codec (`h264`, `h265`).
        codec: String,
        /// `decoder` as configured.
        requested: String,
        /// The elements looked for and not found.
        missing: Vec<String>,
        /// The element used.
        using: String,
    },
    /// A video file (or a non-live URI) reached its end; the stream stops.
    SourceEnded {
        /// The source id.
        source: String,
        /// The file or URI.
        path: String,
        /// Frames the decoder delivered.
        frames: u64,
    },
    /// The connection to the broker was lost; detections go to the spool until it is back.
    /// Published once the agent is connected again (its `ts` is the moment of the loss).
    MqttDisconnected {
        /// Why the connection ended, as the client saw it.
        reason: String,
    },
    /// Connected again after a loss.
    MqttReconnected {
        /// Seconds from the loss to this connection.
        down_s: f64,
        /// Why the connection had ended.
        reason: String,
        /// Detection messages written to the spool meanwhile (they are sent now, oldest first).
        spooled: u64,
        /// Connection attempts it took.
        attempts: u32,
    },
    /// The broker refused the connection (the agent retries with backoff).
    MqttRefused {
        /// The broker's reason.
        reason: String,
        /// Whether it was an authentication failure (bad username or password, not authorised).
        auth: bool,
    },
    /// The broker refused a detection: an MQTT 5 acknowledgement with an error, or a broker
    /// that dropped the connection each time the message was sent. It is kept in the spool's
    /// dead-letter folder and never sent again.
    PublishRefused {
        /// The detection's topic.
        topic: String,
        /// The broker's reason.
        reason: String,
        /// Where the message was kept (`<spool>/dead/<id>.msg`, the reason beside it in
        /// `<id>.reason`); null when it could not be written.
        dead_letter: Option<String>,
    },
    /// A spool entry could not be read; it is skipped.
    SpoolError {
        /// The error.
        error: String,
    },
    /// After `oom.release_idle_s` without work, the memory pool gave its cached memory back.
    MemoryReleased {
        /// The idle time that triggered it (s).
        idle_s: f64,
        /// Pool reservation before (bytes; null: unknown).
        reserved_before: Option<u64>,
        /// Pool reservation after (bytes; null: unknown).
        reserved_after: Option<u64>,
    },
    /// The memory pool holds more than the planner's budget.
    MemoryOverBudget(MemoryBudget),
    /// The memory pool is back within the planner's budget.
    MemoryWithinBudget(MemoryBudget),
    /// The memory watchdog read memory at or above `watchdog.memory_high` of its limit.
    MemoryHigh(MemoryWatch),
    /// After a `memory_high`, the memory watchdog read memory at or below `watchdog.memory_ok`.
    MemoryOk(MemoryWatch),
}

impl EventBody {
    /// The `type` of this event.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::OomFallback { .. } => "oom_fallback",
            Self::BatchChange { .. } => "batch_change",
            Self::ShapePlanned { .. } => "shape_planned",
            Self::ConfigApplied { .. } => "config_applied",
            Self::ConfigRejected { .. } => "config_rejected",
            Self::ModelReloaded { .. } => "model_reloaded",
            Self::InputRejected { .. } => "input_rejected",
            Self::SourceError { .. } => "source_error",
            Self::SourceRecovered { .. } => "source_recovered",
            Self::DecoderFallback { .. } => "decoder_fallback",
            Self::SourceEnded { .. } => "source_ended",
            Self::MqttDisconnected { .. } => "mqtt_disconnected",
            Self::MqttReconnected { .. } => "mqtt_reconnected",
            Self::MqttRefused { .. } => "mqtt_refused",
            Self::PublishRefused { .. } => "publish_refused",
            Self::SpoolError { .. } => "spool_error",
            Self::MemoryReleased { .. } => "memory_released",
            Self::MemoryOverBudget(_) => "memory_over_budget",
            Self::MemoryWithinBudget(_) => "memory_within_budget",
            Self::MemoryHigh(_) => "memory_high",
            Self::MemoryOk(_) => "memory_ok",
        }
    }

    /// Whether `info` changes with this event (and is published again after it).
    pub fn changes_info(&self) -> bool {
        matches!(self, Self::ModelReloaded { .. } | Self::ConfigApplied { .. } | Self::BatchChange { .. } | Self::DecoderFallback { .. })
    }
}

/// What an out-of-memory error at batch 1 did.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OomAction {
    /// The picture failed (an `input_rejected` event follows).
    FrameFailed,
}

/// Why the working batch size changed.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BatchChangeReason {
    /// Down, after an out-of-memory error.
    Oom,
    /// Up one step (doubling, capped at the shapes' ceiling) after `oom.quiet_period_s` without one.
    Probe,
    /// Down (halving), once per memory watchdog reading while it holds memory high
    /// (`watchdog.lower_batch`).
    MemoryHigh,
    /// To the ceiling of the input shapes of the last minute (`shape_planned`): down at once
    /// when a larger shape arrives; up when the shapes that held it lower are gone (or a
    /// smaller one is all there is), unless an out-of-memory error or high memory was recent.
    Shape,
}

/// The pipeline stage where a picture failed.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum InputStage {
    /// Taking the picture in (empty MQTT payload, full intake).
    Intake,
    /// Reading, checking or decoding it (size limits, corrupt data).
    Decode,
    /// The forward pass.
    Infer,
}

impl InputStage {
    /// The stage's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Intake => "intake",
            Self::Decode => "decode",
            Self::Infer => "infer",
        }
    }
}

impl std::fmt::Display for InputStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the memory watchdog watches.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MemoryScope {
    /// The device's memory in use, by every process, against the device's limit (on the CPU and
    /// an integrated GPU: host memory against the tightest of MemTotal and the cgroup limits).
    Device,
    /// This process's memory (CUDA pool reservation; resident set on the CPU) against
    /// `watchdog.memory_limit`.
    Process,
}

/// One reading of the memory watchdog, the one that crossed a threshold.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryWatch {
    /// What was read.
    pub scope: MemoryScope,
    /// Memory in use (bytes).
    pub used: u64,
    /// The limit it is held against (bytes).
    pub limit: u64,
    /// What sets the limit: the device's (as in `DeviceMemoryFigures.limit`) or
    /// `config:watchdog.memory_limit`.
    pub limit_name: String,
    /// `used / limit` (4 decimals).
    pub share: f64,
    /// The threshold crossed (`watchdog.memory_high` or `watchdog.memory_ok`).
    pub threshold: f64,
}

/// The pool's reservation against the planner's budget (CUDA, after a plan).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryBudget {
    /// The pool's reservation now (bytes).
    pub reserved: Option<u64>,
    /// The part of it above the model's weights, held against the budget (bytes).
    pub reserved_for_batches: Option<u64>,
    /// The planner's budget (bytes).
    pub budget: u64,
    /// The planner's measured peak at the startup batch (bytes).
    pub verified_peak: u64,
    /// The working batch size.
    pub batch: u64,
    /// What it means.
    pub note: String,
}

// ---------------------------------------------------------------------------------------------
// parsing by topic, and the schema

/// Any message the agent publishes, as read from its topic.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// `detections/{source}`.
    Detections(Detections),
    /// `telemetry`.
    Telemetry(Telemetry),
    /// `events`.
    Event(Event),
    /// `info`.
    Info(Info),
    /// `status`.
    Status(Status),
}

/// Why a payload is not the message its topic promises.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// Not JSON, or JSON of another shape.
    #[error("not a valid {type_name} message: {source}")]
    Json {
        /// The expected type.
        type_name: &'static str,
        /// What serde_json said.
        source: serde_json::Error,
    },
    /// A status payload other than `online`/`offline`.
    #[error("not a valid Status message: {0:?}")]
    Status(String),
}

impl ParseError {
    /// True when the payload is not JSON at all (as opposed to JSON of another shape).
    pub fn is_syntax(&self) -> bool {
        matches!(self, Self::Json { source, .. } if source.is_syntax() || source.is_eof())
    }
}

impl Message {
    /// Parses `payload` by `leaf`, the topic after `{prefix}/{device_id}/`; `Ok(None)` for a leaf
    /// the agent does not publish.
    pub fn parse(leaf: &str, payload: &[u8]) -> Result<Option<Self>, ParseError> {
        fn json<T: serde::de::DeserializeOwned>(type_name: &'static str, payload: &[u8]) -> Result<T, ParseError> {
            serde_json::from_slice(payload).map_err(|source| ParseError::Json { type_name, source })
        }
        Ok(Some(match leaf {
            "telemetry" => Self::Telemetry(json("Telemetry", payload)?),
            "events" => Self::Event(json("Event", payload)?),
            "info" => Self::Info(json("Info", payload)?),
            "status" => {
                Self::Status(Status::parse(payload).ok_or_else(|| ParseError::Status(String::from_utf8_lossy(payload).into_owned()))?)
            }
            _ if leaf.strip_prefix("detections/").is_some_and(|s| !s.is_empty() && !s.contains('/')) => {
                Self::Detections(json("Detections", payload)?)
            }
            _ => return Ok(None),
        }))
    }
}

/// The JSON Schema of every message, one object keyed by type name (`Detections`, `Telemetry`,
/// `Event`, `Info`, `Status`); what `docs/messages.schema.json` holds.
pub fn json_schema() -> serde_json::Value {
    let mut all = serde_json::Map::new();
    let mut put = |name: &str, schema: schemars::Schema| {
        all.insert(name.to_string(), schema.to_value());
    };
    put("Detections", schemars::schema_for!(Detections));
    put("Telemetry", schemars::schema_for!(Telemetry));
    put("Event", schemars::schema_for!(Event));
    put("Info", schemars::schema_for!(Info));
    put("Status", schemars::schema_for!(Status));
    serde_json::Value::Object(all)
}

/// One complete message of each kind, for tests and documentation.
#[cfg(test)]
pub(crate) mod examples {
    use super::*;

    const DEVICE: &str = "box-1";
    const BOOT: &str = "8d0f6a3e-3b7e-4a52-9c1e-2f4a1b6c7d80";
    const TS: &str = "2026-12-01T10:00:00.123Z";

    /// A detection message for `name` in the hot folder `/data/in`.
    pub fn detections(name: &str, detections: Vec<Detection>) -> Detections {
        Detections {
            v: VERSION,
            device_id: DEVICE.into(),
            boot_id: BOOT.into(),
            seq: 1,
            ts: TS.into(),
            source: "cam".into(),
            image: FrameImage::Path { path: format!("/data/in/{name}"), w: 640, h: 480 },
            model: "yolov9t:182a7e7c1428".into(),
            batch_size: 4,
            latency_ms: FrameLatency { decode: 3.2, infer: 80.0, post: 0.05, capture_to_publish: None },
            detections,
        }
    }

    /// A telemetry message.
    pub fn telemetry() -> Telemetry {
        let p = Percentiles { p50: 80.0, p90: 85.5, p99: 90.25 };
        Telemetry {
            v: VERSION,
            device_id: DEVICE.into(),
            boot_id: BOOT.into(),
            ts: TS.into(),
            uptime_s: 12.5,
            device_memory: DeviceMemoryFigures {
                total: Some(16 << 30),
                free: Some(10 << 30),
                used: Some(6 << 30),
                limit: Some("cgroup:/system.slice/yolo-edge.service memory.max".into()),
                high: false,
            },
            process_memory: ProcessMemory {
                used: Some(300 << 20),
                reserved: Some(300 << 20),
                high_water: Some(310 << 20),
                rss: Some(300 << 20),
            },
            batch: BatchTelemetry {
                current: 4,
                startup: 4,
                ceiling: 6,
                shape: Some([640, 384]),
                oom_fallbacks: 0,
                last_oom_ms: None,
                predicted_peak: None,
                verified_peak: None,
                budget: None,
            },
            fps: 1.5,
            frames: FrameCounters { frames_in: 3, ok: 3, failed: 0, batches: 1, inputs_rejected: 0 },
            latency_ms: StageLatency { decode: p, infer: p, post: p, publish: p },
            queues: Queues { intake: 0, decoded: 0, results: 0 },
            mqtt: MqttCounters {
                queued: 0,
                spooled: 0,
                spool_bytes: 0,
                spooled_total: 0,
                spool_replayed: 0,
                dead_letters: 0,
                published: 3,
                acked: 3,
                reconnects: 0,
                connect_refused: 0,
                events_dropped: 0,
            },
            config: ConfigCounters { applied: 0, rejected: 0, model_reloads: 0 },
            streams: Vec::new(),
        }
    }

    /// An info message for a model with these classes.
    pub fn info(classes: &[&str]) -> Info {
        Info {
            v: VERSION,
            device_id: DEVICE.into(),
            boot_id: BOOT.into(),
            version: "0.1.0".into(),
            started: TS.into(),
            model: ModelInfo {
                variant: "yolov9t".into(),
                classes: classes.iter().map(|c| c.to_string()).collect(),
                nc: classes.len(),
                sha256: "182a7e7c142895327ea6620f07071d8335dc50875a26d809bbcd9b9881257191".into(),
                path: "/opt/models/yolov9t-shapes.safetensors".into(),
                label: "yolov9t:182a7e7c1428".into(),
            },
            device: "cpu".into(),
            dtype: "f32".into(),
            imgsz: 416,
            batch_plan: BatchPlan {
                startup: 4,
                current: 4,
                max_batch: 16,
                reason: "fixed by config (batch = 4)".into(),
                memory_fraction: 0.8,
                memory_limit: None,
                plan: None,
            },
            startup: None,
            config_sha256: "5f1d0c0e8e1b2a3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4".into(),
            sources: vec!["cam".into()],
            protocol: MqttProtocol::V311,
            streams: Vec::new(),
        }
    }

    /// An event with this body.
    pub fn event(body: EventBody) -> Event {
        Event { v: VERSION, device_id: DEVICE.into(), boot_id: BOOT.into(), ts: TS.into(), body }
    }

    /// A plan as the planner reports it.
    pub fn plan() -> PlanReport {
        PlanReport {
            budget: PlanBudget {
                free: 8 << 30,
                total: 16 << 30,
                memory_limit: Some(40 << 20),
                memory_fraction: 0.8,
                source: MemorySourceKind::HostMeminfo,
                limit: "config:memory_limit".into(),
                bytes: 33554432,
            },
            max_batch: 16,
            fit: MemoryFit { fixed: 1.0e6, per_image: 5.5e6, points: vec![(1, 6_500_000), (2, 12_000_000)] },
            used_fit: None,
            batch: 4,
            predicted_peak: 23_000_000,
            verified_peak: 22_000_000,
            steps: vec![PlanStep { batch: 1, purpose: "probe".into(), predicted: None, measured: Some(6_500_000), outcome: "ok".into() }],
            reasons: vec!["batch 4 is the largest that fits".into()],
        }
    }

    /// One body of every event kind (both shapes of `oom_fallback` and three of `input_rejected`).
    pub fn bodies() -> Vec<EventBody> {
        let budget = MemoryBudget {
            reserved: Some(900),
            reserved_for_batches: Some(700),
            budget: 600,
            verified_peak: 500,
            batch: 4,
            note: "n".into(),
        };
        vec![
            EventBody::OomFallback {
                batch: 1,
                action: Some(OomAction::FrameFailed),
                retry_as: None,
                batch_before: None,
                batch_after: None,
                error: "out of memory".into(),
            },
            EventBody::OomFallback {
                batch: 5,
                action: None,
                retry_as: Some([3, 2]),
                batch_before: Some(5),
                batch_after: Some(3),
                error: "out of memory".into(),
            },
            EventBody::BatchChange { from: 4, to: 8, startup: 8, reason: BatchChangeReason::Probe },
            EventBody::ConfigApplied {
                path: "/etc/yolo-edge/agent.toml".into(),
                sha256: "ab".into(),
                changed: vec!["telemetry".into()],
                restart_required: vec![],
            },
            EventBody::ConfigRejected {
                path: "/etc/yolo-edge/agent.toml".into(),
                error: "agent.toml:7: model.conf: 7.5 out of range".into(),
                running_sha256: "ab".into(),
            },
            EventBody::ModelReloaded {
                from: "yolov9t:aaaaaaaaaaaa".into(),
                to: "yolov9t:bbbbbbbbbbbb".into(),
                path: "/m2.pt".into(),
                sha256: "bb".into(),
            },
            EventBody::InputRejected {
                source: Some("cam".into()),
                image: Some(ImageName::Path { path: "/data/in/b.jpg".into() }),
                topic: None,
                stage: InputStage::Decode,
                reason: "truncated".into(),
            },
            EventBody::InputRejected {
                source: Some("door".into()),
                image: Some(ImageName::Id { id: "door".into() }),
                topic: None,
                stage: InputStage::Intake,
                reason: "empty payload".into(),
            },
            EventBody::InputRejected {
                source: None,
                image: None,
                topic: Some("cameras/door/jpeg".into()),
                stage: InputStage::Intake,
                reason: "intake full (agent overloaded)".into(),
            },
            EventBody::SourceError {
                source: "cam".into(),
                path: "/data/in".into(),
                error: "No such file or directory (os error 2)".into(),
            },
            EventBody::SourceRecovered { source: "cam".into(), path: "/data/in".into() },
            EventBody::MqttDisconnected { reason: "Connection closed by peer abruptly".into() },
            EventBody::MqttReconnected { down_s: 12.5, reason: "Connection closed by peer abruptly".into(), spooled: 240, attempts: 5 },
            EventBody::MqttRefused { reason: "BadUserNamePassword".into(), auth: true },
            EventBody::PublishRefused {
                topic: "yolo-edge/box-1/detections/cam".into(),
                reason: "refused by the broker: NotAuthorized".into(),
                dead_letter: Some("/var/spool/yolo-edge/dead/00000000000000000042.msg".into()),
            },
            EventBody::SpoolError { error: "corrupt spool entry".into() },
            EventBody::MemoryReleased { idle_s: 30.0, reserved_before: Some(1 << 30), reserved_after: None },
            EventBody::MemoryOverBudget(budget.clone()),
            EventBody::MemoryWithinBudget(budget),
            EventBody::MemoryHigh(MemoryWatch {
                scope: MemoryScope::Device,
                used: 7 << 30,
                limit: 15 << 29,
                limit_name: "cgroup:/system.slice/yolo-edge.service memory.max".into(),
                share: 0.9333,
                threshold: 0.9,
            }),
            EventBody::MemoryOk(MemoryWatch {
                scope: MemoryScope::Process,
                used: 300 << 20,
                limit: 1 << 30,
                limit_name: "config:watchdog.memory_limit".into(),
                share: 0.293,
                threshold: 0.8,
            }),
            EventBody::ShapePlanned {
                width: 640,
                height: 384,
                area_ratio: 0.6,
                estimated: 13,
                predicted_peak: 900 << 20,
                batch: 13,
                verified_peak: Some(880 << 20),
                budget: 1 << 30,
                startup: 8,
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::examples::*;
    use super::*;
    use serde_json::json;

    fn det() -> Detection {
        Detection { class_id: 0, label: "ball".into(), confidence: 0.875, bbox: [1.5, 2.0, 30.25, 40.0] }
    }

    fn roundtrip<T: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug>(v: &T) {
        let text = serde_json::to_string(v).unwrap();
        let back: T = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(&back, v);
    }

    #[test]
    fn every_message_round_trips() {
        roundtrip(&detections("a.jpg", vec![det()]));
        roundtrip(&telemetry());
        let mut i = info(&["ball"]);
        roundtrip(&i);
        i.batch_plan.plan = Some(plan());
        roundtrip(&i);
        for b in bodies() {
            roundtrip(&event(b));
        }
        for s in [Status::Online, Status::Offline] {
            assert_eq!(Status::parse(s.as_payload().as_bytes()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), json!(s.as_payload()));
        }
        assert_eq!(Status::parse(b"\"online\""), None);
    }

    /// The JSON of each message, as the agent wrote it with `serde_json::json!` before these
    /// types (objects compare regardless of key order).
    #[test]
    fn json_shapes_are_the_agents() {
        let d = detections("a.jpg", vec![det()]);
        assert_eq!(
            serde_json::to_value(&d).unwrap(),
            json!({"v": 1, "device_id": "box-1", "boot_id": d.boot_id, "seq": 1, "ts": d.ts, "source": "cam",
                   "image": {"path": "/data/in/a.jpg", "w": 640, "h": 480}, "model": "yolov9t:182a7e7c1428", "batch_size": 4,
                   "latency_ms": {"decode": 3.2, "infer": 80.0, "post": 0.05},
                   "detections": [{"class_id": 0, "label": "ball", "confidence": 0.875, "box": [1.5, 2.0, 30.25, 40.0]}]})
        );
        let by_id = FrameImage::Id { id: "door".into(), w: 2, h: 3 };
        assert_eq!(serde_json::to_value(&by_id).unwrap(), json!({"id": "door", "w": 2, "h": 3}));
        let t = serde_json::to_value(telemetry()).unwrap();
        assert_eq!(t["frames"], json!({"in": 3, "ok": 3, "failed": 0, "batches": 1, "inputs_rejected": 0}));
        assert_eq!(t["batch"]["last_oom_ms"], json!(null));
        assert_eq!(
            t["device_memory"],
            json!({"total": 16u64 << 30, "free": 10u64 << 30, "used": 6u64 << 30, "limit": "cgroup:/system.slice/yolo-edge.service memory.max", "high": false})
        );
        assert_eq!(serde_json::to_value(plan()).unwrap()["budget"]["limit"], json!("config:memory_limit"));
        assert_eq!(t["latency_ms"]["publish"], json!({"p50": 80.0, "p90": 85.5, "p99": 90.25}));
        let i = serde_json::to_value(info(&["ball"])).unwrap();
        assert_eq!((&i["startup"], &i["batch_plan"]["plan"], &i["protocol"]), (&json!(null), &json!(null), &json!("v311")));
        let ev = |b: EventBody| {
            let mut v = serde_json::to_value(event(b)).unwrap();
            for k in ["v", "device_id", "boot_id", "ts"] {
                assert!(v.as_object_mut().unwrap().remove(k).is_some(), "{k}");
            }
            v
        };
        let b = bodies();
        assert_eq!(ev(b[0].clone()), json!({"type": "oom_fallback", "batch": 1, "action": "frame_failed", "error": "out of memory"}));
        assert_eq!(
            ev(b[1].clone()),
            json!({"type": "oom_fallback", "batch": 5, "retry_as": [3, 2], "batch_before": 5, "batch_after": 3, "error": "out of memory"})
        );
        assert_eq!(ev(b[2].clone()), json!({"type": "batch_change", "from": 4, "to": 8, "startup": 8, "reason": "probe"}));
        assert_eq!(
            ev(b[6].clone()),
            json!({"type": "input_rejected", "source": "cam", "image": {"path": "/data/in/b.jpg"}, "stage": "decode",
                   "reason": "truncated"})
        );
        assert_eq!(
            ev(b[8].clone()),
            json!({"type": "input_rejected", "topic": "cameras/door/jpeg", "stage": "intake",
                   "reason": "intake full (agent overloaded)"})
        );
        assert_eq!(
            ev(b[16].clone()),
            json!({"type": "memory_released", "idle_s": 30.0, "reserved_before": 1u64 << 30, "reserved_after": null})
        );
        assert_eq!(
            ev(b[17].clone()),
            json!({"type": "memory_over_budget", "reserved": 900, "reserved_for_batches": 700, "budget": 600,
                   "verified_peak": 500, "batch": 4, "note": "n"})
        );
        assert_eq!(
            ev(b[19].clone()),
            json!({"type": "memory_high", "scope": "device", "used": 7u64 << 30, "limit": 15u64 << 29,
                   "limit_name": "cgroup:/system.slice/yolo-edge.service memory.max", "share": 0.9333, "threshold": 0.9})
        );
        for body in b {
            assert_eq!(ev(body.clone())["type"], body.kind());
        }
    }

    #[test]
    fn drift_is_an_error() {
        let mut v = serde_json::to_value(detections("a.jpg", vec![det()])).unwrap();
        v["extra"] = json!(1);
        assert!(serde_json::from_value::<Detections>(v).is_err());
        let mut v = serde_json::to_value(event(bodies()[2].clone())).unwrap();
        v["extra"] = json!(1);
        assert!(serde_json::from_value::<Event>(v.clone()).is_err());
        v["type"] = json!("no_such_event");
        assert!(serde_json::from_value::<Event>(v).is_err());
        let mut v = serde_json::to_value(telemetry()).unwrap();
        v["mqtt"]["extra"] = json!(1);
        assert!(serde_json::from_value::<Telemetry>(v).is_err());
    }

    #[test]
    fn messages_parse_by_topic() {
        let d = serde_json::to_vec(&detections("a.jpg", vec![])).unwrap();
        assert!(matches!(Message::parse("detections/cam", &d), Ok(Some(Message::Detections(_)))));
        assert!(matches!(Message::parse("status", b"offline"), Ok(Some(Message::Status(Status::Offline)))));
        assert!(matches!(Message::parse("status", b"gone"), Err(ParseError::Status(_))));
        assert!(Message::parse("telemetry", b"{{").is_err_and(|e| e.is_syntax()));
        let e = Message::parse("info", &d).unwrap_err();
        assert!(!e.is_syntax() && e.to_string().starts_with("not a valid Info message"), "{e}");
        assert!(matches!(Message::parse("something/else", b"x"), Ok(None)));
    }

    /// `docs/messages.schema.json` is generated from these types; `UPDATE_SCHEMA=1 cargo test
    /// --lib schema_is_current` rewrites it.
    #[test]
    fn schema_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/messages.schema.json");
        let text = format!("{}\n", serde_json::to_string_pretty(&json_schema()).unwrap());
        if std::env::var("UPDATE_SCHEMA").is_ok_and(|v| v == "1") {
            std::fs::write(&path, &text).unwrap();
            return;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(committed == text, "{} is out of date: run `UPDATE_SCHEMA=1 cargo test --lib schema_is_current`", path.display());
    }
}
