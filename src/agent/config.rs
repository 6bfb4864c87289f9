//! The agent's TOML configuration: raw serde structs (unknown keys rejected) validated into a
//! typed [`Config`]; every error names the file, line:column and key path.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::backend::tuning::Tuning;
pub use crate::files::read_bounded;
use crate::units::ByteSize;
use sha2::{Digest, Sha256};

use crate::detector::JpegDecoder;
use crate::vision::postprocess::Thresholds;
use crate::vision::preprocess::Fit;

/// Why a configuration was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}:{column}: `{key}`: {message}")]
    Invalid { path: PathBuf, line: usize, column: usize, key: String, message: String },
}

// ---------------------------------------------------------------------------------------------
// Raw structs, as written in the file.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default)]
    device: RawDevice,
    model: RawModel,
    mqtt: RawMqtt,
    #[serde(default)]
    sources: Vec<RawSource>,
    #[serde(default)]
    telemetry: RawTelemetry,
    spool: RawSpool,
    #[serde(default)]
    oom: RawOom,
    #[serde(default)]
    shutdown: RawShutdown,
    #[serde(default)]
    input: RawInput,
    #[serde(default)]
    tuning: Tuning,
    #[serde(default)]
    metrics: Option<RawMetrics>,
    #[serde(default)]
    watchdog: RawWatchdog,
    #[serde(default)]
    debug: RawDebug,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWatchdog {
    /// Seconds between two readings of the memory in use.
    #[serde(default = "d_watch_interval")]
    interval_s: PositiveF64,
    /// Share of the limit at or above which `memory_high` is published.
    #[serde(default = "d_watch_high")]
    memory_high: Fraction,
    /// Share of the limit at or below which `memory_ok` follows a `memory_high`.
    #[serde(default = "d_watch_ok")]
    memory_ok: Fraction,
    /// Watch this process's memory against this cap instead of the device against its limit.
    #[serde(default)]
    memory_limit: Option<ByteSize>,
    /// While memory is high, halve the batch at every reading (down to 1).
    #[serde(default = "d_true")]
    lower_batch: bool,
}
impl Default for RawWatchdog {
    fn default() -> Self {
        Self { interval_s: d_watch_interval(), memory_high: d_watch_high(), memory_ok: d_watch_ok(), memory_limit: None, lower_batch: true }
    }
}

fn d_true() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    /// `host:port` of the `/metrics`, `/healthz` and `/readyz` listener.
    listen: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDevice {
    #[serde(default = "d_auto")]
    device: String,
    #[serde(default = "d_auto")]
    dtype: String,
    #[serde(default = "d_imgsz")]
    imgsz: Imgsz,
    #[serde(default)]
    batch: BatchSpec,
    #[serde(default = "d_max_batch")]
    max_batch: Ranged<1, 1024>,
    #[serde(default = "d_fraction")]
    memory_fraction: Fraction,
    #[serde(default)]
    memory_limit: Option<ByteSize>,
    #[serde(default = "d_max_wait")]
    max_wait_ms: Ranged<0, 60_000>,
    #[serde(default)]
    decode_threads: Option<Ranged<1, 256>>,
    #[serde(default)]
    fit: Fit,
    #[serde(default)]
    jpeg_decoder: JpegDecoder,
}

impl Default for RawDevice {
    fn default() -> Self {
        Self {
            device: d_auto(),
            dtype: d_auto(),
            imgsz: d_imgsz(),
            batch: BatchSpec::default(),
            max_batch: d_max_batch(),
            memory_fraction: d_fraction(),
            memory_limit: None,
            max_wait_ms: d_max_wait(),
            decode_threads: None,
            fit: Fit::default(),
            jpeg_decoder: JpegDecoder::default(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    path: PathBuf,
    #[serde(default)]
    sha256: Option<String>,
    #[serde(default = "d_conf")]
    conf: Fraction,
    #[serde(default = "d_iou")]
    iou: Fraction,
    #[serde(default = "d_max_det")]
    max_det: Ranged<1, 30_000>,
    #[serde(default = "d_load_timeout")]
    load_timeout_s: PositiveF64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMqtt {
    host: String,
    #[serde(default)]
    port: Option<Ranged<1, 65535>>,
    device_id: TopicLevel,
    #[serde(default)]
    client_id: Option<String>,
    #[serde(default = "d_prefix")]
    prefix: String,
    #[serde(default)]
    protocol: Protocol,
    #[serde(default)]
    tls: Option<RawTls>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    password_file: Option<PathBuf>,
    #[serde(default = "d_keepalive")]
    keepalive_s: Ranged<5, 65535>,
    #[serde(default = "d_qos")]
    qos: Ranged<0, 1>,
    #[serde(default = "d_inflight")]
    max_inflight: Ranged<1, 1000>,
    #[serde(default = "d_backoff_min")]
    reconnect_min_ms: Ranged<10, 600_000>,
    #[serde(default = "d_backoff_max")]
    reconnect_max_ms: Ranged<10, 3_600_000>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    ca: PathBuf,
    #[serde(default)]
    client_cert: Option<PathBuf>,
    #[serde(default)]
    client_key: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, tag = "type", rename_all = "lowercase")]
enum RawSource {
    Folder {
        id: TopicLevel,
        path: PathBuf,
        #[serde(default)]
        done_dir: Option<PathBuf>,
        #[serde(default)]
        failed_dir: Option<PathBuf>,
        #[serde(default = "d_settle")]
        settle_ms: Ranged<0, 60_000>,
        #[serde(default = "d_scan")]
        scan_interval_ms: Ranged<10, 60_000>,
    },
    Mqtt {
        #[serde(default)]
        id: Option<TopicLevel>,
        topic: String,
        #[serde(default = "d_id_level")]
        id_from_topic_level: Ranged<0, 64>,
    },
    /// An RTSP camera.
    Rtsp {
        id: TopicLevel,
        url: String,
        #[serde(default)]
        protocol: RtspProtocol,
        #[serde(default = "d_rtsp_latency")]
        latency_ms: Ranged<0, 10_000>,
        #[serde(default)]
        username: Option<String>,
        /// A file holding the password (the URL carries no credentials).
        #[serde(default)]
        password_file: Option<PathBuf>,
        #[serde(default)]
        decoder: DecoderChoice,
        #[serde(default)]
        max_fps: Option<f64>,
        #[serde(default = "d_queue_depth")]
        queue_depth: Ranged<1, 64>,
        #[serde(default = "d_stall_timeout")]
        stall_timeout_ms: Ranged<100, 3_600_000>,
        #[serde(default = "d_stream_backoff_min")]
        reconnect_min_ms: Ranged<10, 600_000>,
        #[serde(default = "d_backoff_max")]
        reconnect_max_ms: Ranged<10, 3_600_000>,
    },
    /// A video file.
    Video {
        id: TopicLevel,
        path: PathBuf,
        #[serde(default)]
        pacing: Pacing,
        #[serde(default)]
        decoder: DecoderChoice,
        #[serde(default)]
        max_fps: Option<f64>,
        #[serde(default = "d_queue_depth")]
        queue_depth: Ranged<1, 64>,
        #[serde(default = "d_stall_timeout")]
        stall_timeout_ms: Ranged<100, 3_600_000>,
        #[serde(default = "d_stream_backoff_min")]
        reconnect_min_ms: Ranged<10, 600_000>,
        #[serde(default = "d_backoff_max")]
        reconnect_max_ms: Ranged<10, 3_600_000>,
    },
    /// A V4L2 (USB) camera.
    V4l2 {
        id: TopicLevel,
        device: PathBuf,
        #[serde(default)]
        width: Option<Ranged<1, 16_384>>,
        #[serde(default)]
        height: Option<Ranged<1, 16_384>>,
        #[serde(default)]
        fps: Option<Ranged<1, 1000>>,
        #[serde(default)]
        decoder: DecoderChoice,
        #[serde(default)]
        max_fps: Option<f64>,
        #[serde(default = "d_queue_depth")]
        queue_depth: Ranged<1, 64>,
        #[serde(default = "d_stall_timeout")]
        stall_timeout_ms: Ranged<100, 3_600_000>,
        #[serde(default = "d_stream_backoff_min")]
        reconnect_min_ms: Ranged<10, 600_000>,
        #[serde(default = "d_backoff_max")]
        reconnect_max_ms: Ranged<10, 3_600_000>,
    },
    /// Any URI GStreamer can open (`file://`, `http://`, ...).
    Uri {
        id: TopicLevel,
        uri: String,
        #[serde(default)]
        decoder: DecoderChoice,
        #[serde(default)]
        max_fps: Option<f64>,
        #[serde(default = "d_queue_depth")]
        queue_depth: Ranged<1, 64>,
        #[serde(default = "d_stall_timeout")]
        stall_timeout_ms: Ranged<100, 3_600_000>,
        #[serde(default = "d_stream_backoff_min")]
        reconnect_min_ms: Ranged<10, 600_000>,
        #[serde(default = "d_backoff_max")]
        reconnect_max_ms: Ranged<10, 3_600_000>,
    },
}

/// Settings every stream source has (written out in each stream variant: serde's `flatten`
/// would let unknown keys through).
struct RawStream {
    decoder: DecoderChoice,
    max_fps: Option<f64>,
    queue_depth: Ranged<1, 64>,
    stall_timeout_ms: Ranged<100, 3_600_000>,
    reconnect_min_ms: Ranged<10, 600_000>,
    reconnect_max_ms: Ranged<10, 3_600_000>,
}

/// Which video decoder a stream uses (`decoder = ...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DecoderChoice {
    /// The best present: `nvv4l2decoder` (Jetson), else NVDEC (`nvh264dec`/`nvh265dec`), else
    /// software.
    #[default]
    Auto,
    /// Software (`avdec_h264`, `avdec_h265`).
    Cpu,
    /// NVDEC on x86 NVIDIA GPUs (`nvh264dec`, `nvh265dec`).
    Nvdec,
    /// `nvv4l2decoder` (Jetson).
    Nvv4l2,
}

impl DecoderChoice {
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Cpu => "cpu",
            Self::Nvdec => "nvdec",
            Self::Nvv4l2 => "nvv4l2",
        }
    }
}

