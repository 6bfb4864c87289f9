//! `yolo-edge demo`: the whole product in one command. An MQTT broker (embedded rumqttd unless
//! one is named), the Rust-drawn sample scenes in a temporary hot folder, the real agent run
//! in-process from a generated config (validated like any other) with the default model built
//! into the binary, and a subscriber that parses every message into its type of
//! [`crate::agent::messages`] and prints it, stops the agent once every picture is reported, checks the
//! detections against the drawn objects and sums up.

pub mod broker;
pub mod report;
pub mod samples;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::agent::config::BatchSpec;
use crate::agent::{self, AgentError};
use samples::SampleImage;

pub use broker::{BrokerAddr, BrokerError};
pub use report::{Check, Observer, Summary};

/// The default model (`models/yolov9t-shapes.safetensors`, see `models/README.md`), built into
/// the binary so that an installed `yolo-edge demo` needs no file beside it. The demo writes it
/// into its temporary folder and names it in the generated config, so the agent loads it through
/// `[model] path` like any other model (no demo-only path inside the agent).
pub const DEFAULT_MODEL: &[u8] = include_bytes!("../../models/yolov9t-shapes.safetensors");
/// File name the default model is written under in the demo's folder.
pub const DEFAULT_MODEL_NAME: &str = "yolov9t-shapes.safetensors";
/// The input size the default model was trained at.
pub const DEFAULT_IMGSZ: usize = 416;
/// The agent's MQTT topic prefix in the demo.
pub const PREFIX: &str = "yolo-edge";
/// The hot folder's source id (`detections/{SOURCE}`).
pub const SOURCE: &str = "samples";

/// What `yolo-edge demo` was asked to do.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// `auto`, `cpu`, `cuda` or `cuda:N`.
    pub device: String,
    /// `HOST:PORT` of a broker to use instead of the embedded one.
    pub broker: Option<String>,
    /// A model to use instead of the built-in default.
    pub model: Option<PathBuf>,
    pub imgsz: usize,
    /// Where to write the pictures with their boxes drawn.
    pub annotate: Option<PathBuf>,
    /// Number of pictures (the sample scenes, repeated in turn).
    pub images: usize,
    pub batch: BatchSpec,
    /// Bound on the whole run; the demo fails rather than waits longer.
    pub timeout: Duration,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            device: "auto".into(),
            broker: None,
            model: None,
            imgsz: DEFAULT_IMGSZ,
            annotate: None,
            images: samples::scenes().len(),
            batch: BatchSpec::Auto,
            timeout: Duration::from_secs(180),
        }
    }
}

/// Why a demo run failed.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error("{what} {path}: {source}")]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("cannot write {path}: {source}")]
    Image { path: PathBuf, source: image::ImageError },
    #[error("the demo's folder {0} is not valid UTF-8 (the agent's TOML config needs it)")]
    NonUtf8Path(PathBuf),
    #[error("cannot write the agent's config: {0}")]
    ConfigText(#[from] toml::ser::Error),
    #[error("the demo's MQTT subscriber could not subscribe at {broker}: {reason}")]
    Subscriber { broker: String, reason: String },
    /// The agent's own failure (boxed: it is large).
    #[error(transparent)]
    Agent(Box<AgentError>),
    #[error("the agent stopped before every picture was reported ({reported} of {expected})")]
    AgentStopped { reported: usize, expected: usize },
    #[error("timed out after {secs} s: {reported} of {expected} sample pictures reported")]
    Timeout { secs: u64, reported: usize, expected: usize },
    #[error("{failed} of {expected} sample pictures were rejected by the agent")]
    Failed { failed: usize, expected: usize },
    #[error("the detections do not match the pictures: {found} of {drawn} drawn objects found (at least half are expected)")]
    Check { found: usize, drawn: usize },
}

impl From<AgentError> for DemoError {
    fn from(e: AgentError) -> Self {
        Self::Agent(Box::new(e))
    }
}

/// The outcome of a successful run.
#[derive(Debug)]
pub struct DemoReport {
    pub summary: Summary,
    pub broker: BrokerAddr,
}

/// A unique folder under the system's temp dir, removed on drop unless `keep` is set.
struct WorkDir {
    path: PathBuf,
    keep: bool,
}

