//! Helpers for the agent integration tests: a real Mosquitto broker on a free port, an MQTT
//! subscriber that records every message, the agent binary as a child process, test images.

#![allow(dead_code)]

pub mod hostile;
pub mod panels;
pub mod runner;

pub use runner::yolo_edge;

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use yolo_edge::agent::messages::{self, EventBody};

/// The agent's topic prefix in these tests (the config default).
pub const PREFIX: &str = "yolo-edge";

/// Seconds since the Unix epoch, now.
pub fn unix_s() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

pub fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixture(name: &str) -> PathBuf {
    manifest().join("../shared/fixtures").join(name)
}

/// Finds mosquitto; without it the test is skipped locally and FAILS under CI=true.
pub fn mosquitto() -> Option<PathBuf> {
    for p in ["/usr/sbin/mosquitto", "/usr/bin/mosquitto", "/usr/local/sbin/mosquitto"] {
        if Path::new(p).exists() {
            return Some(PathBuf::from(p));
        }
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("mosquitto is not installed (apt-get install -y mosquitto mosquitto-clients); required under CI=true");
    }
    eprintln!("SKIPPED: mosquitto is not installed");
    None
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Polls `f` every 20 ms until it is true or `timeout` passes.
pub fn wait_until(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        if t.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A Mosquitto broker owned by the test (stopped on drop).
pub struct Broker {
    pub port: u16,
    pub dir: PathBuf,
    conf: PathBuf,
    child: Option<Child>,
}

impl Broker {
    /// `extra` is appended to the listener configuration (auth, TLS...).
    pub fn start(dir: &Path, extra: &str) -> Option<Broker> {
        let bin = mosquitto()?;
        let port = free_port();
        std::fs::create_dir_all(dir).unwrap();
        let conf = dir.join("mosquitto.conf");
        let body = format!(
            "listener {port} 127.0.0.1\npersistence true\npersistence_location {}/\nautosave_interval 1\nlog_dest file {}/mosquitto.log\nlog_type error\nlog_type warning\nlog_type notice\nmax_queued_messages 0\nmax_inflight_messages 20\n{}\n",
            dir.display(),
            dir.display(),
            if extra.is_empty() { "allow_anonymous true" } else { extra }
        );
        std::fs::write(&conf, body).unwrap();
        let _ = bin;
        let mut b = Broker { port, dir: dir.to_path_buf(), conf, child: None };
        b.restart();
        Some(b)
    }

    pub fn restart(&mut self) {
        assert!(self.child.is_none());
        let bin = mosquitto().unwrap();
        let child = Command::new(bin).arg("-c").arg(&self.conf).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        self.child = Some(child);
        let port = self.port;
        wait_until(Duration::from_secs(10), "mosquitto listening", || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    }

    /// Stops the broker with SIGTERM (it saves its persistent sessions) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on a child this test started; no memory is touched.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("mosquitto.log")).unwrap_or_default()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[derive(Debug, Clone)]
pub struct Message {
    pub topic: String,
    pub payload: Vec<u8>,
    pub retain: bool,
    pub at: Instant,
}

impl Message {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.payload)
            .unwrap_or_else(|e| panic!("{}: not JSON ({e}): {}", self.topic, String::from_utf8_lossy(&self.payload)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.payload).into_owned()
    }

    /// The payload as message type `T` of `yolo_edge::agent::messages`; panics when it is not one.
    pub fn parse<T: DeserializeOwned>(&self) -> T {
        serde_json::from_slice(&self.payload).unwrap_or_else(|e| {
            panic!("{}: not a {} ({e}): {}", self.topic, std::any::type_name::<T>(), String::from_utf8_lossy(&self.payload))
        })
    }

    /// The `status` payload; panics when it is neither `online` nor `offline`.
    pub fn status(&self) -> messages::Status {
        messages::Status::parse(&self.payload).unwrap_or_else(|| panic!("{}: not a status: {:?}", self.topic, self.text()))
    }

    /// The topic after `{PREFIX}/{device_id}/`, for the agent's own topics.
    pub fn leaf(&self) -> Option<&str> {
        let rest = self.topic.strip_prefix(PREFIX)?.strip_prefix('/')?;
        rest.split_once('/').map(|(_, leaf)| leaf)
    }

    /// For a message on one of the agent's topics: whether it parses into its type (and the
    /// reason if not). `None` for other topics.
    pub fn typed(&self) -> Option<Result<messages::Message, String>> {
        let leaf = self.leaf()?;
        Some(match messages::Message::parse(leaf, &self.payload) {
            Ok(Some(m)) => Ok(m),
            Ok(None) => Err(format!("{}: not a topic the agent publishes", self.topic)),
            Err(e) => Err(format!("{}: {e}: {}", self.topic, self.text())),
        })
    }
}

/// Options of a test MQTT client.
#[derive(Clone, Default)]
pub struct ClientOpts {
    pub id: String,
    pub username: Option<(String, String)>,
    pub ca: Option<Vec<u8>>,
    /// Keep the session (and its QoS 1 queue) across broker restarts.
    pub persistent: bool,
}

/// A subscriber recording every message (reconnects by itself). Every message on the agent's
/// topics must parse into its type of `yolo_edge::agent::messages`: those that do not are recorded,
/// and a collector that saw one fails the test when it is dropped.
pub struct Collector {
    pub messages: Arc<Mutex<Vec<Message>>>,
    /// Messages on the agent's topics that did not parse, with the reason.
    pub malformed: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    connected: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    client: rumqttc::Client,
}

impl Collector {
    pub fn start(port: u16, filter: &str, o: ClientOpts) -> Collector {
        let mut opts =
            rumqttc::MqttOptions::new(if o.id.is_empty() { format!("collector-{}", free_port()) } else { o.id.clone() }, "127.0.0.1", port);
        opts.set_clean_session(!o.persistent).set_keep_alive(Duration::from_secs(5)).set_max_packet_size(64 << 20, 64 << 20);
        if let Some((u, p)) = &o.username {
            opts.set_credentials(u, p);
        }
        if let Some(ca) = &o.ca {
            opts.set_transport(rumqttc::Transport::tls_with_config(rumqttc::TlsConfiguration::Simple {
                ca: ca.clone(),
                alpn: None,
                client_auth: None,
            }));
        }
        let (client, mut conn) = rumqttc::Client::new(opts, 1000);
        let messages = Arc::new(Mutex::new(Vec::new()));
        let malformed = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let connected = Arc::new(AtomicBool::new(false));
        let (m, s, c2, cl, f) = (messages.clone(), stop.clone(), connected.clone(), client.clone(), filter.to_string());
        let bad = malformed.clone();
        let thread = std::thread::spawn(move || {
            for ev in conn.iter() {
                if s.load(Ordering::Relaxed) {
                    break;
                }
                match ev {
                    Ok(rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(_))) => {
                        let _ = cl.try_subscribe(f.clone(), rumqttc::QoS::AtLeastOnce);
                    }
                    Ok(rumqttc::Event::Incoming(rumqttc::Packet::SubAck(_))) => c2.store(true, Ordering::Relaxed),
                    Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p))) => {
                        let msg = Message { topic: p.topic.clone(), payload: p.payload.to_vec(), retain: p.retain, at: Instant::now() };
                        if let Some(Err(e)) = msg.typed() {
                            bad.lock().unwrap().push(e);
                        }
                        m.lock().unwrap().push(msg);
                    }
                    Ok(_) => {}
                    Err(_) => {
                        c2.store(false, Ordering::Relaxed);
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        });
        let col = Collector { messages, malformed, stop, connected, thread: Some(thread), client };
        let c = col.connected.clone();
        wait_until(Duration::from_secs(10), "collector subscribed", || c.load(Ordering::Relaxed));
        col
    }

    pub fn snapshot(&self) -> Vec<Message> {
        self.messages.lock().unwrap().clone()
    }

    pub fn on(&self, topic_suffix: &str) -> Vec<Message> {
        self.snapshot().into_iter().filter(|m| m.topic.ends_with(topic_suffix)).collect()
    }

    pub fn detections(&self) -> Vec<Message> {
        self.snapshot().into_iter().filter(|m| m.topic.contains("/detections/")).collect()
    }

    /// The bodies of the `events` messages of this `type`, in arrival order.
    pub fn events(&self, kind: &str) -> Vec<EventBody> {
        self.on("/events").iter().map(|m| m.parse::<messages::Event>().body).filter(|b| b.kind() == kind).collect()
    }

    /// Asserts that every message received so far on the agent's topics parsed into its type;
    /// returns how many there were per type (`Detections`, `Telemetry`, `Event`, `Info`, `Status`).
    pub fn assert_all_typed(&self) -> std::collections::BTreeMap<&'static str, usize> {
        let bad = self.malformed.lock().unwrap().clone();
        assert!(bad.is_empty(), "{} messages do not parse into their type:\n{}", bad.len(), bad.join("\n"));
        let mut n = std::collections::BTreeMap::new();
        for m in self.snapshot() {
            let kind = match m.typed() {
                None => continue,
                Some(Err(e)) => panic!("{e}"),
                Some(Ok(messages::Message::Detections(_))) => "Detections",
                Some(Ok(messages::Message::Telemetry(_))) => "Telemetry",
                Some(Ok(messages::Message::Event(_))) => "Event",
                Some(Ok(messages::Message::Info(_))) => "Info",
                Some(Ok(messages::Message::Status(_))) => "Status",
            };
            *n.entry(kind).or_insert(0) += 1;
        }
        n
    }

    /// Publishes a message (for the MQTT image source).
    pub fn publish(&self, topic: &str, payload: Vec<u8>) {
        self.client.publish(topic, rumqttc::QoS::AtLeastOnce, false, payload).unwrap();
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.client.try_disconnect();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if !std::thread::panicking() {
            let bad = self.malformed.lock().map(|b| b.clone()).unwrap_or_default();
            assert!(bad.is_empty(), "{} messages do not parse into their type:\n{}", bad.len(), bad.join("\n"));
        }
    }
}

/// A small JPEG made from a fixture photo (decoded and re-encoded at `w` px wide).
pub fn small_jpeg(name: &str, w: u32) -> Vec<u8> {
    let img = image::open(fixture(name)).unwrap().to_rgb8();
    let h = (img.height() as u64 * w as u64 / img.width() as u64).max(1) as u32;
    let small = image::imageops::resize(&img, w, h, image::imageops::FilterType::Triangle);
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 85).encode_image(&small).unwrap();
    out
}