/// RTSP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RtspProtocol {
    #[default]
    Tcp,
    Udp,
}

/// How a video file is read: at its frame rate like a camera (frames the agent cannot keep up
/// with are dropped), or as fast as the agent takes frames (none dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pacing {
    #[default]
    Realtime,
    Fast,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTelemetry {
    #[serde(default = "d_interval")]
    interval_s: PositiveF64,
}
impl Default for RawTelemetry {
    fn default() -> Self {
        Self { interval_s: d_interval() }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpool {
    dir: PathBuf,
    #[serde(default = "d_spool_max")]
    max_bytes: ByteSize,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOom {
    #[serde(default = "d_quiet")]
    quiet_period_s: PositiveF64,
    /// Seconds without work after which cached device memory goes back to the device (0: keep).
    #[serde(default = "d_release_idle")]
    release_idle_s: Ranged<0, 86_400>,
}
impl Default for RawOom {
    fn default() -> Self {
        Self { quiet_period_s: d_quiet(), release_idle_s: d_release_idle() }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawShutdown {
    #[serde(default = "d_grace")]
    grace_s: PositiveF64,
}
impl Default for RawShutdown {
    fn default() -> Self {
        Self { grace_s: d_grace() }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInput {
    #[serde(default = "d_in_bytes")]
    max_bytes: ByteSize,
    #[serde(default = "d_in_side")]
    max_side: Ranged<1, 65_535>,
    #[serde(default = "d_in_pixels")]
    max_pixels: Ranged<1, 1_000_000_000>,
}
impl Default for RawInput {
    fn default() -> Self {
        Self { max_bytes: d_in_bytes(), max_side: d_in_side(), max_pixels: d_in_pixels() }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDebug {
    #[serde(default)]
    inject_oom: Option<String>,
    /// Milliseconds of sleep before each model load (tests watch `/readyz` during a load).
    #[serde(default)]
    model_load_delay_ms: Option<Ranged<0, 600_000>>,
    /// Milliseconds of sleep before each batch's forward pass: a deliberately slow model (tests
    /// of the live frame policy).
    #[serde(default)]
    infer_delay_ms: Option<Ranged<0, 60_000>>,
}

fn d_auto() -> String {
    "auto".into()
}
fn d_imgsz() -> Imgsz {
    Imgsz(640)
}
fn d_max_batch() -> Ranged<1, 1024> {
    Ranged(16)
}
fn d_fraction() -> Fraction {
    Fraction(0.8)
}
fn d_max_wait() -> Ranged<0, 60_000> {
    Ranged(20)
}
fn d_conf() -> Fraction {
    Fraction(0.25)
}
fn d_iou() -> Fraction {
    Fraction(0.7)
}
fn d_max_det() -> Ranged<1, 30_000> {
    Ranged(300)
}
fn d_prefix() -> String {
    "yolo-edge".into()
}
fn d_keepalive() -> Ranged<5, 65535> {
    Ranged(30)
}
fn d_qos() -> Ranged<0, 1> {
    Ranged(1)
}
fn d_inflight() -> Ranged<1, 1000> {
    Ranged(64)
}
fn d_backoff_min() -> Ranged<10, 600_000> {
    Ranged(250)
}
fn d_backoff_max() -> Ranged<10, 3_600_000> {
    Ranged(30_000)
}
fn d_rtsp_latency() -> Ranged<0, 10_000> {
    Ranged(200)
}
fn d_queue_depth() -> Ranged<1, 64> {
    Ranged(1)
}
fn d_stall_timeout() -> Ranged<100, 3_600_000> {
    Ranged(5_000)
}
fn d_stream_backoff_min() -> Ranged<10, 600_000> {
    Ranged(500)
}
fn d_settle() -> Ranged<0, 60_000> {
    Ranged(200)
}
fn d_scan() -> Ranged<10, 60_000> {
    Ranged(500)
}
fn d_id_level() -> Ranged<0, 64> {
    Ranged(0)
}
fn d_interval() -> PositiveF64 {
    PositiveF64(10.0)
}
fn d_spool_max() -> ByteSize {
    ByteSize(256 << 20)
}
fn d_quiet() -> PositiveF64 {
    PositiveF64(60.0)
}
fn d_release_idle() -> Ranged<0, 86_400> {
    Ranged(30)
}
fn d_load_timeout() -> PositiveF64 {
    PositiveF64(300.0)
}
fn d_watch_interval() -> PositiveF64 {
    PositiveF64(2.0)
}
fn d_watch_high() -> Fraction {
    Fraction(0.9)
}
fn d_watch_ok() -> Fraction {
    Fraction(0.8)
}
fn d_grace() -> PositiveF64 {
    PositiveF64(20.0)
}
fn d_in_bytes() -> ByteSize {
    ByteSize(64 << 20)
}
fn d_in_side() -> Ranged<1, 65_535> {
    Ranged(16_384)
}
fn d_in_pixels() -> Ranged<1, 1_000_000_000> {
    Ranged(100_000_000)
}

// ---------------------------------------------------------------------------------------------
// Value types that validate while deserialising (so errors carry the value's span and path).

/// An integer within `LO..=HI`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ranged<const LO: u64, const HI: u64>(pub u64);

impl<'de, const LO: u64, const HI: u64> Deserialize<'de> for Ranged<LO, HI> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = i64::deserialize(d)?;
        if v < LO as i64 || v as u64 > HI {
            return Err(serde::de::Error::custom(format!("{v} is out of range {LO}..={HI}")));
        }
        Ok(Self(v as u64))
    }
}

/// A number within 0..=1.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Fraction(f64);
impl<'de> Deserialize<'de> for Fraction {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if !(0.0..=1.0).contains(&v) {
            return Err(serde::de::Error::custom(format!("{v} is out of range 0..=1")));
        }
        Ok(Self(v))
    }
}

/// A finite number > 0.
#[derive(Debug, Clone, Copy, PartialEq)]
struct PositiveF64(f64);
impl<'de> Deserialize<'de> for PositiveF64 {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if !(v.is_finite() && v > 0.0 && v < 1e7) {
            return Err(serde::de::Error::custom(format!("{v} must be a positive number of seconds")));
        }
        Ok(Self(v))
    }
}

/// A positive multiple of 32, at most [`crate::detector::MAX_IMGSZ`].
#[derive(Debug, Clone, Copy, PartialEq)]
struct Imgsz(usize);
impl<'de> Deserialize<'de> for Imgsz {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = i64::deserialize(d)?;
        let max = crate::detector::MAX_IMGSZ;
        match usize::try_from(v).ok().and_then(|v| crate::detector::check_imgsz(v).ok()) {
            Some(v) => Ok(Self(v)),
            None => Err(serde::de::Error::custom(format!("{v} is not a positive multiple of 32 (<= {max})"))),
        }
    }
}

/// One MQTT topic level: no `/`, `+`, `#`, not empty.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TopicLevel(String);
impl<'de> Deserialize<'de> for TopicLevel {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = String::deserialize(d)?;
        if !valid_level(&v) {
            return Err(serde::de::Error::custom(format!("id `{v}` must be a non-empty topic level without '/', '+', '#' or spaces")));
        }
        Ok(Self(v))
    }
}

fn valid_level(v: &str) -> bool {
    !v.is_empty() && v.len() <= 128 && !v.chars().any(|c| matches!(c, '/' | '+' | '#') || c.is_whitespace() || c.is_control())
}

/// `batch = N` or `batch = "auto"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BatchSpec {
    #[default]
    Auto,
    Fixed(usize),
}

impl<'de> Deserialize<'de> for BatchSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            N(i64),
            S(String),
        }
        match Either::deserialize(d)? {
            Either::N(n) if (1..=1024).contains(&n) => Ok(Self::Fixed(n as usize)),
            Either::S(s) if s == "auto" => Ok(Self::Auto),
            Either::N(n) => Err(serde::de::Error::custom(format!("batch {n} is out of range 1..=1024"))),
            Either::S(s) => Err(serde::de::Error::custom(format!("batch `{s}` must be a number or \"auto\""))),
        }
    }
}

