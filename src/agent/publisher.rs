//! The publisher: owns the MQTT connection and the spool. Detections go out live with QoS 1
//! while connected (a file moves to done/ when its PUBACK arrives), or to the spool while the
//! broker is away (the file moves once the spool entry is fsynced); the spool is replayed in
//! order after reconnect. Also publishes status (birth/LWT), info, events and telemetry.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{mpsc, watch};

use crate::agent::config::{Config, SourceConfig};
use crate::agent::events::EventSink;
use crate::agent::messages::{self, EventBody, FrameImage, FrameLatency, ImageName, InputStage, MemoryBudget, Status};
use crate::agent::mqtt::{self, Client, ConnEvent, Incoming, MqttError};
use crate::agent::pipeline::{Completion, ImageRef, Outcome};
use crate::agent::spool::Spool;
use crate::agent::telemetry::{self, FpsMeter, FrameResult, MemorySource, Stage, Stats};
use crate::agent::watchdog::{self, Watchdog};

/// Most events kept while the broker is away (the oldest are dropped, counted, and logged).
const MAX_PENDING_EVENTS: usize = 1000;

/// RFC 3339 UTC timestamp with milliseconds.
pub fn now_ts() -> String {
    ts_of(SystemTime::now())
}

/// A moment as messages write it (RFC 3339 UTC, milliseconds).
pub fn ts_of(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Detection,
    Event,
    Other,
}

#[derive(Debug)]
enum Origin {
    Live(Completion),
    Spool(u64),
    None,
}

#[derive(Debug)]
struct Msg {
    topic: String,
    payload: Vec<u8>,
    retain: bool,
    qos: u8,
    kind: Kind,
    origin: Origin,
}

struct InFlight {
    msg: Msg,
    pkid: Option<u16>,
    sent: Instant,
}

/// Everything the publisher needs from the agent.
pub struct PublisherParts {
    pub cfg: watch::Receiver<Arc<Config>>,
    pub results: mpsc::Receiver<Outcome>,
    pub events_rx: mpsc::Receiver<EventBody>,
    pub events: EventSink,
    pub stats: Arc<Stats>,
    pub spool: Spool,
    pub boot_id: String,
    /// Builds the retained `info` message (published on connect and after info-changing events).
    pub info: Box<dyn Fn() -> messages::Info + Send>,
    pub memory: Arc<dyn MemorySource>,
    /// Pictures from the image topics of the config's MQTT sources, which the publisher
    /// subscribes to on its connection (again after a config edit changes them).
    pub images: mpsc::Sender<Incoming>,
    /// Turns true on SIGTERM/SIGINT: from then on, `grace` bounds the drain.
    pub shutdown: watch::Receiver<bool>,
}

struct Publisher {
    p: PublisherParts,
    cfg: Arc<Config>,
    gen: u64,
    client: Option<Client>,
    connected: bool,
    ever_connected: bool,
    backoff: Duration,
    reconnect_at: Option<tokio::time::Instant>,
    window: VecDeque<InFlight>,
    resend: VecDeque<Msg>,
    seq: u64,
    started: Instant,
    fps: FpsMeter,
    conn_tx: mpsc::Sender<(u64, ConnEvent)>,
    conn_rx: mpsc::Receiver<(u64, ConnEvent)>,
    /// Whether the last telemetry reading had the process over the planner's budget.
    over_budget: bool,
    /// The memory watchdog's state.
    watchdog: Watchdog,
    /// Images from the broker that the MQTT source has no room for yet, with the connection
    /// they came on and their acknowledgement, which is held back until they are handed over.
    images_waiting: VecDeque<(u64, Incoming, mqtt::Ack)>,
    /// Acknowledgements not yet queued on the client (its request queue was full).
    acks_owed: VecDeque<(u64, mqtt::Ack)>,
    /// Since when the broker has been away, why, and the spool count then (for the
    /// `mqtt_reconnected` event); connection attempts since.
    down: Option<(Instant, String, u64)>,
    attempts: u32,
    /// The latest telemetry made while offline, sent on reconnect.
    pending_telemetry: Option<Msg>,
    /// Acknowledgements still to come before detections go out in a full window again: after
    /// the broker dropped the connection, detections go one at a time, so that a drop names
    /// the one message in flight.
    careful: u32,
    /// Spool entries by the number of connection drops while each was the one detection in
    /// flight: a broker that cannot take a message drops the connection on it every time.
    suspects: HashMap<u64, u32>,
}

