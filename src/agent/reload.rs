//! Config field updates while the agent runs: the config file is watched, a valid edit is
//! applied live (`config_applied`), an invalid one is rejected once with an event
//! (`config_rejected`) and the running config stays.
//!
//! A new model is loaded on a thread of its own ([`load_model`]): a large stack, a deadline
//! (`[model] load_timeout_s`), panics caught, and no hold on the runtime, so a hostile or stuck
//! file can neither take the agent down nor delay its shutdown. A rejected edit is judged again
//! only when its content changes: the config's by its sha256 (the watcher's own reads of the
//! file wake it too), the model file's by its sha256 after its size, time or inode changed, so
//! a partial copy that is later completed is loaded then. Uses the agent's config, events,
//! pipeline and telemetry, and the detector.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use candle_core::{DType, Device};
use notify::Watcher;
use tokio::sync::{mpsc, watch};

use super::config::{self, Config};
use super::events::EventSink;
use super::messages::EventBody;
use super::pipeline::Control;
use super::telemetry::Stats;
use crate::detector::Detector;

/// Stack of the model-load thread. The loaders are iterative and depth-bounded; this is margin
/// (address space, touched only as used).
const LOAD_STACK_BYTES: usize = 64 << 20;

/// How often a rejected model's file is looked at for a change.
const MODEL_POLL: Duration = Duration::from_secs(1);

/// What became of a model load.
enum LoadOutcome {
    Loaded(Box<Detector>),
    Failed(String),
    /// Shutdown began while loading; the load is abandoned.
    Stopped,
}

/// Loads the model `cfg` names on a thread of its own and waits for it, at most
/// `cfg.model.load_timeout` and no longer than until `stop` fires. A load that times out is
/// abandoned, not killed: its thread ends on its own (the loaders are bounded) and drops what
/// it made; `busy` stays set until then, and no second load starts meanwhile.
async fn load_model(cfg: Config, device: Device, dtype: DType, busy: &Arc<AtomicBool>, stop: &mut watch::Receiver<bool>) -> LoadOutcome {
    let timeout = cfg.model.load_timeout;
    // an abandoned load still running is waited for, within this load's own deadline
    let waited = tokio::time::Instant::now();
    while busy.swap(true, Ordering::AcqRel) {
        if waited.elapsed() >= timeout {
            return LoadOutcome::Failed("an earlier model load, abandoned after its timeout, is still running".into());
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            _ = stop.changed() => return LoadOutcome::Stopped,
        }
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let done = busy.clone();
    let spawned = std::thread::Builder::new().name("model-load".into()).stack_size(LOAD_STACK_BYTES).spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| super::load_detector(&cfg, &device, dtype)));
        let out = match r {
            Ok(Ok(det)) => Ok(det),
            Ok(Err(e)) => Err(e.to_string()),
            Err(p) => Err(format!("the model loader panicked: {}", panic_message(p.as_ref()))),
        };
        // a receiver gone (timeout, shutdown) drops the detector here
        let _ = tx.send(out);
        done.store(false, Ordering::Release);
    });
    if let Err(e) = spawned {
        busy.store(false, Ordering::Release);
        return LoadOutcome::Failed(format!("cannot start the model-load thread: {e}"));
    }
    tokio::select! {
        r = rx => match r {
            Ok(Ok(det)) => LoadOutcome::Loaded(Box::new(det)),
            Ok(Err(e)) => LoadOutcome::Failed(e),
            Err(_) => LoadOutcome::Failed("the model loader ended without a result".into()),
        },
        _ = tokio::time::sleep(timeout.saturating_sub(waited.elapsed())) => LoadOutcome::Failed(format!(
            "model load did not finish within model.load_timeout_s = {} s; abandoned", timeout.as_secs_f64()
        )),
        _ = stop.changed() => LoadOutcome::Stopped,
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_else(|| "(no message)".into())
}

