//! MQTT connection (rumqttc, protocol 3.1.1 or 5, TLS via rustls, username/password, Last Will):
//! one connection attempt per [`connect`], whose event loop runs in its own task and reports
//! normalised [`ConnEvent`]s (publish packet ids, acknowledgements, refusals, incoming images).
//!
//! On the agent's connection, incoming QoS 1 messages are acknowledged by the agent ([`Ack`])
//! once it has taken them in: a busy agent holds the broker back (the broker sends at most its in-flight
//! window of unacknowledged messages, [`RECEIVE_MAXIMUM`] on MQTT 5) instead of dropping
//! pictures, and the rest wait at the broker, or go to the other members of a shared
//! subscription.

use rumqttc::{Outgoing, QoS, TlsConfiguration, Transport};
use tokio::sync::mpsc;

use crate::agent::config::{MqttConfig, Protocol};
use crate::agent::messages::Status;

/// A message that arrived on a subscribed topic (an image for the MQTT source).
#[derive(Debug)]
pub struct Incoming {
    pub topic: String,
    pub payload: Vec<u8>,
    pub properties: Vec<(String, String)>,
}

#[derive(Debug, thiserror::Error)]
pub enum MqttError {
    #[error("MQTT client request queue is full")]
    QueueFull,
    #[error("MQTT client is closed: {0}")]
    Closed(String),
}

/// Unacknowledged QoS 1 messages an MQTT 5 broker may send the agent at once (CONNECT's Receive
/// Maximum). A 3.1.1 broker uses its own window (Mosquitto's `max_inflight_messages`, 20).
pub const RECEIVE_MAXIMUM: u16 = 32;

/// The acknowledgement an incoming message is owed, sent with [`Client::try_ack`] on the
/// connection it came on once the agent has taken the message in.
#[derive(Debug, Clone)]
pub enum Ack {
    /// QoS 0, or a connection that acknowledges by itself: nothing to send.
    None,
    /// The packet, payload dropped, whose PUBACK is owed.
    V4(Box<rumqttc::Publish>),
    V5(Box<rumqttc::v5::mqttbytes::v5::Publish>),
}

/// What a connection reports; `gen` tells connections apart across reconnects.
#[derive(Debug)]
pub enum ConnEvent {
    /// CONNACK accepted.
    Connected,
    /// CONNACK refused (bad credentials, not authorised, ...).
    Refused { reason: String, auth: bool },
    /// The connection ended (network error, broker gone, TLS failure).
    Disconnected(String),
    /// A publish request was written with this packet id (0 for QoS 0), in request order.
    Sent(u16),
    /// The broker acknowledged the QoS 1 publish with this packet id; `error` is set when an
    /// MQTT 5 broker refused it (reason code >= 0x80).
    Acked { pkid: u16, error: Option<String> },
    /// A message on a subscribed topic, and the acknowledgement it is owed.
    Message { topic: String, payload: Vec<u8>, properties: Vec<(String, String)>, ack: Ack },
}

/// A connection's request side.
#[derive(Clone)]
pub enum Client {
    V4(rumqttc::AsyncClient),
    V5(rumqttc::v5::AsyncClient),
}

fn qos(q: u8) -> QoS {
    if q == 0 {
        QoS::AtMostOnce
    } else {
        QoS::AtLeastOnce
    }
}

fn qos5(q: u8) -> rumqttc::v5::mqttbytes::QoS {
    if q == 0 {
        rumqttc::v5::mqttbytes::QoS::AtMostOnce
    } else {
        rumqttc::v5::mqttbytes::QoS::AtLeastOnce
    }
}

impl Client {
    pub fn try_publish(&self, topic: &str, q: u8, retain: bool, payload: Vec<u8>) -> Result<(), MqttError> {
        let r = match self {
            Client::V4(c) => c.try_publish(topic, qos(q), retain, payload).map_err(|e| e.to_string()),
            Client::V5(c) => c.try_publish(topic, qos5(q), retain, payload).map_err(|e| e.to_string()),
        };
        r.map_err(|e| if e.contains("full") || e.contains("Full") { MqttError::QueueFull } else { MqttError::Closed(e) })
    }

    pub fn try_subscribe(&self, filter: &str) -> Result<(), MqttError> {
        match self {
            Client::V4(c) => c.try_subscribe(filter, QoS::AtLeastOnce).map_err(|e| MqttError::Closed(e.to_string())),
            Client::V5(c) => {
                c.try_subscribe(filter, rumqttc::v5::mqttbytes::QoS::AtLeastOnce).map_err(|e| MqttError::Closed(e.to_string()))
            }
        }
    }