/// MQTT protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    #[default]
    V311,
    V5,
}

// ---------------------------------------------------------------------------------------------
// The typed configuration.

/// A validated configuration. Relative paths are resolved against the config file's folder.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub path: PathBuf,
    /// sha256 of the file's bytes, published in `info`.
    pub sha256: String,
    pub device: DeviceConfig,
    pub model: ModelConfig,
    pub mqtt: MqttConfig,
    pub sources: Vec<SourceConfig>,
    pub telemetry_interval: Duration,
    pub spool: SpoolConfig,
    pub oom_quiet_period: Duration,
    /// Idle time after which the inference thread returns the pool's cached memory (None: keep).
    pub release_idle: Option<Duration>,
    pub shutdown_grace: Duration,
    pub input: InputLimits,
    /// The acceleration layer's settings (`[tuning]`); applied at startup, a change needs a
    /// restart.
    pub tuning: Tuning,
    pub inject_oom: Option<crate::backend::oom::OomInjector>,
    /// `[metrics]`: where `/metrics`, `/healthz` and `/readyz` are served (None: not served).
    pub metrics: Option<MetricsConfig>,
    /// `[debug] model_load_delay_ms`: a sleep before each model load (None: none).
    pub model_load_delay: Option<Duration>,
    /// `[debug] infer_delay_ms`: a sleep before each batch's forward pass (None: none).
    pub infer_delay: Option<Duration>,
    /// `[watchdog]`: when `memory_high` and `memory_ok` are published; applies live.
    pub watchdog: WatchdogConfig,
}

/// The memory watchdog's settings (`[watchdog]`, see `agent::watchdog`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WatchdogConfig {
    /// Time between two readings.
    pub interval: Duration,
    /// Share of the limit at or above which memory is high (0 < `ok` < `high` <= 1).
    pub high: f64,
    /// Share of the limit at or below which high memory is over.
    pub ok: f64,
    /// A cap on this process's memory; None: the device against its own limit.
    pub memory_limit: Option<u64>,
    /// While memory is high, the inference thread halves its batch at every reading (to 1).
    pub lower_batch: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsConfig {
    pub listen: std::net::SocketAddr,
}

/// Limits applied to every input before decoding (see [`crate::vision::preprocess::DecodeLimits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputLimits {
    pub max_side: u32,
    pub max_pixels: u64,
    pub max_bytes: u64,
}

impl InputLimits {
    pub fn decode_limits(&self) -> crate::vision::preprocess::DecodeLimits {
        crate::vision::preprocess::DecodeLimits { max_side: self.max_side, max_pixels: self.max_pixels, max_bytes: self.max_bytes }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct DeviceConfig {
    pub device: String,
    pub dtype: String,
    pub imgsz: usize,
    pub batch: BatchSpec,
    pub max_batch: usize,
    pub memory_fraction: f64,
    pub memory_limit: Option<u64>,
    pub max_wait: Duration,
    pub decode_threads: usize,
    /// How pictures fit the network input (`rect`, the reference's default, or `square`).
    pub fit: Fit,
    /// Who decodes the JPEG pictures of folder and MQTT sources: `nvjpeg` leaves the decode pool
    /// only each JPEG's header to check, and the inference thread decodes and letterboxes the
    /// batch on the device before its pass (a picture nvJPEG does not take is decoded on the host
    /// there); the agent does not start where nvJPEG cannot run.
    pub jpeg_decoder: JpegDecoder,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub path: PathBuf,
    /// The digest the model file must have (lowercase hex), checked before it is parsed: a
    /// partial copy or a swapped file is rejected, never loaded.
    pub sha256: Option<String>,
    pub thresholds: Thresholds,
    /// How long a live model reload may take before it is abandoned (and rejected).
    pub load_timeout: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MqttConfig {
    pub host: String,
    pub port: u16,
    pub device_id: String,
    pub client_id: String,
    pub prefix: String,
    pub protocol: Protocol,
    pub tls: Option<TlsConfig>,
    pub username: Option<String>,
    pub password: Option<String>,
    pub keepalive: Duration,
    pub qos: u8,
    pub max_inflight: usize,
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
}

impl MqttConfig {
    /// `{prefix}/{device_id}/{leaf}`.
    pub fn topic(&self, leaf: &str) -> String {
        format!("{}/{}/{leaf}", self.prefix, self.device_id)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct TlsConfig {
    /// PEM bytes of the CA bundle.
    pub ca: Vec<u8>,
    /// PEM bytes of the client certificate and key.
    pub client_auth: Option<(Vec<u8>, Vec<u8>)>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum SourceConfig {
    Folder {
        id: String,
        path: PathBuf,
        done_dir: PathBuf,
        failed_dir: PathBuf,
        settle: Duration,
        scan_interval: Duration,
    },
    Mqtt {
        id: Option<String>,
        topic: String,
        id_from_topic_level: usize,
    },
    /// A camera or video stream (feature `gstreamer`); added, removed and changed live.
    Stream(StreamConfig),
}

impl SourceConfig {
    pub fn id(&self) -> &str {
        match self {
            Self::Folder { id, .. } => id,
            Self::Mqtt { id, topic, .. } => id.as_deref().unwrap_or(topic),
            Self::Stream(s) => &s.id,
        }
    }

    /// Whether this source is a stream (its frames wait in the pipeline's per-stream slots;
    /// the others feed the intake).
    pub fn is_stream(&self) -> bool {
        matches!(self, Self::Stream(_))
    }
}

/// A camera or video stream source.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamConfig {
    pub id: String,
    pub kind: StreamKind,
    pub decoder: DecoderChoice,
    /// Frames faster than this are skipped at the source (None: every frame).
    pub max_fps: Option<f64>,
    /// Frames that may wait for inference; a newer frame replaces the oldest (counted dropped).
    pub queue_depth: usize,
    /// No frame arriving for this long means the camera is lost (reconnect).
    pub stall_timeout: Duration,
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
}

/// Where a stream's frames come from.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamKind {
    Rtsp { url: String, protocol: RtspProtocol, latency_ms: u32, username: Option<String>, password: Option<String> },
    Video { path: PathBuf, pacing: Pacing },
    V4l2 { device: PathBuf, width: Option<u32>, height: Option<u32>, fps: Option<u32> },
    Uri { uri: String },
}

impl StreamKind {
    /// `rtsp`, `video`, `v4l2` or `uri`, as in the config.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Rtsp { .. } => "rtsp",
            Self::Video { .. } => "video",
            Self::V4l2 { .. } => "v4l2",
            Self::Uri { .. } => "uri",
        }
    }

    /// Whether the source is live (a camera): its end of stream is a loss, not the end.
    pub fn is_live(&self) -> bool {
        !matches!(self, Self::Video { .. } | Self::Uri { .. })
    }

    /// The location for messages and logs, with any `user:password@` of a URL left out.
    pub fn location(&self) -> String {
        match self {
            Self::Rtsp { url, .. } => strip_userinfo(url),
            Self::Video { path, .. } => path.to_string_lossy().into_owned(),
            Self::V4l2 { device, .. } => device.to_string_lossy().into_owned(),
            Self::Uri { uri } => strip_userinfo(uri),
        }
    }
}

/// `scheme://user:pw@host/...` -> `scheme://host/...`.
pub fn strip_userinfo(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let end = rest.find('/').unwrap_or(rest.len());
            match rest[..end].rfind('@') {
                Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
                None => url.to_string(),
            }
        }
        None => url.to_string(),
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SpoolConfig {
    pub dir: PathBuf,
    pub max_bytes: u64,
}

/// Largest config file read (bytes); real ones are a few KiB.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// Largest password, certificate or key file read (bytes); a PEM chain is a few KiB.
pub const MAX_SECRET_FILE_BYTES: u64 = 1 << 20;

impl Config {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let bytes = read_bounded(path, MAX_CONFIG_BYTES).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        let text = String::from_utf8(bytes).map_err(|e| ConfigError::Read {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error()),
        })?;
        Self::parse(&text, path)
    }