/// A model file as it was when an edit naming it was rejected.
#[derive(Debug)]
struct ModelStamp {
    path: PathBuf,
    /// Length, modification time and inode; `None` when the file could not be looked at.
    meta: Option<(u64, Option<SystemTime>, u64)>,
    /// Content digest; `None` when the file could not be read.
    digest: Option<String>,
}

impl ModelStamp {
    async fn of(path: &Path) -> Self {
        let mut s = ModelStamp { path: path.to_path_buf(), meta: stat(path), digest: None };
        s.digest = digest(path).await;
        s
    }

    /// Whether the file's content differs from the stamp's (looked at only when its size, time
    /// or inode changed); the stamp follows the file.
    async fn changed(&mut self) -> bool {
        let meta = stat(&self.path);
        if meta == self.meta {
            return false;
        }
        self.meta = meta;
        let d = digest(&self.path).await;
        if d == self.digest {
            return false;
        }
        self.digest = d;
        true
    }
}

fn stat(path: &Path) -> Option<(u64, Option<SystemTime>, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.len(), m.modified().ok(), m.ino()))
}

async fn digest(path: &Path) -> Option<String> {
    let p = path.to_path_buf();
    tokio::task::spawn_blocking(move || crate::files::sha256_bounded(&p, crate::weights::MAX_MODEL_FILE_BYTES).ok()).await.ok().flatten()
}

/// The edit last rejected: the config content, and the model file when the model was why.
struct Rejected {
    config_sha256: String,
    model: Option<ModelStamp>,
}