    pub fn try_unsubscribe(&self, filter: &str) -> Result<(), MqttError> {
        match self {
            Client::V4(c) => c.try_unsubscribe(filter).map_err(|e| MqttError::Closed(e.to_string())),
            Client::V5(c) => c.try_unsubscribe(filter).map_err(|e| MqttError::Closed(e.to_string())),
        }
    }

    /// Sends the acknowledgement `ack` is owed (nothing for [`Ack::None`]). It must go on the
    /// connection the message came on.
    pub fn try_ack(&self, ack: &Ack) -> Result<(), MqttError> {
        let r = match (self, ack) {
            (_, Ack::None) => return Ok(()),
            (Client::V4(c), Ack::V4(p)) => c.try_ack(p).map_err(|e| e.to_string()),
            (Client::V5(c), Ack::V5(p)) => c.try_ack(p).map_err(|e| e.to_string()),
            _ => return Err(MqttError::Closed("acknowledgement for another protocol".into())),
        };
        r.map_err(|e| if e.contains("full") || e.contains("Full") { MqttError::QueueFull } else { MqttError::Closed(e) })
    }

    pub fn try_disconnect(&self) {
        let _ = match self {
            Client::V4(c) => c.try_disconnect().map_err(|e| e.to_string()),
            Client::V5(c) => c.try_disconnect().map_err(|e| e.to_string()),
        };
    }
}

fn transport(cfg: &MqttConfig) -> Transport {
    match &cfg.tls {
        None => Transport::Tcp,
        Some(t) => {
            Transport::tls_with_config(TlsConfiguration::Simple { ca: t.ca.clone(), alpn: None, client_auth: t.client_auth.clone() })
        }
    }
}

/// Largest packet the agent publishes: detections, telemetry, info and events are kilobytes.
const MAX_OUTGOING_PACKET: usize = 16 << 20;
/// Room for the topic and properties of an incoming image beside its payload.
const INCOMING_OVERHEAD: usize = 64 << 10;

/// The largest packet accepted from the broker: an image of `input.max_bytes` with its topic and
/// properties. On MQTT 5 the broker is told (CONNECT's Maximum Packet Size) and does not send
/// larger ones; on 3.1.1 a larger packet ends the connection, which is then made again.
pub fn max_incoming_packet(input_max_bytes: u64) -> usize {
    usize::try_from(input_max_bytes).unwrap_or(usize::MAX).saturating_add(INCOMING_OVERHEAD)
}

/// Starts one connection attempt: the returned client queues requests (`cap` deep); the event
/// loop runs in a task until the connection ends, sending `(gen, event)` to `events`. Packets
/// from the broker are accepted up to `max_incoming` bytes ([`max_incoming_packet`]).
/// Incoming QoS 1 messages are acknowledged by the caller ([`Client::try_ack`]).
pub fn connect(cfg: &MqttConfig, max_incoming: usize, cap: usize, gen: u64, events: mpsc::Sender<(u64, ConnEvent)>) -> Client {
    connect_with(cfg, max_incoming, cap, gen, events, true)
}

/// [`connect`] for a client that only watches (`yolo-edge fleet`): no Last Will, so that
/// closing it never marks the agent whose config it borrowed as offline; incoming messages are
/// acknowledged by the connection itself.
pub fn connect_observer(cfg: &MqttConfig, cap: usize, events: mpsc::Sender<(u64, ConnEvent)>) -> Client {
    connect_with(cfg, 1 << 20, cap, 0, events, false)
}

/// `agent`: the agent's own connection (Last Will, acknowledgements by the caller).
fn connect_with(
    cfg: &MqttConfig,
    max_incoming: usize,
    cap: usize,
    gen: u64,
    events: mpsc::Sender<(u64, ConnEvent)>,
    agent: bool,
) -> Client {
    let status = cfg.topic("status");
    let inflight = cfg.max_inflight.clamp(1, u16::MAX as usize - 1) as u16;
    match cfg.protocol {
        Protocol::V311 => {
            let mut o = rumqttc::MqttOptions::new(&cfg.client_id, &cfg.host, cfg.port);
            o.set_keep_alive(cfg.keepalive)
                .set_clean_session(true)
                .set_inflight(inflight)
                .set_max_packet_size(max_incoming, MAX_OUTGOING_PACKET)
                .set_manual_acks(agent)
                .set_transport(transport(cfg));
            if agent {
                o.set_last_will(rumqttc::LastWill::new(status, Status::Offline.as_payload(), QoS::AtLeastOnce, true));
            }
            if let Some(u) = &cfg.username {
                o.set_credentials(u, cfg.password.clone().unwrap_or_default());
            }
            let (client, el) = rumqttc::AsyncClient::new(o, cap);
            tokio::spawn(run_v4(el, gen, events, agent));
            Client::V4(client)
        }
        Protocol::V5 => {
            use rumqttc::v5::mqttbytes::v5::LastWill;
            let mut o = rumqttc::v5::MqttOptions::new(&cfg.client_id, &cfg.host, cfg.port);
            o.set_keep_alive(cfg.keepalive)
                .set_clean_start(true)
                .set_outgoing_inflight_upper_limit(inflight)
                .set_max_packet_size(Some(u32::try_from(max_incoming).unwrap_or(u32::MAX)))
                .set_manual_acks(agent)
                .set_receive_maximum(Some(RECEIVE_MAXIMUM))
                .set_transport(transport(cfg));
            if agent {
                o.set_last_will(LastWill::new(status, Status::Offline.as_payload(), rumqttc::v5::mqttbytes::QoS::AtLeastOnce, true, None));
            }
            if let Some(u) = &cfg.username {
                o.set_credentials(u, cfg.password.clone().unwrap_or_default());
            }
            let (client, el) = rumqttc::v5::AsyncClient::new(o, cap);
            tokio::spawn(run_v5(el, gen, events, agent));
            Client::V5(client)
        }
    }
}