/// A detection that was alone in flight at this many connection drops is taken for one the
/// broker cannot accept, and dead-lettered (with the drop that started one-at-a-time sending,
/// the broker has dropped the connection one more time than this).
pub const POISON_DROPS: u32 = 3;

/// Images held back from the MQTT source at most: the broker's in-flight window bounds them
/// (`mqtt::RECEIVE_MAXIMUM`, or a 3.1.1 broker's own), this only a broker that ignores it.
const MAX_IMAGES_WAITING: usize = 1024;

/// Acknowledged detections, sent one at a time, after which a full window is used again.
const CAREFUL_ACKS: u32 = 16;

/// Runs until the results channel closes (pipeline drained) and everything is delivered or
/// spooled, or the shutdown grace period ends; then publishes `offline` and disconnects.
pub async fn run(parts: PublisherParts) {
    let (conn_tx, conn_rx) = mpsc::channel(4096);
    let cfg = parts.cfg.borrow().clone();
    let mut p = Publisher {
        backoff: cfg.mqtt.reconnect_min,
        cfg,
        gen: 0,
        client: None,
        connected: false,
        ever_connected: false,
        reconnect_at: Some(tokio::time::Instant::now()),
        window: VecDeque::new(),
        resend: VecDeque::new(),
        seq: 0,
        started: Instant::now(),
        over_budget: false,
        watchdog: Watchdog::default(),
        images_waiting: VecDeque::new(),
        acks_owed: VecDeque::new(),
        down: None,
        attempts: 0,
        pending_telemetry: None,
        careful: 0,
        suspects: HashMap::new(),
        fps: FpsMeter::new(0),
        conn_tx,
        conn_rx,
        p: parts,
    };
    p.update_gauges();
    let mut telem = tokio::time::interval(p.cfg.telemetry_interval);
    telem.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    telem.tick().await;
    let mut memory_tick = tokio::time::interval(p.cfg.watchdog.interval);
    memory_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut results_open = true;
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        p.pump();
        p.feed_images();
        p.update_gauges();
        if !results_open && (p.all_delivered() || !p.connected) {
            break;
        }
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            tracing::warn!("shutdown grace period over; spooling what is not acknowledged");
            break;
        }
        let accept = results_open && p.can_accept();
        let reconnect_at = p.reconnect_at;
        tokio::select! {
            biased;
            Some((g, ev)) = p.conn_rx.recv() => if g == p.gen { p.on_conn(ev) },
            o = p.p.results.recv(), if accept => match o {
                Some(o) => { p.p.stats.q_results.fetch_sub(1, Relaxed); p.on_outcome(o) }
                None => results_open = false,
            },
            Some(e) = p.p.events_rx.recv() => p.on_event(e),
            _ = telem.tick() => p.telemetry(),
            _ = memory_tick.tick() => p.watch_memory(),
            _ = async { tokio::time::sleep_until(reconnect_at.unwrap_or_else(tokio::time::Instant::now)).await }, if reconnect_at.is_some() && p.client.is_none() => p.connect(),
            r = p.p.cfg.changed() => if r.is_ok() {
                let new = p.p.cfg.borrow_and_update().clone();
                if new.telemetry_interval != p.cfg.telemetry_interval {
                    telem = tokio::time::interval(new.telemetry_interval);
                    telem.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    telem.tick().await;
                }
                if new.watchdog.interval != p.cfg.watchdog.interval {
                    memory_tick = tokio::time::interval(new.watchdog.interval);
                    memory_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                }
                let reconnect = new.mqtt != p.cfg.mqtt;
                let (before, after) = (image_filters(&p.cfg), image_filters(&new));
                p.cfg = new;
                if !reconnect && p.connected && before != after {
                    let added: Vec<String> = after.iter().filter(|f| !before.contains(f)).cloned().collect();
                    let removed: Vec<String> = before.into_iter().filter(|f| !after.contains(f)).collect();
                    p.subscribe(&added, &removed);
                }
                if reconnect {
                    tracing::info!("MQTT settings changed: reconnecting");
                    if let Some(c) = &p.client { c.try_disconnect() }
                    p.lost("MQTT settings changed".into(), false);
                    p.backoff = p.cfg.mqtt.reconnect_min;
                    p.reconnect_at = Some(tokio::time::Instant::now());
                }
            },
            r = p.p.shutdown.changed(), if deadline.is_none() => {
                if r.is_err() || *p.p.shutdown.borrow() {
                    deadline = Some(tokio::time::Instant::now() + p.cfg.shutdown_grace);
                }
            },
            // images waiting for room in the MQTT source are handed over as it drains
            _ = tokio::time::sleep(Duration::from_millis(if p.images_waiting.is_empty() { 200 } else { 5 })) => {}
        }
    }
    p.finish().await;
}