impl WorkDir {
    fn create() -> Result<Self, DemoError> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let path = std::env::temp_dir().join(format!("yolo-edge-demo-{}-{nanos:08x}", std::process::id()));
        std::fs::create_dir(&path).map_err(|source| DemoError::Io {
            what: "cannot create the demo's folder",
            path: path.clone(),
            source,
        })?;
        Ok(Self { path, keep: false })
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// The pictures the demo writes: `sample-NN.png` and the objects drawn in each.
pub fn sample_set(n: usize) -> Vec<(String, SampleImage)> {
    let scenes = samples::scenes();
    let width = n.to_string().len().max(2);
    (0..n).map(|i| (format!("sample-{:0width$}.png", i + 1), scenes[i % scenes.len()].clone())).collect()
}

/// The agent's configuration for the demo, as TOML (validated by [`crate::agent::config::Config`] like
/// any operator's file when the agent loads it).
pub fn agent_config(dir: &Path, model: &Path, broker: &BrokerAddr, device_id: &str, o: &DemoOptions) -> Result<String, DemoError> {
    let utf8 = |p: &Path| p.to_str().map(str::to_string).ok_or_else(|| DemoError::NonUtf8Path(p.to_path_buf()));
    let (batch, max_batch) = match o.batch {
        // the planner never needs to probe beyond the sample set (each verify is a forward pass)
        BatchSpec::Auto => (serde_json::json!("auto"), o.images.clamp(1, 16)),
        BatchSpec::Fixed(n) => (serde_json::json!(n), n.max(16)),
    };
    let v = serde_json::json!({
        "device": {"device": o.device, "dtype": "auto", "imgsz": o.imgsz, "batch": batch, "max_batch": max_batch, "max_wait_ms": 50},
        "model": {"path": utf8(model)?},
        "mqtt": {"host": broker.host, "port": broker.port, "device_id": device_id, "prefix": PREFIX, "keepalive_s": 10, "reconnect_min_ms": 100, "reconnect_max_ms": 2000},
        "sources": [{"type": "folder", "id": SOURCE, "path": utf8(&dir.join("in"))?, "settle_ms": 50, "scan_interval_ms": 100}],
        "telemetry": {"interval_s": 1.0},
        "spool": {"dir": utf8(&dir.join("spool"))?, "max_bytes": "64MiB"},
        "shutdown": {"grace_s": 10.0},
    });
    Ok(format!("# generated by `yolo-edge demo`\n{}", toml::to_string(&v)?))
}

/// A message as the subscriber received it.
struct Received {
    topic: String,
    payload: Vec<u8>,
    at: Instant,
}

/// Subscribes to `filter` (QoS 1) and forwards every message until `stop`; returns once the
/// subscription is acknowledged.
fn subscribe(broker: &BrokerAddr, client_id: &str, filter: &str, stop: Arc<AtomicBool>) -> Result<mpsc::Receiver<Received>, DemoError> {
    let mut opts = rumqttc::MqttOptions::new(client_id, broker.host.clone(), broker.port);
    opts.set_keep_alive(Duration::from_secs(10)).set_max_packet_size(16 << 20, 16 << 20);
    let (client, mut conn) = rumqttc::Client::new(opts, 100);
    let (tx, rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    let filter = filter.to_string();
    std::thread::Builder::new()
        .name("demo-subscriber".into())
        .spawn(move || {
            let mut ready = Some(ready_tx);
            for ev in conn.iter() {
                if stop.load(Ordering::Relaxed) {
                    let _ = client.try_disconnect();
                    break;
                }
                match ev {
                    Ok(rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(_))) => {
                        if let Err(e) = client.try_subscribe(filter.clone(), rumqttc::QoS::AtLeastOnce) {
                            if let Some(r) = ready.take() {
                                let _ = r.send(Err(e.to_string()));
                            }
                        }
                    }
                    Ok(rumqttc::Event::Incoming(rumqttc::Packet::SubAck(_))) => {
                        if let Some(r) = ready.take() {
                            let _ = r.send(Ok(()));
                        }
                    }
                    Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p))) => {
                        if tx.send(Received { topic: p.topic.clone(), payload: p.payload.to_vec(), at: Instant::now() }).is_err() {
                            break;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!("demo subscriber: {e}");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        })
        .map_err(|e| DemoError::Subscriber { broker: broker.to_string(), reason: e.to_string() })?;
    match ready_rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Ok(())) => Ok(rx),
        Ok(Err(reason)) => Err(DemoError::Subscriber { broker: broker.to_string(), reason }),
        Err(_) => Err(DemoError::Subscriber { broker: broker.to_string(), reason: "no SUBACK within 10 s".into() }),
    }
}