async fn run_v4(mut el: rumqttc::EventLoop, gen: u64, tx: mpsc::Sender<(u64, ConnEvent)>, manual_acks: bool) {
    use rumqttc::{ConnectReturnCode as C, ConnectionError as E, Event, Packet};
    loop {
        let ev = match el.poll().await {
            Ok(Event::Incoming(Packet::ConnAck(_))) => ConnEvent::Connected,
            Ok(Event::Incoming(Packet::PubAck(a))) => ConnEvent::Acked { pkid: a.pkid, error: None },
            Ok(Event::Incoming(Packet::Publish(mut p))) => {
                let payload = std::mem::take(&mut p.payload).to_vec();
                let ack = if manual_acks && p.qos != QoS::AtMostOnce { Ack::V4(Box::new(p.clone())) } else { Ack::None };
                ConnEvent::Message { topic: p.topic, payload, properties: vec![], ack }
            }
            Ok(Event::Outgoing(Outgoing::Publish(pkid))) => ConnEvent::Sent(pkid),
            Ok(_) => continue,
            Err(E::ConnectionRefused(code)) => {
                let auth = matches!(code, C::BadUserNamePassword | C::NotAuthorized);
                let _ = tx.send((gen, ConnEvent::Refused { reason: format!("{code:?}"), auth })).await;
                return;
            }
            Err(e) => {
                let _ = tx.send((gen, ConnEvent::Disconnected(e.to_string()))).await;
                return;
            }
        };
        if tx.send((gen, ev)).await.is_err() {
            return;
        }
    }
}

async fn run_v5(mut el: rumqttc::v5::EventLoop, gen: u64, tx: mpsc::Sender<(u64, ConnEvent)>, manual_acks: bool) {
    use rumqttc::v5::mqttbytes::v5::{ConnectReturnCode as C, Packet, PubAckReason};
    use rumqttc::v5::{ConnectionError as E, Event};
    loop {
        let ev = match el.poll().await {
            Ok(Event::Incoming(Packet::ConnAck(_))) => ConnEvent::Connected,
            Ok(Event::Incoming(Packet::PubAck(a))) => {
                let error = match a.reason {
                    PubAckReason::Success | PubAckReason::NoMatchingSubscribers => None,
                    r => Some(format!("{r:?}")),
                };
                ConnEvent::Acked { pkid: a.pkid, error }
            }
            Ok(Event::Incoming(Packet::Publish(mut p))) => {
                let payload = std::mem::take(&mut p.payload).to_vec();
                let properties = p.properties.take().map(|pr| pr.user_properties).unwrap_or_default();
                let ack =
                    if manual_acks && p.qos != rumqttc::v5::mqttbytes::QoS::AtMostOnce { Ack::V5(Box::new(p.clone())) } else { Ack::None };
                ConnEvent::Message { topic: String::from_utf8_lossy(&p.topic).into_owned(), payload, properties, ack }
            }
            Ok(Event::Outgoing(Outgoing::Publish(pkid))) => ConnEvent::Sent(pkid),
            Ok(_) => continue,
            Err(E::ConnectionRefused(code)) => {
                let auth = matches!(code, C::BadUserNamePassword | C::NotAuthorized | C::BadAuthenticationMethod | C::Banned);
                let _ = tx.send((gen, ConnEvent::Refused { reason: format!("{code:?}"), auth })).await;
                return;
            }
            Err(e) => {
                let _ = tx.send((gen, ConnEvent::Disconnected(e.to_string()))).await;
                return;
            }
        };
        if tx.send((gen, ev)).await.is_err() {
            return;
        }
    }
}