/// The topic filters of the config's MQTT image sources, each once, in config order.
fn image_filters(cfg: &Config) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for s in cfg.mqtt_sources() {
        if let SourceConfig::Mqtt { topic, .. } = s {
            if !v.contains(topic) {
                v.push(topic.clone());
            }
        }
    }
    v
}

impl Publisher {
    /// Subscribes the connection to `add` and unsubscribes it from `remove` (image topics).
    fn subscribe(&self, add: &[String], remove: &[String]) {
        let Some(c) = &self.client else { return };
        for f in add {
            match c.try_subscribe(f) {
                Ok(()) => tracing::info!(filter = %f, "subscribed to image topic"),
                Err(e) => tracing::error!("cannot subscribe to {f}: {e}"),
            }
        }
        for f in remove {
            match c.try_unsubscribe(f) {
                Ok(()) => tracing::info!(filter = %f, "unsubscribed from image topic"),
                Err(e) => tracing::error!("cannot unsubscribe from {f}: {e}"),
            }
        }
    }

    fn topic(&self, leaf: &str) -> String {
        self.cfg.mqtt.topic(leaf)
    }

    fn max_inflight(&self) -> usize {
        self.cfg.mqtt.max_inflight
    }

    fn live_ok(&self) -> bool {
        self.connected && self.careful == 0 && self.resend.iter().all(|m| m.kind != Kind::Detection) && !self.p.spool.has_unsent()
    }

    fn can_accept(&self) -> bool {
        if self.live_ok() {
            self.window.len() < self.max_inflight()
        } else {
            self.p.spool.has_room()
        }
    }

    fn all_delivered(&self) -> bool {
        self.window.is_empty() && self.resend.is_empty() && self.p.spool.is_empty()
    }

    fn update_gauges(&self) {
        let s = &self.p.stats;
        s.mqtt_queued.store((self.window.len() + self.resend.len()) as u64, Relaxed);
        s.mqtt_inflight.store(self.window.len() as u64, Relaxed);
        s.mqtt_connected.store(self.connected, Relaxed);
        s.spool_accepting.store(self.p.spool.has_room(), Relaxed);
        s.spool_len.store(self.p.spool.len() as u64, Relaxed);
        s.spool_bytes.store(self.p.spool.bytes(), Relaxed);
    }

    fn connect(&mut self) {
        self.gen += 1;
        self.attempts += 1;
        self.reconnect_at = None;
        let cap = self.max_inflight() * 2 + 64;
        tracing::info!(host = %self.cfg.mqtt.host, port = self.cfg.mqtt.port, protocol = %self.cfg.mqtt.protocol, "connecting to MQTT broker");
        let max_incoming = mqtt::max_incoming_packet(self.cfg.input.max_bytes);
        self.client = Some(mqtt::connect(&self.cfg.mqtt, max_incoming, cap, self.gen, self.conn_tx.clone()));
    }