    /// The sha256 of a config file's bytes, as [`Config::sha256`] holds it (hex).
    pub fn content_sha256(bytes: &[u8]) -> String {
        format!("{:x}", Sha256::digest(bytes))
    }

    /// Validates `text` as the content of `path`.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let de = toml::Deserializer::new(text);
        let raw: Raw = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            let inner = e.into_inner();
            let (line, column) = inner.span().map(|s| line_col(text, s.start)).unwrap_or_else(|| locate(text, &key));
            ConfigError::Invalid { path: path.to_path_buf(), line, column, key, message: inner.message().trim().to_string() }
        })?;
        let invalid = |key: &str, message: String| {
            let (line, column) = locate(text, key);
            ConfigError::Invalid { path: path.to_path_buf(), line, column, key: key.to_string(), message }
        };
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let resolve = |p: &Path| if p.is_absolute() { p.to_path_buf() } else { base.join(p) };

        let mut tuning = raw.tuning;
        tuning.cudnn_fusion_cache = tuning.cudnn_fusion_cache.map(|p| resolve(&p));
        tuning.validate().map_err(|e| invalid(&format!("tuning.{}", e.key), e.why))?;

        let d = raw.device;
        if let BatchSpec::Fixed(b) = d.batch {
            if b as u64 > d.max_batch.0 {
                return Err(invalid("device.batch", format!("batch {b} is above max_batch {}", d.max_batch.0)));
            }
        }
        crate::backend::device::parse_dtype(&d.dtype, &candle_core::Device::Cpu).map_err(|e| invalid("device.dtype", e.to_string()))?;
        let dev_ok = d.device == "auto"
            || d.device == "cpu"
            || d.device == "cuda"
            || d.device.strip_prefix("cuda:").is_some_and(|i| i.parse::<usize>().is_ok());
        if !dev_ok {
            return Err(invalid("device.device", format!("unknown device `{}` (expected auto, cpu or cuda:N)", d.device)));
        }
        let device = DeviceConfig {
            device: d.device,
            dtype: d.dtype,
            imgsz: d.imgsz.0,
            batch: d.batch,
            max_batch: d.max_batch.0 as usize,
            memory_fraction: d.memory_fraction.0,
            memory_limit: d.memory_limit.map(|b| b.0),
            max_wait: Duration::from_millis(d.max_wait_ms.0),
            decode_threads: d
                .decode_threads
                .map(|n| n.0 as usize)
                .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2)),
            fit: d.fit,
            jpeg_decoder: d.jpeg_decoder,
        };
        if device.jpeg_decoder == JpegDecoder::Nvjpeg && device.device == "cpu" {
            return Err(invalid("device.jpeg_decoder", "nvjpeg decodes on a CUDA device; this agent runs on the cpu".into()));
        }
        if device.memory_fraction <= 0.0 {
            return Err(invalid("device.memory_fraction", "must be above 0".into()));
        }

        let m = raw.model;
        let sha256 = match m.sha256 {
            Some(h) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()) => Some(h.to_ascii_lowercase()),
            Some(_) => return Err(invalid("model.sha256", "must be 64 hex digits (`sha256sum` of the model file)".into())),
            None => None,
        };
        let model = ModelConfig {
            path: resolve(&m.path),
            sha256,
            thresholds: Thresholds { conf: m.conf.0 as f32, iou: m.iou.0 as f32, max_det: m.max_det.0 as usize },
            load_timeout: Duration::from_secs_f64(m.load_timeout_s.0),
        };

        let q = raw.mqtt;
        if q.host.trim().is_empty() {
            return Err(invalid("mqtt.host", "must not be empty".into()));
        }
        if q.prefix.len() > 256 || !q.prefix.split('/').all(valid_level) {
            return Err(invalid(
                "mqtt.prefix",
                format!(
                    "`{}` is not a valid topic prefix (levels of 1 to 128 bytes without + # or whitespace, 256 bytes in all)",
                    q.prefix
                ),
            ));
        }
        if q.password.is_some() && q.password_file.is_some() {
            return Err(invalid("mqtt.password_file", "set either password or password_file, not both".into()));
        }
        if (q.password.is_some() || q.password_file.is_some()) && q.username.is_none() {
            return Err(invalid("mqtt.username", "a password needs a username".into()));
        }
        if q.reconnect_min_ms.0 > q.reconnect_max_ms.0 {
            return Err(invalid("mqtt.reconnect_min_ms", "is above reconnect_max_ms".into()));
        }
        let password = match (&q.password, &q.password_file) {
            (Some(p), _) => Some(p.clone()),
            (None, Some(f)) => {
                let f = resolve(f);
                let p = read_bounded(&f, MAX_SECRET_FILE_BYTES)
                    .and_then(|b| String::from_utf8(b).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error())))
                    .map_err(|e| invalid("mqtt.password_file", format!("cannot read {}: {e}", f.display())))?;
                Some(p.trim_end_matches(['\n', '\r']).to_string())
            }
            (None, None) => None,
        };
        let tls = match &q.tls {
            None => None,
            Some(t) => {
                let read = |key: &str, p: &Path| {
                    let p = resolve(p);
                    read_bounded(&p, MAX_SECRET_FILE_BYTES).map_err(|e| invalid(key, format!("cannot read {}: {e}", p.display())))
                };
                let ca = read("mqtt.tls.ca", &t.ca)?;
                let client_auth = match (&t.client_cert, &t.client_key) {
                    (Some(c), Some(k)) => Some((read("mqtt.tls.client_cert", c)?, read("mqtt.tls.client_key", k)?)),
                    (None, None) => None,
                    _ => return Err(invalid("mqtt.tls", "client_cert and client_key go together".into())),
                };
                Some(TlsConfig { ca, client_auth })
            }
        };
        let device_id = q.device_id.0;
        let mqtt = MqttConfig {
            host: q.host,
            port: q.port.map(|p| p.0 as u16).unwrap_or(if tls.is_some() { 8883 } else { 1883 }),
            client_id: q.client_id.unwrap_or_else(|| device_id.clone()),
            device_id,
            prefix: q.prefix,
            protocol: q.protocol,
            tls,
            username: q.username,
            password,
            keepalive: Duration::from_secs(q.keepalive_s.0),
            qos: q.qos.0 as u8,
            max_inflight: q.max_inflight.0 as usize,
            reconnect_min: Duration::from_millis(q.reconnect_min_ms.0),
            reconnect_max: Duration::from_millis(q.reconnect_max_ms.0),
        };

        let mut sources = Vec::new();
        for (i, s) in raw.sources.into_iter().enumerate() {
            let src = match s {
                RawSource::Folder { id, path, done_dir, failed_dir, settle_ms, scan_interval_ms } => {
                    let path = resolve(&path);
                    SourceConfig::Folder {
                        id: id.0,
                        done_dir: done_dir.map(|p| resolve(&p)).unwrap_or_else(|| path.join("done")),
                        failed_dir: failed_dir.map(|p| resolve(&p)).unwrap_or_else(|| path.join("failed")),
                        path,
                        settle: Duration::from_millis(settle_ms.0),
                        scan_interval: Duration::from_millis(scan_interval_ms.0),
                    }
                }
                RawSource::Mqtt { id, topic, id_from_topic_level } => {
                    // a shared subscription: `$share/<group>/<filter>`, the group one level without wildcards
                    let filter = match topic.strip_prefix("$share/") {
                        Some(rest) => match rest.split_once('/') {
                            Some((group, f)) if !group.is_empty() && !group.contains(['+', '#']) => f,
                            _ => {
                                return Err(invalid(
                                    &format!("sources[{i}].topic"),
                                    format!("`{topic}` is not a valid shared subscription (`$share/<group>/<filter>`)"),
                                ))
                            }
                        },
                        None => topic.as_str(),
                    };
                    if filter.is_empty()
                        || filter.split('/').enumerate().any(|(j, l)| {
                            l.contains('#') && (l != "#" || j != filter.split('/').count() - 1) || l.contains('+') && l != "+"
                        })
                    {
                        return Err(invalid(&format!("sources[{i}].topic"), format!("`{topic}` is not a valid topic filter")));
                    }
                    SourceConfig::Mqtt { id: id.map(|i| i.0), topic, id_from_topic_level: id_from_topic_level.0 as usize }
                }
                RawSource::Rtsp {
                    id,
                    url,
                    protocol,
                    latency_ms,
                    username,
                    password_file,
                    decoder,
                    max_fps,
                    queue_depth,
                    stall_timeout_ms,
                    reconnect_min_ms,
                    reconnect_max_ms,
                } => {
                    let key = format!("sources[{i}].url");
                    if !(url.starts_with("rtsp://") || url.starts_with("rtsps://"))
                        || url.len() > 4096
                        || url.chars().any(char::is_whitespace)
                    {
                        return Err(invalid(&key, format!("`{}` is not an rtsp:// or rtsps:// URL", strip_userinfo(&url))));
                    }
                    if strip_userinfo(&url) != url {
                        return Err(invalid(&key, "holds credentials; put them in username and password_file".into()));
                    }
                    let password = match password_file {
                        None => None,
                        Some(f) => {
                            let f = resolve(&f);
                            let p = read_bounded(&f, MAX_SECRET_FILE_BYTES)
                                .and_then(|b| {
                                    String::from_utf8(b).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error()))
                                })
                                .map_err(|e| {
                                    invalid(&format!("sources[{i}].password_file"), format!("cannot read {}: {e}", f.display()))
                                })?;
                            Some(p.trim_end_matches(['\n', '\r']).to_string())
                        }
                    };
                    if password.is_some() && username.is_none() {
                        return Err(invalid(&format!("sources[{i}].username"), "a password needs a username".into()));
                    }
                    let kind = StreamKind::Rtsp { url, protocol, latency_ms: latency_ms.0 as u32, username, password };
                    stream_source(
                        i,
                        id.0,
                        kind,
                        RawStream { decoder, max_fps, queue_depth, stall_timeout_ms, reconnect_min_ms, reconnect_max_ms },
                        &invalid,
                    )?
                }
                RawSource::Video {
                    id,
                    path,
                    pacing,
                    decoder,
                    max_fps,
                    queue_depth,
                    stall_timeout_ms,
                    reconnect_min_ms,
                    reconnect_max_ms,
                } => stream_source(
                    i,
                    id.0,
                    StreamKind::Video { path: resolve(&path), pacing },
                    RawStream { decoder, max_fps, queue_depth, stall_timeout_ms, reconnect_min_ms, reconnect_max_ms },
                    &invalid,
                )?,
                RawSource::V4l2 {
                    id,
                    device,
                    width,
                    height,
                    fps,
                    decoder,
                    max_fps,
                    queue_depth,
                    stall_timeout_ms,
                    reconnect_min_ms,
                    reconnect_max_ms,
                } => {
                    if width.is_some() != height.is_some() {
                        return Err(invalid(&format!("sources[{i}].width"), "width and height go together".into()));
                    }
                    let kind = StreamKind::V4l2 {
                        device,
                        width: width.map(|v| v.0 as u32),
                        height: height.map(|v| v.0 as u32),
                        fps: fps.map(|v| v.0 as u32),
                    };
                    stream_source(
                        i,
                        id.0,
                        kind,
                        RawStream { decoder, max_fps, queue_depth, stall_timeout_ms, reconnect_min_ms, reconnect_max_ms },
                        &invalid,
                    )?
                }
                RawSource::Uri { id, uri, decoder, max_fps, queue_depth, stall_timeout_ms, reconnect_min_ms, reconnect_max_ms } => {
                    if !uri.contains("://") || uri.len() > 4096 || uri.chars().any(char::is_whitespace) {
                        return Err(invalid(&format!("sources[{i}].uri"), format!("`{}` is not a URI", strip_userinfo(&uri))));
                    }
                    stream_source(
                        i,
                        id.0,
                        StreamKind::Uri { uri: resolve_uri(&uri, &base) },
                        RawStream { decoder, max_fps, queue_depth, stall_timeout_ms, reconnect_min_ms, reconnect_max_ms },
                        &invalid,
                    )?
                }
            };
            if sources.iter().any(|o: &SourceConfig| o.id() == src.id()) {
                return Err(invalid(&format!("sources[{i}].id"), format!("duplicate source id `{}`", src.id())));
            }
            sources.push(src);
        }
        if sources.is_empty() {
            return Err(invalid("sources", "at least one [[sources]] entry is needed".into()));
        }

        let inject_oom = match raw.debug.inject_oom.filter(|s| !s.is_empty()) {
            None => None,
            Some(s) => Some(crate::backend::oom::OomInjector::parse(&s).map_err(|e| invalid("debug.inject_oom", e.to_string()))?),
        };

        let metrics = match raw.metrics {
            None => None,
            Some(m) => {
                let listen = m.listen.parse::<std::net::SocketAddr>().map_err(|_| {
                    invalid(
                        "metrics.listen",
                        format!("`{}` is not an address and port such as \"127.0.0.1:9464\" or \"[::1]:9464\"", m.listen),
                    )
                })?;
                if listen.port() == 0 {
                    return Err(invalid("metrics.listen", "needs a port (scrapers must know where to find it)".into()));
                }
                Some(MetricsConfig { listen })
            }
        };

        let w = raw.watchdog;
        if w.memory_high.0 <= 0.0 {
            return Err(invalid("watchdog.memory_high", "must be above 0".into()));
        }
        if w.memory_ok.0 >= w.memory_high.0 {
            return Err(invalid(
                "watchdog.memory_ok",
                format!("{} must be below memory_high ({}): the gap keeps the events from flapping", w.memory_ok.0, w.memory_high.0),
            ));
        }
        let watchdog = WatchdogConfig {
            interval: Duration::from_secs_f64(w.interval_s.0),
            high: w.memory_high.0,
            ok: w.memory_ok.0,
            memory_limit: w.memory_limit.map(|b| b.0),
            lower_batch: w.lower_batch,
        };

        Ok(Config {
            path: path.to_path_buf(),
            sha256: Self::content_sha256(text.as_bytes()),
            device,
            model,
            mqtt,
            sources,
            telemetry_interval: Duration::from_secs_f64(raw.telemetry.interval_s.0),
            spool: SpoolConfig { dir: resolve(&raw.spool.dir), max_bytes: raw.spool.max_bytes.0 },
            oom_quiet_period: Duration::from_secs_f64(raw.oom.quiet_period_s.0),
            release_idle: (raw.oom.release_idle_s.0 > 0).then(|| Duration::from_secs(raw.oom.release_idle_s.0)),
            shutdown_grace: Duration::from_secs_f64(raw.shutdown.grace_s.0),
            input: InputLimits {
                max_side: raw.input.max_side.0 as u32,
                max_pixels: raw.input.max_pixels.0,
                max_bytes: raw.input.max_bytes.0,
            },
            tuning,
            inject_oom,
            metrics,
            model_load_delay: raw.debug.model_load_delay_ms.filter(|d| d.0 > 0).map(|d| Duration::from_millis(d.0)),
            infer_delay: raw.debug.infer_delay_ms.filter(|d| d.0 > 0).map(|d| Duration::from_millis(d.0)),
            watchdog,
        })
    }

    /// Whether any source feeds the intake (hot folders, MQTT image topics), not only streams.
    pub fn has_picture_sources(&self) -> bool {
        self.sources.iter().any(|s| !s.is_stream())
    }

    /// The hot-folder sources.
    pub fn folders(&self) -> impl Iterator<Item = &SourceConfig> {
        self.sources.iter().filter(|s| matches!(s, SourceConfig::Folder { .. }))
    }

    /// The MQTT image sources.
    pub fn mqtt_sources(&self) -> impl Iterator<Item = &SourceConfig> {
        self.sources.iter().filter(|s| matches!(s, SourceConfig::Mqtt { .. }))
    }

    /// The stream sources.
    pub fn streams(&self) -> impl Iterator<Item = &StreamConfig> {
        self.sources.iter().filter_map(|s| match s {
            SourceConfig::Stream(c) => Some(c),
            _ => None,
        })
    }

    /// Sections that differ from `new` and cannot change without a restart.
    pub fn restart_required(&self, new: &Config) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.device != new.device {
            v.push("device");
        }
        if self.spool != new.spool {
            v.push("spool");
        }
        if self.mqtt.device_id != new.mqtt.device_id || self.mqtt.prefix != new.mqtt.prefix {
            v.push("mqtt.device_id/prefix");
        }
        if self.input != new.input {
            v.push("input");
        }
        if self.tuning != new.tuning {
            v.push("tuning");
        }
        if self.metrics != new.metrics {
            v.push("metrics");
        }
        if self.inject_oom != new.inject_oom || self.model_load_delay != new.model_load_delay || self.infer_delay != new.infer_delay {
            v.push("debug");
        }
        v
    }
}