/// Watches the config file; applies valid changes live, rejects invalid ones with an event.
pub(super) async fn watch_config(
    cfg_tx: watch::Sender<Arc<Config>>,
    control: std::sync::mpsc::SyncSender<Control>,
    device: Device,
    dtype: DType,
    events: EventSink,
    stats: Arc<Stats>,
    mut stop: watch::Receiver<bool>,
) {
    let path = cfg_tx.borrow().path.clone();
    let dir = path.parent().map(Path::to_path_buf).filter(|p| !p.as_os_str().is_empty()).unwrap_or_else(|| PathBuf::from("."));
    let name = path.file_name().map(|n| n.to_os_string());
    let (tx, mut rx) = mpsc::channel::<()>(1);
    let watcher = notify::recommended_watcher(move |r: notify::Result<notify::Event>| {
        if let Ok(ev) = r {
            if ev.paths.iter().any(|p| p.file_name().map(|n| n.to_os_string()) == name) {
                let _ = tx.try_send(());
            }
        }
    })
    .and_then(|mut w| w.watch(&dir, notify::RecursiveMode::NonRecursive).map(|_| w));
    let _watcher = match watcher {
        Ok(w) => w,
        Err(e) => {
            tracing::error!("cannot watch {}: {e}; config field updates disabled", path.display());
            return;
        }
    };
    let busy = Arc::new(AtomicBool::new(false));
    let mut rejected: Option<Rejected> = None;
    let reject = |error: String, running_sha256: String| {
        stats.config_rejected.fetch_add(1, Relaxed);
        events.emit(EventBody::ConfigRejected { path: path.to_string_lossy().into_owned(), error, running_sha256 });
    };
    let mut poll = tokio::time::interval(MODEL_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            r = rx.recv() => {
                if r.is_none() {
                    return;
                }
                // editors write in several steps: let the file settle
                tokio::time::sleep(Duration::from_millis(150)).await;
                while rx.try_recv().is_ok() {}
            }
            _ = stop.changed() => return,
            _ = poll.tick() => {
                let Some(stamp) = rejected.as_mut().and_then(|r| r.model.as_mut()) else { continue };
                if !stamp.changed().await {
                    continue;
                }
                tracing::info!(model = %stamp.path.display(), "the rejected model file changed; judging the config again");
                rejected = None;
            }
        }
        let old = cfg_tx.borrow().clone();
        let text = match config::read_bounded(&path, config::MAX_CONFIG_BYTES) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!("config file unreadable ({e}); keeping the running config");
                continue;
            }
        };
        let sha = Config::content_sha256(&text);
        if sha == old.sha256 || rejected.as_ref().is_some_and(|r| r.config_sha256 == sha) {
            continue;
        }
        let new =
            match std::str::from_utf8(&text).map_err(|e| e.to_string()).and_then(|t| Config::parse(t, &path).map_err(|e| e.to_string())) {
                Ok(c) => c,
                Err(e) => {
                    rejected = Some(Rejected { config_sha256: sha, model: None });
                    reject(e, old.sha256.clone());
                    continue;
                }
            };
        let restart = old.restart_required(&new);
        let mut applied = new.clone();
        applied.device = old.device.clone();
        // sources follow the edit: the folder, MQTT and stream managers start, stop and restart
        // the ones that changed
        applied.spool = old.spool.clone();
        applied.input = old.input;
        applied.inject_oom = old.inject_oom;
        applied.mqtt.device_id = old.mqtt.device_id.clone();
        applied.mqtt.prefix = old.mqtt.prefix.clone();
        applied.model_load_delay = old.model_load_delay;
        applied.infer_delay = old.infer_delay;
        applied.metrics = old.metrics.clone();
        if applied.model.path != old.model.path || applied.model.sha256 != old.model.sha256 {
            // not ready until the inference thread runs the new model (it sets this back)
            stats.model_ready.store(false, Relaxed);
            match load_model(applied.clone(), device.clone(), dtype, &busy, &mut stop).await {
                LoadOutcome::Loaded(det) => {
                    det.use_graphs(true);
                    let control = control.clone();
                    let sent = tokio::task::spawn_blocking(move || control.send(Control::SwapModel(det))).await;
                    if !matches!(sent, Ok(Ok(()))) {
                        tracing::warn!("inference worker gone; model not swapped");
                        continue;
                    }
                }
                LoadOutcome::Failed(e) => {
                    // the running model stays; the edit is judged again when either file changes
                    stats.model_ready.store(true, Relaxed);
                    let model = ModelStamp::of(&applied.model.path).await;
                    rejected = Some(Rejected { config_sha256: sha, model: Some(model) });
                    reject(e, old.sha256.clone());
                    continue;
                }
                LoadOutcome::Stopped => return,
            }
        }
        let changed = changed_sections(&old, &applied);
        rejected = None;
        stats.config_applied.fetch_add(1, Relaxed);
        let sha = applied.sha256.clone();
        cfg_tx.send_replace(Arc::new(applied));
        events.emit(EventBody::ConfigApplied {
            path: path.to_string_lossy().into_owned(),
            sha256: sha,
            changed: changed.into_iter().map(String::from).collect(),
            restart_required: restart.into_iter().map(String::from).collect(),
        });
    }
}

fn changed_sections(a: &Config, b: &Config) -> Vec<&'static str> {
    let mut v = Vec::new();
    if a.model.thresholds != b.model.thresholds {
        v.push("model.thresholds");
    }
    if a.model.path != b.model.path {
        v.push("model.path");
    }
    if a.model.sha256 != b.model.sha256 {
        v.push("model.sha256");
    }
    if a.model.load_timeout != b.model.load_timeout {
        v.push("model.load_timeout_s");
    }
    if a.mqtt != b.mqtt {
        v.push("mqtt");
    }
    if a.telemetry_interval != b.telemetry_interval {
        v.push("telemetry");
    }
    if a.oom_quiet_period != b.oom_quiet_period || a.release_idle != b.release_idle {
        v.push("oom");
    }
    if a.shutdown_grace != b.shutdown_grace {
        v.push("shutdown");
    }
    if a.watchdog != b.watchdog {
        v.push("watchdog");
    }
    if !a.folders().eq(b.folders()) {
        v.push("sources.folders");
    }
    if !a.mqtt_sources().eq(b.mqtt_sources()) {
        v.push("sources.mqtt");
    }
    if !a.streams().eq(b.streams()) {
        v.push("sources.streams");
    }
    v
}