    /// The connection is gone: unacknowledged detections go to the spool (in order, after
    /// everything already there), events go back to the queue, the rest is re-sent on connect.
    /// When the broker dropped an established connection (`suspect`), detections go out one at
    /// a time for a while; a drop with one in flight counts against it (see [`POISON_DROPS`]).
    fn lost(&mut self, reason: String, suspect: bool) {
        let suspect = suspect && self.connected;
        if self.connected {
            self.down = Some((Instant::now(), reason.clone(), self.p.stats.spooled_total.load(Relaxed)));
            self.attempts = 0;
            self.p.events.emit(EventBody::MqttDisconnected { reason: reason.clone() });
        }
        if suspect {
            if self.careful > 0 {
                let alone = self.window.iter().find_map(|f| match (f.msg.kind, &f.msg.origin) {
                    (Kind::Detection, Origin::Spool(id)) => Some(*id),
                    _ => None,
                });
                if let Some(id) = alone {
                    *self.suspects.entry(id).or_insert(0) += 1;
                }
            }
            self.careful = CAREFUL_ACKS;
        }
        if self.connected {
            tracing::warn!("MQTT connection lost: {reason}");
        }
        self.connected = false;
        self.client = None;
        self.gen += 1;
        self.p.spool.rewind();
        let window: Vec<InFlight> = self.window.drain(..).collect();
        let mut events_back = Vec::new();
        for f in window {
            match (f.msg.kind, f.msg.origin) {
                (Kind::Detection, Origin::Live(c)) => {
                    let m = Msg { origin: Origin::Live(c), ..f.msg };
                    self.spool_msg(m);
                }
                (Kind::Event, o) => events_back.push(Msg { origin: o, ..f.msg }),
                _ => {}
            }
        }
        for m in events_back.into_iter().rev() {
            self.resend.push_front(m);
        }
    }

    /// Appends a live detection to the spool and completes its input; if the disk fails, it
    /// stays in memory for the next connection.
    fn spool_msg(&mut self, m: Msg) {
        match self.p.spool.append(&m.topic, &m.payload) {
            Ok(_) => {
                self.p.stats.spooled_total.fetch_add(1, Relaxed);
                if let Origin::Live(c) = &m.origin {
                    if let Err(e) = c.done() {
                        tracing::error!("cannot move input to done/: {e}");
                    }
                }
            }
            Err(e) => {
                tracing::error!("spool write failed, keeping the message in memory: {e}");
                self.resend.push_back(m);
            }
        }
    }

    /// A detection the broker will not take: kept in the spool's dead-letter folder (never sent
    /// again), its input completed, and a `publish_refused` event naming where it went.
    fn dead_letter(&mut self, topic: String, payload: &[u8], origin: Origin, reason: String) {
        let moved = match &origin {
            Origin::Spool(id) => {
                self.suspects.remove(id);
                self.p.spool.dead_letter(*id, &reason)
            }
            _ => self.p.spool.dead_letter_new(&topic, payload, &reason),
        };
        let dead_letter = match moved {
            Ok(p) => Some(p.to_string_lossy().into_owned()),
            Err(e) => {
                tracing::error!("cannot keep the refused message: {e}");
                if let Origin::Spool(id) = origin {
                    self.p.spool.discard(id);
                }
                None
            }
        };
        if let Origin::Live(c) = &origin {
            if let Err(e) = c.done() {
                tracing::error!("cannot move input to done/: {e}");
            }
        }
        self.p.stats.dead_letters.fetch_add(1, Relaxed);
        tracing::warn!(topic = %topic, reason = %reason, dead_letter = ?dead_letter, "broker refused a detection; dead-lettered");
        self.p.events.emit(EventBody::PublishRefused { topic, reason, dead_letter });
    }