/// A `file://` URI with a relative path is resolved against the config's folder.
fn resolve_uri(uri: &str, base: &Path) -> String {
    match uri.strip_prefix("file://") {
        Some(p) if !p.starts_with('/') => format!("file://{}", base.join(p).display()),
        _ => uri.to_string(),
    }
}

/// Validates the settings every stream source has.
fn stream_source(
    i: usize,
    id: String,
    kind: StreamKind,
    s: RawStream,
    invalid: &dyn Fn(&str, String) -> ConfigError,
) -> Result<SourceConfig, ConfigError> {
    if !cfg!(feature = "gstreamer") {
        return Err(invalid(
            &format!("sources[{i}].type"),
            format!(
                "source type `{}` needs a yolo-edge built with the `gstreamer` feature (cargo build --features gstreamer); this build reads folders and MQTT only",
                kind.name()
            ),
        ));
    }
    if let Some(f) = s.max_fps {
        if !(f.is_finite() && f > 0.0 && f <= 1000.0) {
            return Err(invalid(&format!("sources[{i}].max_fps"), format!("{f} must be within 0 (exclusive) and 1000")));
        }
    }
    if s.reconnect_min_ms.0 > s.reconnect_max_ms.0 {
        return Err(invalid(&format!("sources[{i}].reconnect_min_ms"), "is above reconnect_max_ms".into()));
    }
    if matches!(kind, StreamKind::V4l2 { .. }) && s.decoder != DecoderChoice::Auto {
        return Err(invalid(
            &format!("sources[{i}].decoder"),
            "a V4L2 camera's raw or MJPEG frames take no decoder choice; leave it `auto`".into(),
        ));
    }
    Ok(SourceConfig::Stream(StreamConfig {
        id,
        kind,
        decoder: s.decoder,
        max_fps: s.max_fps,
        queue_depth: s.queue_depth.0 as usize,
        stall_timeout: Duration::from_millis(s.stall_timeout_ms.0),
        reconnect_min: Duration::from_millis(s.reconnect_min_ms.0),
        reconnect_max: Duration::from_millis(s.reconnect_max_ms.0),
    }))
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::V311 => "v311",
            Protocol::V5 => "v5",
        })
    }
}

