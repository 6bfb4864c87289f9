//! The edge agent (`yolo-edge run`): wires config, model, pipeline, sources, publisher,
//! telemetry, the metrics listener and config field updates together, and runs the lifecycle:
//! until SIGTERM/SIGINT ([`run`]) or until a caller's shutdown future completes
//! ([`run_with_shutdown`]).

pub mod config;
pub mod events;
pub mod fleet;
pub mod frames;
pub mod http;
pub mod messages;
pub mod metrics;
pub mod mqtt;
pub mod pipeline;
pub mod publisher;
mod reload;
pub mod sources;
pub mod spool;
pub mod telemetry;
pub mod watchdog;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use candle_core::{DType, Device};
use tokio::sync::{mpsc, watch};

use crate::agent::config::{BatchSpec, Config, ConfigError};
use crate::agent::events::EventSink;
use crate::agent::pipeline::{ModelMeta, Pipeline, Wiring};
use crate::agent::sources::{folder, mqtt as mqtt_source};
use crate::agent::spool::{Spool, SpoolError};
use crate::agent::telemetry::{DeviceMemorySource, MemorySource, Stats};
use crate::backend::devmem::{self, PeakMeter};
use crate::detector::warmup::{self as startup, StartupTimes};
use crate::detector::{Detector, JpegDecoder, JpegSetup};
use crate::planner::{self, Budget, DetectorProber, Plan, PlanError, PlannerConfig, MIB};
use messages::{BatchPlan, ModelInfo, PlanReport};
use publisher::PublisherParts;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Device(#[from] crate::backend::device::DeviceError),
    #[error(transparent)]
    Tuning(#[from] crate::backend::tuning::TuningError),
    #[error("cannot load model {path}: {source}")]
    Model { path: PathBuf, source: crate::model::ModelError },
    #[error("cannot read model {path}: {source}")]
    ModelRead { path: PathBuf, source: std::io::Error },
    #[error("model {path} has sha256 {got}, the config says {want}: not loaded (a partial copy or another file)")]
    ModelDigest { path: PathBuf, want: String, got: String },
    #[error(transparent)]
    Spool(#[from] SpoolError),
    #[error("cannot plan the batch size: {0}")]
    Plan(#[from] PlanError),
    #[error("first forward pass failed: {0}")]
    Warmup(candle_core::Error),
    #[error("device.jpeg_decoder = \"nvjpeg\": {0}")]
    JpegDecoder(String),
    #[error("cannot listen on {addr} (metrics.listen): {source}")]
    MetricsListen { addr: std::net::SocketAddr, source: std::io::Error },
    #[error("cannot start the agent: {0}")]
    Io(#[from] std::io::Error),
}

/// A fresh id for this boot of the agent (consumers reset `seq` expectations on change).
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid").map(|s| s.trim().to_string()).unwrap_or_else(|_| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        format!("{:x}-{:x}", t.as_nanos(), std::process::id())
    })
}

/// The batch the agent starts with, why, and the planner's decision when it ran.
#[derive(Debug, Clone)]
pub struct BatchDecision {
    pub batch: usize,
    pub reason: String,
    pub plan: Option<Plan>,
}

fn planner_config(cfg: &Config) -> PlannerConfig {
    PlannerConfig {
        memory_limit: cfg.device.memory_limit,
        memory_fraction: cfg.device.memory_fraction,
        max_batch: cfg.device.max_batch,
        probe_batches: [1, 2, 4].into_iter().filter(|&b| b <= cfg.device.max_batch).collect(),
        rungs: false,
    }
}

/// Decides the startup batch: fixed by config, or (`batch = "auto"`) planned from the device's
/// memory with the loaded model: probe, fit, choose, verify (see [`crate::planner`]).
pub fn startup_batch(cfg: &Config, det: &Detector) -> Result<BatchDecision, AgentError> {
    if let BatchSpec::Fixed(b) = cfg.device.batch {
        return Ok(BatchDecision { batch: b, reason: format!("fixed by config (batch = {b})"), plan: None });
    }
    // partial batches run padded up to the rungs of a ladder of graphs where passes replay them
    let pc = PlannerConfig { rungs: det.replays_graphs(), ..planner_config(cfg) };
    let meter = PeakMeter::new(det.device());
    // the budget is what is free with the model loaded (and cached pool memory given back)
    meter.trim().map_err(PlanError::from)?;
    let budget = Budget::new(devmem::device_memory(det.device()).map_err(PlanError::from)?, &pc);
    let decision = match planner::plan(&mut DetectorProber::new(det), budget, &pc) {
        Ok(plan) => BatchDecision {
            batch: plan.batch,
            reason: format!(
                "planned: batch {} of max {}; predicted peak {:.1} MiB, verified {:.1} MiB, budget {:.1} MiB",
                plan.batch,
                plan.max_batch,
                plan.predicted_peak as f64 / MIB,
                plan.verified_peak as f64 / MIB,
                plan.budget.bytes as f64 / MIB
            ),
            plan: Some(plan),
        },
        // the device is short of memory right now: start small, the OOM fallback guards the rest
        Err(e @ PlanError::NothingFits(_)) => {
            tracing::warn!(error = %e, "no batch fits the memory budget; starting at batch 1");
            BatchDecision { batch: 1, reason: format!("planner: {e}; starting at batch 1"), plan: None }
        }
        Err(e) => return Err(e.into()),
    };
    // what telemetry's high-water mark reports is the running agent, not the probes
    let _ = meter.trim();
    let _ = meter.reset();
    Ok(decision)
}

fn load_detector(cfg: &Config, device: &Device, dtype: DType) -> Result<Detector, AgentError> {
    if let Some(d) = cfg.model_load_delay {
        std::thread::sleep(d);
    }
    if let Some(want) = &cfg.model.sha256 {
        let path = cfg.model.path.clone();
        let got = crate::files::sha256_bounded(&path, crate::weights::MAX_MODEL_FILE_BYTES)
            .map_err(|source| AgentError::ModelRead { path: path.clone(), source })?;
        if &got != want {
            return Err(AgentError::ModelDigest { path, want: want.clone(), got });
        }
    }
    let det = Detector::load(&cfg.model.path, device, dtype, Some(cfg.device.imgsz))
        .map_err(|source| AgentError::Model { path: cfg.model.path.clone(), source })?;
    setup_jpeg_decoder(&det, cfg.device.jpeg_decoder)?;
    Ok(det)
}

/// Sets `det` up for `[device] jpeg_decoder` (one device decoder: the inference thread decodes).
fn setup_jpeg_decoder(det: &Detector, choice: JpegDecoder) -> Result<(), AgentError> {
    match det.set_jpeg_decoder(choice, 1).map_err(AgentError::JpegDecoder)? {
        JpegSetup::Host => {}
        JpegSetup::Device { backend } => tracing::info!(backend, "JPEG pictures decoded by nvJPEG and letterboxed on the device"),
        JpegSetup::HostInstead { why } => tracing::warn!(reason = %why, "nvJPEG is not available; JPEG pictures are decoded on the host"),
    }
    Ok(())
}

/// Runs the agent until SIGTERM/SIGINT; returns once everything is drained and `offline` sent.
pub fn run(config_path: &Path) -> Result<(), AgentError> {
    run_with_shutdown(config_path, wait_for_signal())
}

/// Runs the agent until `shutdown` completes (polled on the agent's runtime), then drains as on
/// SIGTERM: intake stopped, in-flight pictures finished and delivered or spooled, `offline` sent.
pub fn run_with_shutdown(config_path: &Path, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
    let cfg = Arc::new(Config::load(config_path)?);
    crate::backend::tuning::install(cfg.tuning.clone())?;
    // before the CUDA context exists: the driver reads the JIT cache location at init
    let compute_cache = crate::env::configure_compute_cache();
    let device = crate::backend::device::parse_device(&cfg.device.device)?;
    let dtype = crate::backend::device::parse_dtype(&cfg.device.dtype, &device)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().thread_name("agent-io").build()?;
    let stats = Arc::new(Stats::default());
    // the listener answers while the model loads: alive, not ready
    let exporter = match &cfg.metrics {
        Some(m) => {
            let listener = std::net::TcpListener::bind(m.listen)
                .and_then(|l| l.set_nonblocking(true).map(|_| l))
                .map_err(|source| AgentError::MetricsListen { addr: m.listen, source })?;
            let dev_name = crate::backend::device::device_name(&device);
            let exporter = Arc::new(metrics::Exporter::new(stats.clone(), &dev_name, crate::backend::device::dtype_name(dtype)));
            let _guard = rt.enter();
            let listener =
                tokio::net::TcpListener::from_std(listener).map_err(|source| AgentError::MetricsListen { addr: m.listen, source })?;
            rt.spawn(http::serve(listener, exporter.clone()));
            tracing::info!(listen = %m.listen, "serving /metrics, /healthz and /readyz");
            Some(exporter)
        }
        None => None,
    };
    if device.is_cuda() {
        // the activation arena, made by the first pass, reserves no more address space than the
        // budget (before the model loads: an upper bound of the plan's budget)
        if let Ok(mem) = devmem::device_memory(&device) {
            crate::backend::arena::cap_reservation(Budget::new(mem, &planner_config(&cfg)).bytes);
        }
    }
    let t0 = std::time::Instant::now();
    let detector = load_detector(&cfg, &device, dtype)?;
    let warm: Option<StartupTimes> = if device.is_cuda() {
        // kernels compiled (or loaded from the cache) now, not on the first frame
        let st = startup::warm_up(&detector, t0.elapsed().as_secs_f64() * 1e3).map_err(AgentError::Warmup)?;
        tracing::info!(load_ms = st.load_ms, first_forward_ms = st.first_forward_ms, second_forward_ms = st.second_forward_ms, compute_cache = ?compute_cache, "model warm");
        Some(st)
    } else {
        None
    };
    // the plan measures the passes as the agent runs them: on CUDA, replayed graphs
    detector.use_graphs(true);
    let decision = startup_batch(&cfg, &detector)?;
    if let Some(p) = &decision.plan {
        for r in &p.reasons {
            tracing::info!(reason = %r, "batch plan");
        }
    }
    let (batch, batch_reason) = (decision.batch, decision.reason.clone());
    let spool = Spool::open(&cfg.spool.dir, cfg.spool.max_bytes)?;
    if !spool.is_empty() {
        tracing::info!(entries = spool.len(), "spool holds messages from a previous run; replaying after connect");
    }
    tracing::info!(model = %cfg.model.path.display(), device = %crate::backend::device::device_name(&device), dtype = crate::backend::device::dtype_name(dtype), batch, reason = %batch_reason, "agent starting");

    rt.block_on(run_async(Started { cfg, device, dtype, detector, decision, warm, spool, stats, exporter }, shutdown))
}

/// What `run_with_shutdown` prepared before the runtime takes over.
struct Started {
    cfg: Arc<Config>,
    device: Device,
    dtype: DType,
    detector: Detector,
    decision: BatchDecision,
    warm: Option<StartupTimes>,
    spool: Spool,
    stats: Arc<Stats>,
    exporter: Option<Arc<metrics::Exporter>>,
}

async fn run_async(started: Started, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
    let Started { cfg, device, dtype, detector, decision, warm, spool, stats, exporter } = started;
    let (batch, batch_reason) = (decision.batch, decision.reason.clone());
    if let Some(p) = &decision.plan {
        stats.plan_predicted_peak.store(p.predicted_peak, Relaxed);
        stats.plan_verified_peak.store(p.verified_peak, Relaxed);
        stats.plan_budget.store(p.budget.bytes, Relaxed);
        // on CUDA the pool's reservation above what it holds now (the model; the plan trimmed
        // the rest) is watched against the budget (on the CPU the resident set also holds decode
        // buffers and queues, which the plan does not cover)
        if device.is_cuda() {
            let _ = stats.budget_watch.set(PeakMeter::new(&device).usage().map(|u| u.reserved).unwrap_or(0));
        }
    }
    let boot = boot_id();
    let (events, events_rx) = EventSink::new(1024, stats.clone());
    let (cfg_tx, cfg_rx) = watch::channel(cfg.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let depth = (cfg.device.max_batch * 2).max(8);
    let (intake_tx, intake_rx) = mpsc::channel(depth);
    let (results_tx, results_rx) = mpsc::channel(depth + 8);
    let (images_tx, images_rx) = mpsc::channel(64);

    let hub = frames::FrameHub::new();
    let wiring = Wiring {
        cfg: cfg_rx.clone(),
        intake: intake_rx,
        hub: hub.clone(),
        results: results_tx,
        events: events.clone(),
        stats: stats.clone(),
    };
    let pipeline = Pipeline::start(detector, batch, decision.plan.clone(), wiring)?;
    let model_meta = pipeline.model.clone();
    let control = pipeline.control.clone();

    let memory: Arc<dyn MemorySource> = Arc::new(DeviceMemorySource::new(&device));
    if let Some(e) = &exporter {
        e.attach(metrics::Context {
            memory: memory.clone(),
            model: model_meta.clone(),
            max_batch: cfg.device.max_batch as u64,
            spool_max_bytes: cfg.spool.max_bytes,
        });
    }
    // loaded, warmed (CUDA) and planned: the pipeline runs it
    stats.model_ready.store(true, Relaxed);
    let info = {
        let model_meta = model_meta.clone();
        let cfg_rx = cfg_rx.clone();
        let stats = stats.clone();
        let boot = boot.clone();
        let dev_name = crate::backend::device::device_name(&device);
        let started = publisher::now_ts();
        let plan = decision.plan.as_ref().map(PlanReport::from);
        let warm = warm.as_ref().map(messages::StartupTimes::from);
        Box::new(move || {
            let c = cfg_rx.borrow().clone();
            let m: ModelMeta = model_meta.read().map(|m| m.clone()).unwrap_or_else(|e| e.into_inner().clone());
            messages::Info {
                v: messages::VERSION,
                device_id: c.mqtt.device_id.clone(),
                boot_id: boot.clone(),
                version: env!("CARGO_PKG_VERSION").to_string(),
                started: started.clone(),
                model: ModelInfo { variant: m.variant, classes: m.names, nc: m.nc, sha256: m.sha256, path: m.path, label: m.label },
                device: dev_name.clone(),
                dtype: crate::backend::device::dtype_name(dtype).to_string(),
                imgsz: c.device.imgsz,
                batch_plan: BatchPlan {
                    startup: stats.batch_startup.load(Relaxed),
                    current: stats.batch_current.load(Relaxed),
                    max_batch: c.device.max_batch,
                    reason: batch_reason.clone(),
                    memory_fraction: c.device.memory_fraction,
                    memory_limit: c.device.memory_limit,
                    plan: plan.clone(),
                },
                startup: warm.clone(),
                config_sha256: c.sha256.clone(),
                sources: c.sources.iter().map(|s| s.id().to_string()).collect(),
                protocol: c.mqtt.protocol.into(),
                streams: c
                    .streams()
                    .map(|s| messages::StreamInfo {
                        id: s.id.clone(),
                        kind: s.kind.name().to_string(),
                        decoder_requested: s.decoder.name().to_string(),
                        decoder: stats.stream(&s.id).and_then(|x| x.decoder()),
                    })
                    .collect(),
            }
        })
    };

    // sources, each kind followed through config edits by its manager
    let source_tasks = [
        tokio::spawn(folder::manage(cfg_rx.clone(), intake_tx.clone(), stop_rx.clone(), events.clone())),
        tokio::spawn(mqtt_source::run(cfg_rx.clone(), images_rx, intake_tx.clone(), stop_rx.clone(), events.clone(), stats.clone())),
        #[cfg(feature = "gstreamer")]
        tokio::spawn(sources::camera::manage(cfg_rx.clone(), hub.clone(), events.clone(), stats.clone(), stop_rx.clone())),
    ];
    drop(intake_tx);

    let publisher_task = tokio::spawn(publisher::run(PublisherParts {
        cfg: cfg_rx.clone(),
        results: results_rx,
        events_rx,
        events: events.clone(),
        stats: stats.clone(),
        spool,
        boot_id: boot.clone(),
        info,
        memory,
        images: images_tx,
        shutdown: stop_rx.clone(),
    }));

    let reload_task =
        tokio::spawn(reload::watch_config(cfg_tx, control, device.clone(), dtype, events.clone(), stats.clone(), stop_rx.clone()));

    shutdown.await;
    stats.shutting_down.store(true, Relaxed);
    let grace = cfg_rx.borrow().shutdown_grace;
    tracing::info!(grace_s = grace.as_secs_f64(), "shutting down: intake stopped, draining");
    let _ = stop_tx.send(true);
    for t in source_tasks {
        let _ = t.await;
    }
    // stream frames still waiting are live pictures of the past: dropped, not drained
    hub.close();
    // the pipeline ends when the intake is drained; the publisher after the last outcome
    let drained = tokio::time::timeout(grace + Duration::from_secs(5), publisher_task).await;
    if drained.is_err() {
        tracing::error!("publisher did not finish within the grace period");
    }
    reload_task.abort();
    let joined = tokio::time::timeout(Duration::from_secs(2), tokio::task::spawn_blocking(move || pipeline.join())).await;
    if joined.is_err() {
        tracing::warn!("pipeline threads still busy at exit");
    }
    tracing::info!(frames_ok = stats.frames_ok.load(Relaxed), frames_failed = stats.frames_failed.load(Relaxed), "agent stopped");
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM"),
                _ = int.recv() => tracing::info!("SIGINT"),
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