    fn on_conn(&mut self, ev: ConnEvent) {
        match ev {
            ConnEvent::Connected => {
                let again = self.ever_connected;
                self.connected = true;
                self.ever_connected = true;
                self.backoff = self.cfg.mqtt.reconnect_min;
                if again {
                    self.p.stats.reconnects.fetch_add(1, Relaxed);
                }
                tracing::info!("MQTT connected");
                let status = self.topic("status");
                let info = self.info_msg();
                let online = Status::Online.as_payload().into();
                self.send(Msg { topic: status, payload: online, retain: true, qos: 1, kind: Kind::Other, origin: Origin::None });
                self.send(info);
                if let Some((since, reason, spooled)) = self.down.take() {
                    let spooled = self.p.stats.spooled_total.load(Relaxed).saturating_sub(spooled);
                    let down_s = since.elapsed().as_secs_f64();
                    tracing::info!(down_s, spooled, attempts = self.attempts, "MQTT back after a loss");
                    self.p.events.emit(EventBody::MqttReconnected { down_s, reason, spooled, attempts: self.attempts });
                }
                if let Some(t) = self.pending_telemetry.take() {
                    self.send(t);
                }
                self.subscribe(&image_filters(&self.cfg), &[]);
            }
            ConnEvent::Refused { reason, auth } => {
                self.p.stats.connect_refused.fetch_add(1, Relaxed);
                if auth {
                    tracing::error!(reason = %reason, "MQTT broker refused the connection: authentication failed (check username/password)");
                } else {
                    tracing::error!(reason = %reason, "MQTT broker refused the connection");
                }
                self.p.events.emit(EventBody::MqttRefused { reason: reason.clone(), auth });
                self.lost(format!("refused: {reason}"), false);
                self.schedule_reconnect();
            }
            ConnEvent::Disconnected(reason) => {
                if !self.connected {
                    tracing::warn!("MQTT connection failed: {reason}");
                }
                self.lost(reason, true);
                self.schedule_reconnect();
            }
            ConnEvent::Sent(pkid) => {
                if let Some(i) = self.window.iter().position(|f| f.pkid.is_none()) {
                    self.window[i].pkid = Some(pkid);
                    if self.window[i].msg.qos == 0 {
                        if let Some(f) = self.window.remove(i) {
                            self.delivered(f, None);
                        }
                    }
                }
            }
            ConnEvent::Acked { pkid, error } => {
                if let Some(i) = self.window.iter().position(|f| f.pkid == Some(pkid)) {
                    if let Some(f) = self.window.remove(i) {
                        self.delivered(f, error);
                    }
                }
            }
            ConnEvent::Message { topic, payload, properties, ack } => {
                if self.images_waiting.len() >= MAX_IMAGES_WAITING {
                    // a broker that sends past its in-flight window: the excess is refused (and,
                    // unacknowledged, comes again after a reconnect)
                    self.p.stats.inputs_rejected.fetch_add(1, Relaxed);
                    self.p.stats.count_frame(None, FrameResult::Failed);
                    self.p.events.emit(EventBody::InputRejected {
                        source: None,
                        image: None,
                        topic: Some(topic),
                        stage: InputStage::Intake,
                        reason: "intake full (agent overloaded)".into(),
                    });
                    return;
                }
                self.images_waiting.push_back((self.gen, Incoming { topic, payload, properties }, ack));
                self.feed_images();
            }
        }
    }

    /// Hands waiting images to the MQTT source while it has room, and acknowledges each to the
    /// broker once handed over (on the connection it came on; an image from an earlier
    /// connection is taken in without one, the broker having dropped that session).
    fn feed_images(&mut self) {
        while let Some((gen, m, ack)) = self.images_waiting.pop_front() {
            match self.p.images.try_send(m) {
                Ok(()) => {
                    if let (true, Some(c)) = (gen == self.gen, &self.client) {
                        if c.try_ack(&ack).is_err() {
                            self.acks_owed.push_back((gen, ack));
                        }
                    }
                }
                Err(mpsc::error::TrySendError::Full(m)) => {
                    self.images_waiting.push_front((gen, m, ack));
                    break;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    self.images_waiting.clear();
                    break;
                }
            }
        }
        // acknowledgements the client's request queue had no room for
        while let Some((gen, ack)) = self.acks_owed.pop_front() {
            match &self.client {
                Some(c) if gen == self.gen => {
                    if let Err(MqttError::QueueFull) = c.try_ack(&ack) {
                        self.acks_owed.push_front((gen, ack));
                        break;
                    }
                }
                _ => {}
            }
        }
    }