/// 1-based line and column of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let column = before.rfind('\n').map(|i| offset - i).unwrap_or(offset + 1);
    (line, column)
}

/// Best-effort position of a key path such as `mqtt.password_file` or `sources[1].id`.
fn locate(text: &str, key: &str) -> (usize, usize) {
    let parts: Vec<&str> = key.split('.').collect();
    let (table, leaf) = match parts.as_slice() {
        [] => return (1, 1),
        [one] => ("", *one),
        [rest @ .., last] => (rest[0], *last),
    };
    let leaf = leaf.split('[').next().unwrap_or(leaf);
    let table = table.split('[').next().unwrap_or(table);
    let mut in_table = table.is_empty();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let t = line.trim();
        if t.starts_with('[') {
            let name = t.trim_matches(|c| c == '[' || c == ']').trim();
            in_table = name == table || name.starts_with(&format!("{table}."));
            if table.is_empty() && name == leaf {
                return line_col(text, offset + line.find('[').unwrap_or(0));
            }
        } else if in_table && t.split('=').next().is_some_and(|k| k.trim() == leaf) {
            return line_col(text, offset + line.find(leaf).unwrap_or(0));
        }
        offset += line.len();
    }
    (1, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = r#"
[model]
path = "m.pt"
[mqtt]
host = "localhost"
device_id = "box-1"
[spool]
dir = "spool"
[[sources]]
type = "folder"
id = "cam"
path = "/in"
"#;

    fn err(text: &str) -> String {
        Config::parse(text, Path::new("/etc/a.toml")).unwrap_err().to_string()
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Config::parse(MIN, Path::new("/etc/yolo/a.toml")).unwrap();
        assert_eq!(c.mqtt.client_id, "box-1");
        assert_eq!(c.mqtt.topic("status"), "yolo-edge/box-1/status");
        assert_eq!(c.mqtt.port, 1883);
        assert_eq!(c.spool.dir, PathBuf::from("/etc/yolo/spool"));
        assert_eq!(c.model.thresholds, Thresholds { conf: 0.25, iou: 0.7, max_det: 300 });
        assert!(matches!(&c.sources[0], SourceConfig::Folder { done_dir, .. } if done_dir == Path::new("/in/done")));
        assert_eq!(c.release_idle, Some(Duration::from_secs(30)));
        let keep = Config::parse(&format!("{MIN}\n[oom]\nrelease_idle_s = 0\n"), Path::new("/etc/yolo/a.toml")).unwrap();
        assert_eq!(keep.release_idle, None);
        let e = err(&format!("{MIN}\n[oom]\nrelease_idle_s = -1\n"));
        assert!(e.contains("`oom.release_idle_s`") && e.contains("out of range"), "{e}");
    }

    #[test]
    fn files_named_in_the_config_are_bounded_and_regular() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("pw");
        std::fs::write(&secret, vec![b'x'; (MAX_SECRET_FILE_BYTES + 1) as usize]).unwrap();
        let text = MIN.replace(
            "device_id = \"box-1\"",
            &format!("device_id = \"box-1\"\nusername = \"u\"\npassword_file = \"{}\"", secret.display()),
        );
        let e = err(&text);
        assert!(e.contains("`mqtt.password_file`") && e.contains("allowed"), "{e}");
        let e = err(&MIN.replace("device_id = \"box-1\"", "device_id = \"box-1\"\nusername = \"u\"\npassword_file = \"/dev/zero\""));
        assert!(e.contains("not a regular file"), "{e}");
    }

    #[test]
    fn model_sha256_is_64_hex_digits() {
        let ok = Config::parse(
            &MIN.replace("path = \"m.pt\"", &format!("path = \"m.pt\"\nsha256 = \"{}\"", "AB".repeat(32))),
            Path::new("/a.toml"),
        );
        assert_eq!(ok.unwrap().model.sha256, Some("ab".repeat(32)));
        let e = err(&MIN.replace("path = \"m.pt\"", "path = \"m.pt\"\nsha256 = \"abc\""));
        assert!(e.contains("`model.sha256`") && e.contains("64 hex digits"), "{e}");
    }

    #[test]
    fn topic_prefix_is_bounded() {
        let long = "p/".repeat(129) + "p";
        let e = err(&MIN.replace("device_id = \"box-1\"", &format!("device_id = \"box-1\"\nprefix = \"{long}\"")));
        assert!(e.contains("`mqtt.prefix`") && e.contains("256 bytes in all"), "{e}");
    }

    #[test]
    fn tuning_table_is_optional_validated_and_restart_only() {
        let c = Config::parse(MIN, Path::new("/etc/a.toml")).unwrap();
        assert_eq!(c.tuning, Tuning::default());
        let t =
            Config::parse(&format!("{MIN}\n[tuning]\ncuda_graphs = false\ncudnn_workspace_min = \"64MiB\"\n"), Path::new("/etc/a.toml"))
                .unwrap();
        assert!(!t.tuning.cuda_graphs);
        assert_eq!(t.tuning.cudnn_workspace_min.0, 64 << 20);
        assert_eq!(c.restart_required(&t), vec!["tuning"]);
        let e = err(&format!("{MIN}\n[tuning]\ncudnn_algo_slack = 3.0\n"));
        assert!(e.starts_with("/etc/a.toml:15:1: `tuning.cudnn_algo_slack`"), "{e}");
        let e = err(&format!("{MIN}\n[tuning]\ncuda_graph = true\n"));
        assert!(e.contains("/etc/a.toml:15:") && e.contains("tuning") && e.contains("cuda_graph"), "{e}");
        let e = err(&format!("{MIN}\n[tuning]\ncudnn_workspace_min = \"8GB of it\"\n"));
        assert!(e.contains("`tuning.cudnn_workspace_min`") && e.contains("8GB of it"), "{e}");
    }

    #[test]
    fn the_fusion_cache_is_relative_to_the_config_and_its_folder_must_exist() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("agent.toml");
        let c = Config::parse(&format!("{MIN}\n[tuning]\ncudnn_fusion = true\ncudnn_fusion_cache = \"fusion.jsonl\"\n"), &cfg).unwrap();
        assert_eq!(c.tuning.cudnn_fusion_cache.as_deref(), Some(dir.path().join("fusion.jsonl").as_path()));
        let e = Config::parse(&format!("{MIN}\n[tuning]\ncudnn_fusion_cache = \"cache/fusion.jsonl\"\n"), &cfg).unwrap_err().to_string();
        assert!(e.contains("agent.toml:15:") && e.contains("`tuning.cudnn_fusion_cache`") && e.contains("does not exist"), "{e}");
    }

    #[test]
    fn errors_name_file_line_and_key() {
        let e = err(&MIN.replace("[mqtt]\n", "[mqtt]\nhots = 1\n"));
        assert!(e.starts_with("/etc/a.toml:5:1: `mqtt"), "{e}");
        assert!(e.contains("hots"), "{e}");
        let e = err(&MIN.replace("path = \"m.pt\"", "path = \"m.pt\"\nconf = 1.5"));
        assert!(e.contains(":4:") && e.contains("`model.conf`") && e.contains("out of range"), "{e}");
        let e = err(&MIN.replace("[spool]", "[device]\nmax_wait_ms = \"x\"\n[spool]"));
        assert!(e.contains("`device.max_wait_ms`"), "{e}");
        let e = err(&MIN.replace("[spool]", "[device]\nbatch = 64\nmax_batch = 8\n[spool]"));
        assert!(e.contains("`device.batch`") && e.contains(":8:"), "{e}");
        // inside the tagged `[[sources]]` table the path ends at the entry; the message names the field
        let e = err(&MIN.replace("id = \"cam\"", "id = \"a/b\""));
        assert!(e.contains("`sources[0]`") && e.contains("id `a/b`"), "{e}");
    }

    #[test]
    fn the_jpeg_decoder_is_cpu_by_default_and_nvjpeg_needs_a_gpu() {
        let c = Config::parse(MIN, Path::new("/a.toml")).unwrap();
        assert_eq!(c.device.jpeg_decoder, JpegDecoder::Cpu);
        let with =
            |dev: &str, dec: &str| MIN.replace("[spool]", &format!("[device]\ndevice = \"{dev}\"\njpeg_decoder = \"{dec}\"\n[spool]"));
        for (dec, want) in [("cpu", JpegDecoder::Cpu), ("nvjpeg", JpegDecoder::Nvjpeg), ("auto", JpegDecoder::Auto)] {
            let c = Config::parse(&with("cuda:0", dec), Path::new("/a.toml")).unwrap();
            assert_eq!(c.device.jpeg_decoder, want);
        }
        // `auto` on the CPU decodes on the host; `nvjpeg` there is a config error at its line
        assert_eq!(Config::parse(&with("cpu", "auto"), Path::new("/a.toml")).unwrap().device.jpeg_decoder, JpegDecoder::Auto);
        let e = err(&with("cpu", "nvjpeg"));
        assert!(e.starts_with("/etc/a.toml:9:") && e.contains("`device.jpeg_decoder`") && e.contains("CUDA"), "{e}");
        let e = err(&with("cuda:0", "gpu"));
        assert!(e.contains("`device.jpeg_decoder`") && e.contains("gpu"), "{e}");
        // a device section's edit, applied at the next start
        let a = Config::parse(&with("cuda:0", "cpu"), Path::new("/a.toml")).unwrap();
        let b = Config::parse(&with("cuda:0", "nvjpeg"), Path::new("/a.toml")).unwrap();
        assert_eq!(a.restart_required(&b), vec!["device"]);
    }

    #[test]
    fn mqtt_sources_may_be_shared_subscriptions() {
        let src =
            |topic: &str| MIN.replace("type = \"folder\"\nid = \"cam\"\npath = \"/in\"", &format!("type = \"mqtt\"\ntopic = \"{topic}\""));
        let c = Config::parse(&src("$share/workers/cams/+/jpeg"), Path::new("/a.toml")).unwrap();
        assert!(matches!(&c.sources[0], SourceConfig::Mqtt { topic, .. } if topic == "$share/workers/cams/+/jpeg"));
        for bad in ["$share/workers", "$share//cams/#", "$share/w+/cams/#", "$share/workers/", "$share/g/cams/#/x"] {
            let e = err(&src(bad));
            assert!(e.contains("`sources[0].topic`") && e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn metrics_table_is_optional_validated_and_restart_only() {
        let c = Config::parse(MIN, Path::new("/etc/a.toml")).unwrap();
        assert_eq!(c.metrics, None);
        let m = Config::parse(&format!("{MIN}\n[metrics]\nlisten = \"127.0.0.1:9464\"\n"), Path::new("/etc/a.toml")).unwrap();
        assert_eq!(m.metrics, Some(MetricsConfig { listen: "127.0.0.1:9464".parse().unwrap() }));
        assert_eq!(c.restart_required(&m), vec!["metrics"]);
        let v6 = Config::parse(&format!("{MIN}\n[metrics]\nlisten = \"[::]:9464\"\n"), Path::new("/etc/a.toml")).unwrap();
        assert_eq!(v6.metrics.unwrap().listen.port(), 9464);
        let e = err(&format!("{MIN}\n[metrics]\nlisten = \"localhost\"\n"));
        assert!(e.starts_with("/etc/a.toml:15:1: `metrics.listen`") && e.contains("`localhost` is not an address"), "{e}");
        let e = err(&format!("{MIN}\n[metrics]\nlisten = \"127.0.0.1:0\"\n"));
        assert!(e.contains("`metrics.listen`") && e.contains("needs a port"), "{e}");
        let e = err(&format!("{MIN}\n[metrics]\nlisten = \"127.0.0.1:9464\"\nport = 1\n"));
        assert!(e.contains("/etc/a.toml:16:") && e.contains("metrics") && e.contains("port"), "{e}");
        let e = err(&format!("{MIN}\n[metrics]\n"));
        assert!(e.contains("metrics") && e.contains("listen"), "{e}");
        let d = Config::parse(&format!("{MIN}\n[debug]\nmodel_load_delay_ms = 1500\n"), Path::new("/etc/a.toml")).unwrap();
        assert_eq!(d.model_load_delay, Some(Duration::from_millis(1500)));
        assert_eq!(c.restart_required(&d), vec!["debug"]);
    }

    fn stream(body: &str) -> String {
        MIN.replace("type = \"folder\"\nid = \"cam\"\npath = \"/in\"", body)
    }

    #[test]
    fn stream_sources_are_validated_or_need_the_feature() {
        let rtsp = stream("type = \"rtsp\"\nid = \"door\"\nurl = \"rtsp://10.0.0.5:554/stream1\"\nprotocol = \"udp\"\nmax_fps = 5.0");
        if !cfg!(feature = "gstreamer") {
            let e = err(&rtsp);
            assert!(e.starts_with("/etc/a.toml:10:1: `sources[0].type`") && e.contains("`gstreamer` feature"), "{e}");
            return;
        }
        let c = Config::parse(&rtsp, Path::new("/etc/a.toml")).unwrap();
        let s = c.streams().next().unwrap();
        assert_eq!(s.id, "door");
        assert_eq!((s.queue_depth, s.stall_timeout, s.decoder, s.max_fps), (1, Duration::from_secs(5), DecoderChoice::Auto, Some(5.0)));
        assert!(matches!(&s.kind, StreamKind::Rtsp { protocol: RtspProtocol::Udp, latency_ms: 200, password: None, .. }));
        let v = Config::parse(
            &stream("type = \"video\"\nid = \"clip\"\npath = \"clip.mp4\"\npacing = \"fast\"\ndecoder = \"cpu\""),
            Path::new("/etc/y/a.toml"),
        )
        .unwrap();
        assert!(
            matches!(&v.sources[0], SourceConfig::Stream(StreamConfig { kind: StreamKind::Video { path, pacing: Pacing::Fast }, decoder: DecoderChoice::Cpu, .. }) if path == Path::new("/etc/y/clip.mp4"))
        );
        let u = Config::parse(&stream("type = \"uri\"\nid = \"u\"\nuri = \"file://c.mkv\""), Path::new("/etc/y/a.toml")).unwrap();
        assert!(
            matches!(&u.sources[0], SourceConfig::Stream(StreamConfig { kind: StreamKind::Uri { uri }, .. }) if uri == "file:///etc/y/c.mkv")
        );
        Config::parse(
            &stream("type = \"v4l2\"\nid = \"usb\"\ndevice = \"/dev/video0\"\nwidth = 640\nheight = 480\nfps = 30"),
            Path::new("/a.toml"),
        )
        .unwrap();
        for (body, key, why) in [
            ("type = \"rtsp\"\nid = \"d\"\nurl = \"http://x/y\"", "sources[0].url", "not an rtsp://"),
            ("type = \"rtsp\"\nid = \"d\"\nurl = \"rtsp://u:pw@x/y\"", "sources[0].url", "credentials"),
            ("type = \"rtsp\"\nid = \"d\"\nurl = \"rtsp://x/y\"\ndecoder = \"gpu\"", "sources[0]", "gpu"),
            ("type = \"rtsp\"\nid = \"d\"\nurl = \"rtsp://x/y\"\nmax_fps = 0.0", "sources[0].max_fps", "within"),
            ("type = \"rtsp\"\nid = \"d\"\nurl = \"rtsp://x/y\"\nqueue_depth = 0", "sources[0]", "out of range"),
            (
                "type = \"rtsp\"\nid = \"d\"\nurl = \"rtsp://x/y\"\npassword_file = \"/dev/zero\"",
                "sources[0].password_file",
                "not a regular file",
            ),
            ("type = \"rtsp\"\nid = \"d\"\nurl = \"rtsp://x/y\"\nlatncy_ms = 5", "sources[0]", "latncy_ms"),
            ("type = \"v4l2\"\nid = \"d\"\ndevice = \"/dev/video0\"\nwidth = 640", "sources[0].width", "together"),
            ("type = \"v4l2\"\nid = \"d\"\ndevice = \"/dev/video0\"\ndecoder = \"nvdec\"", "sources[0].decoder", "no decoder choice"),
            (
                "type = \"video\"\nid = \"d\"\npath = \"c.mp4\"\nreconnect_min_ms = 9000\nreconnect_max_ms = 1000",
                "sources[0].reconnect_min_ms",
                "above",
            ),
        ] {
            let e = err(&stream(body));
            assert!(e.contains(&format!("`{key}")) && e.contains(why), "{body}: {e}");
        }
        // every kind of source changes live
        let two = Config::parse(&format!("{MIN}[[sources]]\ntype = \"rtsp\"\nid = \"door\"\nurl = \"rtsp://x/y\"\n"), Path::new("/a.toml"))
            .unwrap();
        let three =
            Config::parse(&format!("{MIN}[[sources]]\ntype = \"rtsp\"\nid = \"gate\"\nurl = \"rtsp://x/z\"\n"), Path::new("/a.toml"))
                .unwrap();
        assert!(two.restart_required(&three).is_empty());
        let moved = Config::parse(
            &format!("{}[[sources]]\ntype = \"rtsp\"\nid = \"door\"\nurl = \"rtsp://x/y\"\n", MIN.replace("/in", "/in2")),
            Path::new("/a.toml"),
        )
        .unwrap();
        assert!(two.restart_required(&moved).is_empty());
        assert_eq!(strip_userinfo("rtsp://admin:secret@cam.local:554/s?a=b@c"), "rtsp://cam.local:554/s?a=b@c");
    }

    #[test]
    fn watchdog_defaults_validation_and_live_edits() {
        let c = Config::parse(MIN, Path::new("/etc/a.toml")).unwrap();
        assert_eq!(
            c.watchdog,
            WatchdogConfig { interval: Duration::from_secs(2), high: 0.9, ok: 0.8, memory_limit: None, lower_batch: true }
        );
        let w = Config::parse(
            &format!(
                "{MIN}\n[watchdog]\ninterval_s = 0.5\nmemory_high = 0.7\nmemory_ok = 0.6\nmemory_limit = \"1.5GiB\"\nlower_batch = false\n"
            ),
            Path::new("/etc/a.toml"),
        )
        .unwrap();
        assert_eq!(
            w.watchdog,
            WatchdogConfig { interval: Duration::from_millis(500), high: 0.7, ok: 0.6, memory_limit: Some(3 << 29), lower_batch: false }
        );
        // applied live: no restart
        assert!(c.restart_required(&w).is_empty());
        let e = err(&format!("{MIN}\n[watchdog]\nmemory_high = 0.8\nmemory_ok = 0.8\n"));
        assert!(e.starts_with("/etc/a.toml:16:1: `watchdog.memory_ok`") && e.contains("must be below memory_high"), "{e}");
        let e = err(&format!("{MIN}\n[watchdog]\nmemory_high = 1.2\n"));
        assert!(e.starts_with("/etc/a.toml:15:") && e.contains("watchdog.memory_high") && e.contains("out of range"), "{e}");
        let e = err(&format!("{MIN}\n[watchdog]\nmemory_high = 0.0\nmemory_ok = 0.0\n"));
        assert!(e.contains("`watchdog.memory_high`") && e.contains("above 0"), "{e}");
        let e = err(&format!("{MIN}\n[watchdog]\nmemory_limit = 0\n"));
        assert!(e.starts_with("/etc/a.toml:15:") && e.contains("watchdog.memory_limit"), "{e}");
        let e = err(&format!("{MIN}\n[watchdog]\ninterval_s = -1\n"));
        assert!(e.contains("watchdog.interval_s"), "{e}");
        let e = err(&format!("{MIN}\n[watchdog]\nmemory_hi = 0.5\n"));
        assert!(e.contains("/etc/a.toml:15:") && e.contains("memory_hi"), "{e}");
    }

    #[test]
    fn shipped_configs_are_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
        // the secrets they name live on the box; stand-ins here
        let secrets = std::env::temp_dir().join(format!("yolo-edge-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&secrets).unwrap();
        std::fs::write(secrets.join("mqtt-password"), "pw\n").unwrap();
        std::fs::write(secrets.join("ca.pem"), "-----BEGIN CERTIFICATE-----\n").unwrap();
        std::fs::write(secrets.join("gate-camera-password"), "pw\n").unwrap();
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                let text = std::fs::read_to_string(&p).unwrap().replace("/etc/yolo-edge/", &format!("{}/", secrets.display()));
                if !cfg!(feature = "gstreamer") && text.contains("type = \"rtsp\"") {
                    // camera configs need the feature (stream_sources_are_validated_or_need_the_feature)
                    continue;
                }
                Config::parse(&text, &p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                n += 1;
            }
        }
        let _ = std::fs::remove_dir_all(&secrets);
        assert!(n >= 3, "configs/ holds the example configs");
    }
}