/// Writes `n` images named `img-00000.jpg`... into `dir`, each renamed into place.
pub fn drop_images(dir: &Path, start: usize, n: usize, bytes: &[u8]) -> Vec<String> {
    (start..start + n)
        .map(|i| {
            let name = format!("img-{i:05}.jpg");
            let tmp = dir.join(format!(".{name}.tmp"));
            std::fs::File::create(&tmp).and_then(|mut f| f.write_all(bytes)).unwrap();
            std::fs::rename(&tmp, dir.join(&name)).unwrap();
            name
        })
        .collect()
}

pub fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|r| r.filter_map(|e| e.ok()).filter(|e| e.path().is_file()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// The agent binary as a child process, logging to `dir/agent-N.log`.
pub struct Agent {
    pub child: Child,
    pub log: PathBuf,
}

impl Agent {
    pub fn spawn(config: &Path, env: &[(&str, &str)]) -> Agent {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let log = config.with_file_name(format!("agent-{}.log", N.fetch_add(1, Ordering::Relaxed)));
        let f = std::fs::File::create(&log).unwrap();
        let mut cmd = yolo_edge();
        cmd.arg("run").arg("--config").arg(config).env("RUST_LOG", "info,rumqttc=warn").stdout(Stdio::null()).stderr(f);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Agent { child: cmd.spawn().unwrap(), log }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on a child this test started; no memory is touched.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Waits for the exit code (None: killed by a signal).
    pub fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let t = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            if t.elapsed() > timeout {
                let _ = self.child.kill();
                panic!("agent did not exit within {timeout:?}; log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // a failed test shows what the agent was doing
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!("---- agent log (last {} lines) ----", tail.len());
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Settings of a test agent configuration.
pub struct AgentConf {
    pub port: u16,
    pub device_id: String,
    pub input: PathBuf,
    pub spool: PathBuf,
    pub model: PathBuf,
    pub batch: usize,
    /// `batch = "auto"` (the planner) with `batch` as max_batch.
    pub batch_auto: bool,
    /// Extra keys of the [device] table, e.g. `memory_limit = "60MiB"`.
    pub device_extra: String,
    pub imgsz: usize,
    pub max_wait_ms: u64,
    pub conf: f64,
    pub telemetry_s: f64,
    pub quiet_s: f64,
    pub grace_s: f64,
    pub mqtt_extra: String,
    pub extra: String,
}

impl AgentConf {
    pub fn new(dir: &Path, port: u16) -> AgentConf {
        let input = dir.join("in");
        std::fs::create_dir_all(&input).unwrap();
        AgentConf {
            port,
            device_id: "box-1".into(),
            input,
            spool: dir.join("spool"),
            model: fixture("yolov9t-ball.pt"),
            batch: 4,
            batch_auto: false,
            device_extra: String::new(),
            imgsz: 160,
            max_wait_ms: 20,
            conf: 0.25,
            telemetry_s: 1.0,
            quiet_s: 60.0,
            grace_s: 20.0,
            mqtt_extra: String::new(),
            extra: String::new(),
        }
    }

    pub fn toml(&self) -> String {
        format!(
            r#"[device]
device = "cpu"
imgsz = {imgsz}
batch = {batch_value}
max_batch = {batch}
max_wait_ms = {wait}
decode_threads = 2
{device_extra}

[model]
path = "{model}"
conf = {conf}

[mqtt]
host = "127.0.0.1"
port = {port}
device_id = "{id}"
reconnect_min_ms = 100
reconnect_max_ms = 1000
keepalive_s = 5
{mqtt_extra}

[[sources]]
type = "folder"
id = "cam"
path = "{input}"
settle_ms = 50
scan_interval_ms = 100

[telemetry]
interval_s = {tel}

[spool]
dir = "{spool}"
max_bytes = "64MiB"

[oom]
quiet_period_s = {quiet}

[shutdown]
grace_s = {grace}

{extra}
"#,
            batch = self.batch,
            imgsz = self.imgsz,
            batch_value = if self.batch_auto { "\"auto\"".to_string() } else { self.batch.to_string() },
            device_extra = self.device_extra,
            wait = self.max_wait_ms,
            model = self.model.display(),
            conf = self.conf,
            port = self.port,
            id = self.device_id,
            mqtt_extra = self.mqtt_extra,
            input = self.input.display(),
            tel = self.telemetry_s,
            spool = self.spool.display(),
            quiet = self.quiet_s,
            grace = self.grace_s,
            extra = self.extra,
        )
    }

    /// Writes the config atomically (write + rename), as an operator's tooling would.
    pub fn write(&self, path: &Path) {
        write_atomic(path, &self.toml());
    }
}

pub fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Parses a detection message into `messages::Detections` and checks its values; returns it.
pub fn check_detection(m: &Message, device_id: &str) -> messages::Detections {
    let d: messages::Detections = m.parse();
    assert_eq!(d.v, messages::VERSION, "{d:?}");
    assert_eq!(d.device_id, device_id);
    assert!(!d.boot_id.is_empty(), "{d:?}");
    assert!(d.seq >= 1, "{d:?}");
    assert!(d.ts.ends_with('Z') && d.ts.contains('T'), "{d:?}");
    assert!(m.topic.ends_with(&format!("/detections/{}", d.source)), "{} vs {}", m.topic, d.source);
    let (w, h) = d.image.size();
    assert!(w > 0 && h > 0 && !d.image.name().is_empty(), "{d:?}");
    assert!(!d.model.is_empty(), "{d:?}");
    assert!(d.batch_size >= 1, "{d:?}");
    let l = d.latency_ms;
    assert!(l.decode >= 0.0 && l.infer >= 0.0 && l.post >= 0.0, "{d:?}");
    for x in &d.detections {
        assert!(!x.label.is_empty() && (0.0..=1.0).contains(&x.confidence), "{x:?}");
    }
    d
}

/// The file name of a detection's `image.path`.
pub fn image_name(d: &messages::Detections) -> String {
    let messages::FrameImage::Path { path, .. } = &d.image else { panic!("not a hot-folder picture: {d:?}") };
    Path::new(path).file_name().unwrap().to_string_lossy().into_owned()
}

/// What a finished `yolo-edge demo` run printed.
pub struct DemoRun {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `yolo-edge demo ARGS` (output captured in `dir`); panics when it does not exit within
/// `timeout` (the demo bounds itself with `--timeout`; this is the test's own guard).
pub fn run_demo(dir: &Path, args: &[&str], timeout: Duration) -> DemoRun {
    std::fs::create_dir_all(dir).unwrap();
    let (out, err) = (dir.join("demo.stdout"), dir.join("demo.stderr"));
    let mut child = yolo_edge()
        .arg("demo")
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        if t.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "demo did not exit within {timeout:?}; stdout:\n{}\nstderr:\n{}",
                std::fs::read_to_string(&out).unwrap_or_default(),
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    DemoRun { code, stdout: std::fs::read_to_string(&out).unwrap(), stderr: std::fs::read_to_string(&err).unwrap() }
}

/// A minimal MQTT 3.1.1 broker for one behaviour no real broker can be told to have: it drops
/// the connection whenever a QoS 1 PUBLISH carries `poison` in its payload, and acknowledges
/// and records every other one. Everything else the agent sends (CONNECT, PINGREQ, DISCONNECT)
/// gets its normal answer.
/// (topic, payload) of every publish a test broker acknowledged.
pub type Published = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

pub struct PoisonBroker {
    pub port: u16,
    pub published: Published,
    pub drops: Arc<std::sync::atomic::AtomicUsize>,
}

impl PoisonBroker {
    pub fn start(poison: &'static [u8]) -> PoisonBroker {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let published = Arc::new(Mutex::new(Vec::new()));
        let drops = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (p, d) = (published.clone(), drops.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (p, d) = (p.clone(), d.clone());
                std::thread::spawn(move || Self::serve(stream, poison, &p, &d));
            }
        });
        PoisonBroker { port, published, drops }
    }

    fn serve(mut s: std::net::TcpStream, poison: &[u8], published: &Mutex<Vec<(String, Vec<u8>)>>, drops: &std::sync::atomic::AtomicUsize) {
        use std::io::Read;
        loop {
            let mut head = [0u8; 1];
            if s.read_exact(&mut head).is_err() {
                return;
            }
            let (mut len, mut shift) = (0usize, 0);
            loop {
                let mut b = [0u8; 1];
                if s.read_exact(&mut b).is_err() || shift > 21 {
                    return;
                }
                len |= ((b[0] & 0x7f) as usize) << shift;
                shift += 7;
                if b[0] & 0x80 == 0 {
                    break;
                }
            }
            let mut body = vec![0u8; len];
            if s.read_exact(&mut body).is_err() {
                return;
            }
            let reply: Vec<u8> = match head[0] >> 4 {
                1 => vec![0x20, 0x02, 0x00, 0x00],
                3 => {
                    let qos = (head[0] >> 1) & 3;
                    let tlen = u16::from_be_bytes([body[0], body[1]]) as usize;
                    let topic = String::from_utf8_lossy(&body[2..2 + tlen]).into_owned();
                    let at = 2 + tlen + if qos > 0 { 2 } else { 0 };
                    let payload = body[at..].to_vec();
                    if payload.windows(poison.len()).any(|w| w == poison) {
                        drops.fetch_add(1, Ordering::SeqCst);
                        let _ = s.shutdown(std::net::Shutdown::Both);
                        return;
                    }
                    published.lock().unwrap().push((topic, payload));
                    if qos == 1 {
                        vec![0x40, 0x02, body[2 + tlen], body[3 + tlen]]
                    } else {
                        vec![]
                    }
                }
                12 => vec![0xD0, 0x00],
                14 => return,
                _ => vec![],
            };
            if !reply.is_empty() && s.write_all(&reply).is_err() {
                return;
            }
        }
    }

    /// Payloads published on topics ending in `suffix`.
    pub fn on(&self, suffix: &str) -> Vec<serde_json::Value> {
        self.published
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _)| t.ends_with(suffix) || t.contains(suffix))
            .filter_map(|(_, p)| serde_json::from_slice(p).ok())
            .collect()
    }
}

/// Finds a program of the Debian `prometheus` package (`prometheus`, `promtool`); without it the
/// test is skipped locally and FAILS under CI=true.
pub fn prometheus_tool(name: &str) -> Option<PathBuf> {
    for dir in ["/usr/bin", "/usr/local/bin", "/bin"] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return Some(p);
        }
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{name} is not installed (apt-get install -y prometheus); required under CI=true");
    }
    eprintln!("SKIPPED: {name} is not installed");
    None
}