/// Runs the demo, printing to `out`; see the module documentation.
pub fn run(o: &DemoOptions, out: &mut dyn Write) -> Result<DemoReport, DemoError> {
    let t0 = Instant::now();
    let deadline = t0 + o.timeout;
    let mut work = WorkDir::create()?;
    let result = run_in(o, &work.path, t0, deadline, out);
    // after the agent ran, its config, hot folder (done/, failed/) and spool tell what happened
    if let Err(DemoError::AgentStopped { .. } | DemoError::Timeout { .. } | DemoError::Failed { .. } | DemoError::Check { .. }) = &result {
        work.keep = true;
        let _ = writeln!(out, "demo folder kept for inspection: {}", work.path.display());
    }
    result
}

fn run_in(o: &DemoOptions, dir: &Path, t0: Instant, deadline: Instant, out: &mut dyn Write) -> Result<DemoReport, DemoError> {
    let say = |out: &mut dyn Write, s: String| {
        let _ = writeln!(out, "{s}");
        let _ = out.flush();
    };
    let broker = match &o.broker {
        Some(addr) => broker::external(addr, Duration::from_secs(5))?,
        None => broker::start_embedded(Duration::from_secs(10))?,
    };
    say(out, format!("broker      {broker}"));

    let model = match &o.model {
        Some(p) => std::path::absolute(p).map_err(|source| DemoError::Io { what: "cannot resolve", path: p.clone(), source })?,
        None => {
            let p = dir.join(DEFAULT_MODEL_NAME);
            std::fs::write(&p, DEFAULT_MODEL).map_err(|source| DemoError::Io {
                what: "cannot write the default model to",
                path: p.clone(),
                source,
            })?;
            p
        }
    };
    let input = dir.join("in");
    std::fs::create_dir(&input).map_err(|source| DemoError::Io { what: "cannot create the hot folder", path: input.clone(), source })?;
    let set = sample_set(o.images);
    for (name, s) in &set {
        // written beside, then renamed into place: the hot folder never sees half a file
        let (tmp, path) = (input.join(format!(".{name}.part")), input.join(name));
        s.image.save_with_format(&tmp, image::ImageFormat::Png).map_err(|source| DemoError::Image { path: tmp.clone(), source })?;
        std::fs::rename(&tmp, &path).map_err(|source| DemoError::Io { what: "cannot move into place", path: path.clone(), source })?;
    }
    say(
        out,
        format!(
            "samples     {} picture{} ({} objects drawn) in {}",
            set.len(),
            if set.len() == 1 { "" } else { "s" },
            set.iter().map(|s| s.1.objects.len()).sum::<usize>(),
            input.display()
        ),
    );
    say(
        out,
        format!(
            "model       {}",
            if o.model.is_some() {
                model.display().to_string()
            } else {
                format!("{DEFAULT_MODEL_NAME} (built in, {})", report::bytes(DEFAULT_MODEL.len() as u64))
            }
        ),
    );

    let device_id = format!("demo-{}", std::process::id());
    let cfg_path = dir.join("agent.toml");
    let text = agent_config(dir, &model, &broker, &device_id, o)?;
    std::fs::write(&cfg_path, text).map_err(|source| DemoError::Io {
        what: "cannot write the agent's config",
        path: cfg_path.clone(),
        source,
    })?;

    let stop_sub = Arc::new(AtomicBool::new(false));
    let base = format!("{PREFIX}/{device_id}/");
    let messages = subscribe(&broker, &format!("{device_id}-subscriber"), &format!("{base}#"), stop_sub.clone())?;
    say(out, format!("subscribed  {base}#"));

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let agent = std::thread::Builder::new()
        .name("agent".into())
        .spawn(move || {
            agent::run_with_shutdown(&cfg_path, async move {
                tokio::select! {
                    _ = stop_rx => {}
                    _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT"),
                }
            })
        })
        .map_err(|source| DemoError::Io { what: "cannot start the agent thread", path: dir.to_path_buf(), source })?;

    let expected: BTreeMap<String, _> = set.iter().map(|(n, s)| (n.clone(), s.objects.clone())).collect();
    let mut obs = Observer::new(expected);
    let images: BTreeMap<&str, &SampleImage> = set.iter().map(|(n, s)| (n.as_str(), s)).collect();
    let take = |obs: &mut Observer, m: Received, out: &mut dyn Write| -> Result<(), DemoError> {
        let Some(leaf) = m.topic.strip_prefix(&base) else { return Ok(()) };
        let Some(u) = obs.on_message(leaf, &m.payload, m.at) else { return Ok(()) };
        say(out, u.line);
        if let (Some(dir), Some(name)) = (&o.annotate, &u.image) {
            if let (Some(s), Some(dets)) = (images.get(name.as_str()), obs.results.get(name)) {
                let mut img = s.image.clone();
                crate::vision::annotate::draw(&mut img, dets);
                std::fs::create_dir_all(dir).map_err(|source| DemoError::Io { what: "cannot create", path: dir.clone(), source })?;
                let p = dir.join(name);
                img.save(&p).map_err(|source| DemoError::Image { path: p, source })?;
            }
        }
        Ok(())
    };

    // until every picture is reported, the agent stops, or time runs out
    let mut outcome: Result<(), DemoError> = Ok(());
    while !obs.complete() {
        match messages.recv_timeout(Duration::from_millis(100)) {
            Ok(m) => {
                if let Err(e) = take(&mut obs, m, out) {
                    outcome = Err(e);
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                outcome = Err(DemoError::Subscriber { broker: broker.to_string(), reason: "the subscriber stopped".into() });
                break;
            }
        }
        if agent.is_finished() {
            outcome = Err(DemoError::AgentStopped { reported: obs.reported(), expected: set.len() });
            break;
        }
        if Instant::now() > deadline {
            outcome = Err(DemoError::Timeout { secs: (deadline - t0).as_secs(), reported: obs.reported(), expected: set.len() });
            break;
        }
    }
    // one more telemetry message that counts every picture (the agent sends one a second)
    let until = (Instant::now() + Duration::from_millis(2500)).min(deadline);
    while outcome.is_ok() && obs.telemetry_frames() < set.len() as u64 && Instant::now() < until && !agent.is_finished() {
        if let Ok(m) = messages.recv_timeout(Duration::from_millis(100)) {
            outcome = take(&mut obs, m, out);
        }
    }

    let _ = stop_tx.send(());
    let agent_result = agent.join().map_err(|_| DemoError::AgentStopped { reported: obs.reported(), expected: set.len() });
    // the agent has published `offline`; let it arrive
    let until = Instant::now() + Duration::from_secs(3);
    while !obs.offline && Instant::now() < until {
        if let Ok(m) = messages.recv_timeout(Duration::from_millis(100)) {
            if outcome.is_ok() {
                outcome = take(&mut obs, m, out);
            } else {
                let _ = take(&mut obs, m, out);
            }
        }
    }
    stop_sub.store(true, Ordering::Relaxed);
    agent_result??;
    outcome?;

    let summary = obs.summary(set.len(), t0.elapsed());
    say(out, String::new());
    say(out, summary.to_string());
    if !obs.failed.is_empty() {
        return Err(DemoError::Failed { failed: obs.failed.len(), expected: set.len() });
    }
    if let Some(c) = &summary.check {
        if c.found_total() * 2 < c.drawn_total() {
            return Err(DemoError::Check { found: c.found_total(), drawn: c.drawn_total() });
        }
    }
    Ok(DemoReport { summary, broker })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_config_passes_validation() {
        let dir = Path::new("/tmp/yolo-edge-demo-x");
        let broker = BrokerAddr { host: "127.0.0.1".into(), port: 18830, embedded: true };
        for batch in [BatchSpec::Auto, BatchSpec::Fixed(4), BatchSpec::Fixed(32)] {
            let o = DemoOptions { batch, device: "cpu".into(), ..Default::default() };
            let text = agent_config(dir, &dir.join("m.safetensors"), &broker, "demo-1", &o).unwrap();
            let c = crate::agent::config::Config::parse(&text, &dir.join("agent.toml")).unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert_eq!(c.device.batch, batch);
            assert_eq!((c.device.imgsz, c.device.device.as_str()), (DEFAULT_IMGSZ, "cpu"));
            assert_eq!(c.mqtt.topic("status"), "yolo-edge/demo-1/status");
            assert_eq!(c.mqtt.port, 18830);
            assert!(
                matches!(&c.sources[0], crate::agent::config::SourceConfig::Folder { id, path, .. } if id == SOURCE && path == &dir.join("in"))
            );
            assert_eq!(c.model.path, dir.join("m.safetensors"));
        }
    }

    #[test]
    fn sample_set_cycles_the_scenes_and_the_built_in_model_is_the_default_one() {
        let s = sample_set(8);
        assert_eq!(s.len(), 8);
        assert_eq!((s[0].0.as_str(), s[7].0.as_str()), ("sample-01.png", "sample-08.png"));
        assert_eq!(s[6].1.objects, s[0].1.objects);
        assert_eq!(sample_set(120)[0].0, "sample-001.png");
        use sha2::Digest;
        // models/README.md's sha256 of the committed file
        assert_eq!(
            format!("{:x}", sha2::Sha256::digest(DEFAULT_MODEL)),
            "182a7e7c142895327ea6620f07071d8335dc50875a26d809bbcd9b9881257191"
        );
    }
}