    fn schedule_reconnect(&mut self) {
        let jitter = Duration::from_millis(
            u64::from(SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.subsec_millis()).unwrap_or(0)) % 100,
        );
        self.reconnect_at = Some(tokio::time::Instant::now() + self.backoff + jitter);
        self.backoff = (self.backoff * 2).min(self.cfg.mqtt.reconnect_max);
    }

    fn delivered(&mut self, f: InFlight, error: Option<String>) {
        if f.msg.kind == Kind::Detection {
            if let Some(e) = error {
                let Msg { topic, payload, origin, .. } = f.msg;
                self.dead_letter(topic, &payload, origin, format!("refused by the broker: {e}"));
                return;
            }
            self.p.stats.detections_acked.fetch_add(1, Relaxed);
            self.p.stats.record(Stage::Publish, f.sent.elapsed().as_secs_f64() * 1e3);
            self.careful = self.careful.saturating_sub(1);
        }
        if let Origin::Spool(id) = &f.msg.origin {
            self.suspects.remove(id);
        }
        match f.msg.origin {
            Origin::Live(c) => {
                if let Err(e) = c.done() {
                    tracing::error!("cannot move input to done/: {e}");
                }
            }
            Origin::Spool(id) => {
                self.p.stats.spool_replayed.fetch_add(1, Relaxed);
                if let Err(e) = self.p.spool.remove(id) {
                    tracing::error!("{e}");
                }
            }
            Origin::None => {}
        }
    }

    /// Hands a message to the client; false when it could not be queued.
    fn send(&mut self, msg: Msg) -> bool {
        let Some(c) = &self.client else {
            self.requeue(msg);
            return false;
        };
        match c.try_publish(&msg.topic, msg.qos, msg.retain, msg.payload.clone()) {
            Ok(()) => {
                if msg.kind == Kind::Detection {
                    self.p.stats.detections_published.fetch_add(1, Relaxed);
                }
                self.window.push_back(InFlight { msg, pkid: None, sent: Instant::now() });
                true
            }
            Err(e) => {
                tracing::warn!("publish not queued: {e}");
                self.requeue(msg);
                false
            }
        }
    }

    fn requeue(&mut self, msg: Msg) {
        match msg.origin {
            Origin::Spool(_) => self.p.spool.rewind(),
            Origin::Live(_) if msg.kind == Kind::Detection => {
                self.spool_msg(msg);
            }
            _ if msg.kind == Kind::Event => self.resend.push_front(msg),
            _ => {}
        }
    }

    /// Publishes queued work while connected and the in-flight window has room: first what
    /// must be re-sent, then events, then the spool (oldest first).
    fn pump(&mut self) {
        while self.connected && self.window.len() < self.max_inflight() {
            if self.careful > 0 && self.window.iter().any(|f| f.msg.kind == Kind::Detection) {
                break;
            }
            let msg = if let Some(m) = self.resend.pop_front() {
                m
            } else {
                match self.p.spool.next_unsent() {
                    Ok(Some(e)) if self.suspects.get(&e.id).is_some_and(|&n| n >= POISON_DROPS) => {
                        let reason =
                            format!("the broker dropped the connection each of the {POISON_DROPS} times this message was sent alone");
                        self.dead_letter(e.topic, &e.payload, Origin::Spool(e.id), reason);
                        continue;
                    }
                    Ok(Some(e)) => Msg {
                        topic: e.topic,
                        payload: e.payload,
                        retain: false,
                        qos: self.cfg.mqtt.qos,
                        kind: Kind::Detection,
                        origin: Origin::Spool(e.id),
                    },
                    Ok(None) => break,
                    Err(e) => {
                        tracing::error!("skipping unreadable spool entry: {e}");
                        self.p.events.emit(EventBody::SpoolError { error: e.to_string() });
                        let (crate::agent::spool::SpoolError::Corrupt { path } | crate::agent::spool::SpoolError::Io { path, .. }) = &e;
                        {
                            if let Some(id) = path.file_stem().and_then(|s| s.to_str()).and_then(|s| s.parse().ok()) {
                                self.p.spool.discard(id);
                            }
                        }
                        continue;
                    }
                }
            };
            if !self.send(msg) {
                break;
            }
        }
    }

    /// The retained `info` message, built now.
    fn info_msg(&self) -> Msg {
        let payload = serde_json::to_vec(&(self.p.info)()).unwrap_or_default();
        Msg { topic: self.topic("info"), payload, retain: true, qos: 1, kind: Kind::Other, origin: Origin::None }
    }

    fn on_event(&mut self, body: EventBody) {
        let republish_info = body.changes_info();
        let (device_id, boot_id) = (self.cfg.mqtt.device_id.clone(), self.p.boot_id.clone());
        let event = messages::Event { v: messages::VERSION, device_id, boot_id, ts: now_ts(), body };
        let payload = serde_json::to_vec(&event).unwrap_or_default();
        let msg = Msg { topic: self.topic("events"), payload, retain: false, qos: 1, kind: Kind::Event, origin: Origin::None };
        if self.resend.len() >= MAX_PENDING_EVENTS {
            self.p.stats.events_dropped.fetch_add(1, Relaxed);
            if let Some(i) = self.resend.iter().position(|m| m.kind == Kind::Event) {
                self.resend.remove(i);
            }
        }
        self.resend.push_back(msg);
        if republish_info && self.connected {
            let info = self.info_msg();
            self.resend.push_back(info);
        }
    }

    fn on_outcome(&mut self, o: Outcome) {
        match o {
            Outcome::Detected { job, w, h, batch_size, decode_ms, infer_ms, detections, model } => {
                let t = Instant::now();
                self.p.stats.count_frame(Some(&job.source), FrameResult::Ok);
                self.seq += 1;
                let image = match &job.image {
                    ImageRef::Path(p) => FrameImage::Path { path: p.to_string_lossy().into_owned(), w, h },
                    ImageRef::Id(i) => FrameImage::Id { id: i.clone(), w, h },
                    ImageRef::Frame(m) => FrameImage::Stream {
                        stream: job.source.to_string(),
                        frame: m.index,
                        pts_ms: m.pts_ns.map(|ns| round3(ns as f64 / 1e6)),
                        capture_ts: ts_of(m.capture),
                        w,
                        h,
                    },
                };
                let mut v = messages::Detections {
                    v: messages::VERSION,
                    device_id: self.cfg.mqtt.device_id.clone(),
                    boot_id: self.p.boot_id.clone(),
                    seq: self.seq,
                    ts: now_ts(),
                    source: job.source.to_string(),
                    image,
                    model: model.to_string(),
                    batch_size,
                    latency_ms: FrameLatency { decode: round3(decode_ms), infer: round3(infer_ms), post: 0.0, capture_to_publish: None },
                    detections,
                };
                let post = t.elapsed().as_secs_f64() * 1e3;
                v.latency_ms.post = round3(post);
                if let ImageRef::Frame(m) = &job.image {
                    let ms = m.captured_at.elapsed().as_secs_f64() * 1e3;
                    v.latency_ms.capture_to_publish = Some(round3(ms));
                    if let Some(s) = self.p.stats.stream(&job.source) {
                        s.record_published(ms);
                    }
                }
                self.p.stats.record(Stage::Post, post);
                let msg = Msg {
                    topic: self.topic(&format!("detections/{}", job.source)),
                    payload: serde_json::to_vec(&v).unwrap_or_default(),
                    retain: false,
                    qos: self.cfg.mqtt.qos,
                    kind: Kind::Detection,
                    origin: Origin::Live(job.completion),
                };
                if self.live_ok() && self.window.len() < self.max_inflight() {
                    self.send(msg);
                } else {
                    self.spool_msg(msg);
                }
            }
            Outcome::Failed { job, stage, reason } => {
                self.p.stats.count_frame(Some(&job.source), FrameResult::Failed);
                self.p.stats.inputs_rejected.fetch_add(1, Relaxed);
                let image = match &job.image {
                    ImageRef::Path(p) => ImageName::Path { path: p.to_string_lossy().into_owned() },
                    ImageRef::Id(i) => ImageName::Id { id: i.clone() },
                    ImageRef::Frame(m) => ImageName::Stream { stream: job.source.to_string(), frame: m.index },
                };
                let moved = job.completion.failed(&format!("{stage}: {reason}"));
                if let Err(e) = &moved {
                    tracing::error!("cannot move input to failed/: {e}");
                }
                let source = Some(job.source.to_string());
                self.p.events.emit(EventBody::InputRejected { source, image: Some(image), topic: None, stage, reason });
            }
        }
    }

    /// One reading of the memory watchdog; an event when it crosses a threshold.
    fn watch_memory(&mut self) {
        let cfg = self.cfg.watchdog;
        let Some(r) = watchdog::Reading::from_memory(&self.p.memory.query(), &cfg) else { return };
        if let Some(e) = self.watchdog.observe(&r, &cfg) {
            self.p.events.emit(e);
        }
        self.p.stats.memory_high.store(self.watchdog.is_high(), Relaxed);
    }

    fn telemetry(&mut self) {
        let mem = self.p.memory.query();
        let budget = self.p.stats.plan_budget.load(Relaxed);
        // what the pool reserves above the model (CUDA, after a plan; None: not watched)
        let above = match (self.p.stats.budget_watch.get(), mem.process_reserved) {
            (Some(&base), Some(r)) => Some(r.saturating_sub(base)),
            _ => None,
        };
        if let Some(over) = telemetry::budget_crossing(self.over_budget, above, budget) {
            self.over_budget = over;
            let g = |a: &std::sync::atomic::AtomicU64| a.load(Relaxed);
            let figures = MemoryBudget {
                reserved: mem.process_reserved,
                reserved_for_batches: above,
                budget,
                verified_peak: g(&self.p.stats.plan_verified_peak),
                batch: g(&self.p.stats.batch_current),
                note: if over {
                    "the memory pool holds more than the planner verified for this batch (its reservation varies from run to run); \
                     memory_fraction leaves the margin, and an out-of-memory error would split the batch"
                } else {
                    "back within the planner's budget"
                }
                .into(),
            };
            self.p.events.emit(if over { EventBody::MemoryOverBudget(figures) } else { EventBody::MemoryWithinBudget(figures) });
        }
        let fps = self.fps.tick(self.p.stats.frames_ok.load(Relaxed));
        self.update_gauges();
        let uptime = self.started.elapsed().as_secs_f64();
        let v = telemetry::snapshot(&self.p.stats, &mem, fps, uptime, &self.cfg.mqtt.device_id, &self.p.boot_id, now_ts());
        let msg = Msg {
            topic: self.topic("telemetry"),
            payload: serde_json::to_vec(&v).unwrap_or_default(),
            retain: false,
            qos: 1,
            kind: Kind::Other,
            origin: Origin::None,
        };
        if self.connected && self.window.len() < self.max_inflight() + 16 {
            self.send(msg);
        } else if !self.connected {
            // the counters are cumulative: the latest snapshot accounts for everything offline
            self.pending_telemetry = Some(msg);
        }
    }

    /// Last words: unacknowledged detections to the spool, `offline` retained, disconnect.
    async fn finish(&mut self) {
        if self.connected {
            // give pending events a last chance
            let until = tokio::time::Instant::now() + Duration::from_secs(2);
            self.pump();
            while !self.window.is_empty() && tokio::time::Instant::now() < until {
                self.pump();
                match tokio::time::timeout_at(until, self.wait_conn()).await {
                    Ok(Some((g, ev))) if g == self.gen => self.on_conn(ev),
                    Ok(Some(_)) => {}
                    _ => break,
                }
            }
        }
        let window: Vec<InFlight> = self.window.drain(..).collect();
        for f in window {
            if f.msg.kind == Kind::Detection && matches!(f.msg.origin, Origin::Live(_)) {
                self.spool_msg(f.msg);
            }
        }
        for m in std::mem::take(&mut self.resend) {
            if m.kind == Kind::Detection {
                self.spool_msg(m);
            }
        }
        if self.connected {
            let status = self.topic("status");
            let offline = Status::Offline.as_payload().into();
            self.send(Msg { topic: status, payload: offline, retain: true, qos: 1, kind: Kind::Other, origin: Origin::None });
            let until = tokio::time::Instant::now() + Duration::from_secs(3);
            while !self.window.is_empty() {
                match tokio::time::timeout_at(until, self.wait_conn()).await {
                    Ok(Some((g, ev))) if g == self.gen => self.on_conn(ev),
                    Ok(Some(_)) => {}
                    _ => break,
                }
                if !self.connected {
                    break;
                }
            }
            if let Some(c) = &self.client {
                c.try_disconnect();
            }
            tracing::info!("published offline; disconnected");
        }
        self.update_gauges();
    }

    async fn wait_conn(&mut self) -> Option<(u64, ConnEvent)> {
        self.conn_rx.recv().await
    }
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}