/// A plain HTTP/1.1 GET on 127.0.0.1: `(status, headers lowercased, body)`; `None` when the port
/// does not answer.
pub fn http_get(port: u16, path: &str, accept: &str) -> Option<(u16, String, String)> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: {accept}\r\nConnection: close\r\n\r\n").ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).ok()?;
    let out = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = out.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    // the test servers answer with Content-Length or close; chunked bodies are decoded here
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(body) } else { body.to_string() };
    Some((status, head.to_ascii_lowercase(), body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// `s` with every byte outside A-Z a-z 0-9 -_.~ percent-encoded (a URL query value).
pub fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

/// A Prometheus server owned by the test (stopped on drop), scraping `targets` every second.
pub struct Prometheus {
    pub port: u16,
    child: Child,
    log: PathBuf,
}

impl Prometheus {
    pub fn start(dir: &Path, job: &str, targets: &[u16]) -> Option<Prometheus> {
        let bin = prometheus_tool("prometheus")?;
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let list: Vec<String> = targets.iter().map(|p| format!("\"127.0.0.1:{p}\"")).collect();
        let conf = dir.join("prometheus.yml");
        std::fs::write(
            &conf,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: {job}\n    scrape_timeout: 1s\n    static_configs:\n      - targets: [{}]\n",
                list.join(", ")
            ),
        )
        .unwrap();
        let port = free_port();
        let log = dir.join("prometheus.log");
        let child = Command::new(bin)
            .arg(format!("--config.file={}", conf.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let p = Prometheus { port, child, log };
        wait_until(Duration::from_secs(60), "prometheus ready", || http_get(port, "/-/ready", "*/*").is_some_and(|r| r.0 == 200));
        Some(p)
    }

    /// `GET /api/v1/query`: the `data.result` array of an instant query (panics on an error answer).
    pub fn query(&self, expr: &str) -> Vec<serde_json::Value> {
        let (status, _, body) = http_get(self.port, &format!("/api/v1/query?query={}", url_encode(expr)), "application/json")
            .unwrap_or_else(|| panic!("prometheus did not answer; log:\n{}", self.log()));
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{expr}: not JSON ({e}): {body}"));
        assert!(status == 200 && v["status"] == "success", "{expr}: HTTP {status}: {body}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// `/api/v1/query_range` from `start` to `end` (Unix seconds) at `step_s`: the matrix result.
    pub fn query_range(&self, expr: &str, start: f64, end: f64, step_s: f64) -> Vec<serde_json::Value> {
        let q = format!("/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step={step_s}", url_encode(expr));
        let (status, _, body) =
            http_get(self.port, &q, "application/json").unwrap_or_else(|| panic!("prometheus did not answer; log:\n{}", self.log()));
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{expr}: not JSON ({e}): {body}"));
        assert!(status == 200 && v["status"] == "success", "{expr}: HTTP {status}: {body}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A memory cgroup made by a test: a child of this process's own memory cgroup (v2, or the v1
/// `memory` hierarchy) with a limit, removed on drop. Needs a cgroup filesystem this process may
/// write (root on this machine and in CI's containers; not everywhere).
pub struct MemoryCgroup {
    pub dir: PathBuf,
    /// The cgroup's path as `/proc/<pid>/cgroup` shows it, e.g. `/process_api/abc/yolo-edge-test-1`.
    pub path: String,
    v2: bool,
}

impl MemoryCgroup {
    /// A cgroup limited to `limit` bytes; Err with the reason where this process cannot make one.
    pub fn create(tag: &str, limit: u64) -> Result<MemoryCgroup, String> {
        let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("/proc/self/cgroup: {e}"))?;
        let v1 = own.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
            ctl.split(',').any(|c| c == "memory").then(|| path.to_string())
        });
        let (base, parent, v2) = match v1 {
            Some(p) => (PathBuf::from("/sys/fs/cgroup/memory"), p, false),
            None => {
                let p = own.lines().find_map(|l| l.strip_prefix("0::")).ok_or("no memory cgroup in /proc/self/cgroup")?;
                (PathBuf::from("/sys/fs/cgroup"), p.to_string(), true)
            }
        };
        let path = format!("{}/{tag}-{}", parent.trim_end_matches('/'), std::process::id());
        let dir = base.join(path.trim_start_matches('/'));
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let cg = MemoryCgroup { dir, path, v2 };
        let (file, value) = if v2 { ("memory.max", limit.to_string()) } else { ("memory.limit_in_bytes", limit.to_string()) };
        std::fs::write(cg.dir.join(file), value).map_err(|e| format!("cannot set {file} of {}: {e}", cg.dir.display()))?;
        if !v2 {
            // no swap either, where the kernel accounts it: the limit is the memory there is
            let _ = std::fs::write(cg.dir.join("memory.memsw.limit_in_bytes"), limit.to_string());
        } else {
            let _ = std::fs::write(cg.dir.join("memory.swap.max"), "0");
        }
        Ok(cg)
    }

    /// `cgroup.procs`: a process writes its pid here to join.
    pub fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// The highest memory use the kernel saw in the cgroup (bytes; page cache included).
    pub fn peak(&self) -> Option<u64> {
        let f = if self.v2 { "memory.peak" } else { "memory.max_usage_in_bytes" };
        std::fs::read_to_string(self.dir.join(f)).ok()?.trim().parse().ok()
    }

    /// How many processes the kernel's OOM killer ended in the cgroup (None: not reported).
    pub fn oom_kills(&self) -> Option<u64> {
        let f = if self.v2 { "memory.events" } else { "memory.oom_control" };
        let text = std::fs::read_to_string(self.dir.join(f)).ok()?;
        text.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|v| v.trim().parse().ok())
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // the processes are gone by now; an empty cgroup is removed with rmdir
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("cannot remove {}", self.dir.display());
    }
}

impl Agent {
    /// [`Agent::spawn`] inside `cgroup`: a shell joins it, then execs the agent (same pid, so
    /// the agent is started directly, also under a cross runner: its resident set is measured).
    pub fn spawn_in(cgroup: &MemoryCgroup, config: &Path) -> Agent {
        let log = config.with_file_name("agent-cgroup.log");
        let f = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(r#"echo $$ > "$1" && exec "$0" run --config "$2""#)
            .arg(env!("CARGO_BIN_EXE_yolo-edge"))
            .arg(cgroup.procs())
            .arg(config)
            .env("RUST_LOG", "info,rumqttc=warn")
            .stdout(Stdio::null())
            .stderr(f);
        Agent { child: cmd.spawn().unwrap(), log }
    }
}
