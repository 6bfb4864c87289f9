//! MQTT image source: JPEG/PNG payloads on subscribed topics. The source id is the configured
//! id, else an MQTT 5 user property `source`, else a topic level (or the whole topic).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use crate::agent::config::{Config, SourceConfig};
use crate::agent::events::EventSink;
use crate::agent::messages::{EventBody, ImageName, InputStage};
use crate::agent::mqtt::Incoming;
use crate::agent::pipeline::{Completion, ImageRef, Job, JobData};
use crate::agent::telemetry::{FrameResult, Stats};

/// A configured image topic.
#[derive(Debug, Clone, PartialEq)]
pub struct MqttSource {
    pub id: Option<String>,
    pub filter: String,
    /// 1-based topic level used as source id (0: the whole topic).
    pub id_level: usize,
}

impl MqttSource {
    /// The image topics `cfg` configures, in its order (the first that matches a message takes it).
    pub fn all(cfg: &Config) -> Vec<Self> {
        cfg.mqtt_sources()
            .filter_map(|s| match s.clone() {
                SourceConfig::Mqtt { id, topic, id_from_topic_level } => Some(Self { id, filter: topic, id_level: id_from_topic_level }),
                _ => None,
            })
            .collect()
    }
}

/// The filter a shared subscription (`$share/<group>/<filter>`, MQTT 5 and Mosquitto's 3.1.1)
/// delivers messages of: incoming messages carry their own topic, never the `$share` prefix.
pub fn unshared(filter: &str) -> &str {
    match filter.strip_prefix("$share/") {
        Some(rest) => rest.split_once('/').map_or("", |(_, f)| f),
        None => filter,
    }
}

/// MQTT topic filter matching (`+` one level, `#` the rest; a shared subscription's filter
/// matches as its `<filter>` part). A wildcard first level does not match a `$` topic.
pub fn matches(filter: &str, topic: &str) -> bool {
    let filter = unshared(filter);
    if filter.is_empty() || topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut t = topic.split('/');
    for f in filter.split('/') {
        match (f, t.next()) {
            ("#", _) => return true,
            ("+", Some(_)) => {}
            (f, Some(l)) if f == l => {}
            _ => return false,
        }
    }
    t.next().is_none()
}

/// The source id of a message: the configured id, else the user property `source`, else the
/// topic level `id_level` (0: the whole topic, `/` written as `_`). An id from the message is
/// checked ([`super::check_source_id`]); one that fails is an error, never rewritten.
fn source_id(src: &MqttSource, m: &Incoming) -> Result<String, String> {
    if let Some(id) = &src.id {
        return Ok(id.clone());
    }
    let id = if let Some((_, v)) = m.properties.iter().find(|(k, _)| k == "source") {
        v.clone()
    } else {
        match m.topic.split('/').nth(src.id_level.wrapping_sub(1)) {
            Some(l) if src.id_level > 0 => l.to_string(),
            _ => m.topic.replace('/', "_"),
        }
    };
    super::check_source_id(&id)?;
    Ok(id)
}

/// The picture id of a message: the user property `image_id` (at most
/// [`super::MAX_IMAGE_ID`] bytes), else `{topic}#{n}`.
fn image_id(m: &Incoming, n: u64) -> Result<String, String> {
    match m.properties.iter().find(|(k, _)| k == "image_id") {
        Some((_, v)) if v.len() > super::MAX_IMAGE_ID => {
            Err(format!("image_id of {} bytes is longer than {} bytes", v.len(), super::MAX_IMAGE_ID))
        }
        Some((_, v)) => Ok(v.clone()),
        None => Ok(format!("{}#{n}", m.topic)),
    }
}

/// What the MQTT source makes of one message.
#[derive(Debug)]
pub enum Intake {
    /// No configured source subscribes to the topic.
    Ignored,
    /// The message is refused; `source` and `image` are set when its ids were valid.
    Rejected { source: Option<String>, image: Option<String>, topic: Option<String>, reason: String },
    /// A picture for the pipeline.
    Job(Job),
}

/// Turns one message into a job for the pipeline, checking its ids and payload; `counter`
/// numbers the messages of subscribed topics (the id of a picture without an `image_id`).
pub fn intake(sources: &[MqttSource], m: Incoming, counter: &AtomicU64) -> Intake {
    let Some(src) = sources.iter().find(|s| matches(&s.filter, &m.topic)) else { return Intake::Ignored };
    let n = counter.fetch_add(1, Relaxed);
    let (id, image_id) = match (source_id(src, &m), image_id(&m, n)) {
        (Ok(id), Ok(image)) => (id, image),
        (Err(reason), _) | (_, Err(reason)) => {
            // the topic names the message (MQTT bounds it; a long one is left out of the event)
            let topic = (m.topic.len() <= 256).then(|| m.topic.clone());
            return Intake::Rejected { source: None, image: None, topic, reason };
        }
    };
    if m.payload.is_empty() {
        return Intake::Rejected { source: Some(id), image: Some(image_id), topic: None, reason: "empty payload".into() };
    }
    Intake::Job(Job {
        source: Arc::from(id.as_str()),
        image: ImageRef::Id(image_id),
        data: JobData::Bytes(m.payload),
        completion: Completion::None,
    })
}

/// Turns incoming messages into jobs until `stop` turns true or the message feed ends, with the
/// image topics of the current config (the publisher subscribes to them; a message of a topic
/// no longer configured, still on its way, is ignored).
pub async fn run(
    mut cfg: watch::Receiver<Arc<Config>>,
    mut incoming: mpsc::Receiver<Incoming>,
    intake_tx: mpsc::Sender<Job>,
    mut stop: watch::Receiver<bool>,
    events: EventSink,
    stats: Arc<Stats>,
) {
    let counter = AtomicU64::new(0);
    let mut sources = MqttSource::all(&cfg.borrow_and_update());
    loop {
        let m = tokio::select! {
            m = incoming.recv() => match m { Some(m) => m, None => return },
            _ = stop.changed() => return,
        };
        if cfg.has_changed().unwrap_or(false) {
            sources = MqttSource::all(&cfg.borrow_and_update());
        }
        let job = match intake(&sources, m, &counter) {
            Intake::Ignored => continue,
            Intake::Rejected { source, image, topic, reason } => {
                stats.inputs_rejected.fetch_add(1, Relaxed);
                stats.count_frame(source.as_deref(), FrameResult::Failed);
                let image = image.map(|id| ImageName::Id { id });
                events.emit(EventBody::InputRejected { source, image, topic, stage: InputStage::Intake, reason });
                continue;
            }
            Intake::Job(job) => job,
        };
        tokio::select! {
            r = intake_tx.send(job) => if r.is_err() { return },
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_filters() {
        assert!(matches("cams/+/jpeg", "cams/a/jpeg"));
        assert!(!matches("cams/+/jpeg", "cams/a/b/jpeg"));
        assert!(matches("cams/#", "cams/a/b"));
        assert!(!matches("cams/a", "cams/a/b"));
        assert!(!matches("#", "$SYS/broker/uptime") && !matches("+/broker/uptime", "$SYS/broker/uptime"));
        assert!(matches("$SYS/#", "$SYS/broker/uptime"));
    }

    #[test]
    fn shared_subscriptions_match_their_filter_part() {
        assert_eq!(unshared("$share/workers/cams/+/jpeg"), "cams/+/jpeg");
        assert_eq!(unshared("cams/+/jpeg"), "cams/+/jpeg");
        assert!(matches("$share/workers/cams/+/jpeg", "cams/door/jpeg"));
        assert!(matches("$share/g/t", "t"));
        assert!(matches("$share/g/#", "site/cam1/jpeg"));
        assert!(!matches("$share/g/t", "$share/g/t"));
        assert!(!matches("$share/g/cams/+/jpeg", "cams/door/png"));
        assert!(!matches("$share/g", "g"));
        // the source id comes from the message's topic, not the filter
        let src = MqttSource { id: None, filter: "$share/workers/cams/+/jpeg".into(), id_level: 2 };
        let m = Incoming { topic: "cams/door/jpeg".into(), payload: vec![], properties: vec![] };
        assert_eq!(source_id(&src, &m).unwrap(), "door");
        let src = MqttSource { id: None, filter: "cams/+/jpeg".into(), id_level: 2 };
        let m = Incoming { topic: "cams/door/jpeg".into(), payload: vec![], properties: vec![] };
        assert_eq!(source_id(&src, &m).unwrap(), "door");
    }

    #[test]
    fn ids_from_outside_are_checked_not_rewritten() {
        let src = MqttSource { id: None, filter: "cams/+/jpeg".into(), id_level: 2 };
        let msg = |topic: &str, props: &[(&str, &str)]| Incoming {
            topic: topic.into(),
            payload: vec![],
            properties: props.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        };
        assert!(source_id(&src, &msg("cams/front door/jpeg", &[])).unwrap_err().contains("' '"));
        let long = "x".repeat(70_000);
        let e = source_id(&src, &msg("cams/a/jpeg", &[("source", &long)])).unwrap_err();
        assert!(e.contains("70000 bytes") && e.len() < 200, "{e}");
        assert!(source_id(&src, &msg("cams/a/jpeg", &[("source", "a+b")])).is_err());
        assert!(source_id(&src, &msg("cams/a/jpeg", &[("source", "")])).is_err());
        assert_eq!(source_id(&src, &msg("cams/a/jpeg", &[("source", "gate-2.east:7@site")])).unwrap(), "gate-2.east:7@site");
        let x128 = "x".repeat(128);
        assert_eq!(source_id(&src, &msg("cams/a/jpeg", &[("source", &x128)])).unwrap(), x128);
        assert!(source_id(&src, &msg("cams/a/jpeg", &[("source", &"x".repeat(129))])).is_err());
        let whole = MqttSource { id: None, filter: "#".into(), id_level: 0 };
        assert_eq!(source_id(&whole, &msg("site/cam1/jpeg", &[])).unwrap(), "site_cam1_jpeg");
        let configured = MqttSource { id: Some("door".into()), ..whole };
        assert_eq!(source_id(&configured, &msg("a b", &[("source", "a b")])).unwrap(), "door");
        assert!(image_id(&msg("t", &[("image_id", &"i".repeat(1025))]), 0).is_err());
        assert_eq!(image_id(&msg("t", &[("image_id", "frame-7")]), 0).unwrap(), "frame-7");
        assert_eq!(image_id(&msg("t", &[]), 3).unwrap(), "t#3");
    }

    #[test]
    fn intake_ignores_other_topics_rejects_bad_ids_and_empty_payloads() {
        let sources = [MqttSource { id: None, filter: "cams/+/jpeg".into(), id_level: 2 }];
        let counter = AtomicU64::new(0);
        let msg = |topic: &str, payload: &[u8]| Incoming { topic: topic.into(), payload: payload.to_vec(), properties: vec![] };
        assert!(matches!(intake(&sources, msg("other/a", b"x"), &counter), Intake::Ignored));
        assert_eq!(counter.load(Relaxed), 0, "only messages of subscribed topics are numbered");
        match intake(&sources, msg("cams/a b/jpeg", b"x"), &counter) {
            Intake::Rejected { source: None, image: None, topic: Some(t), reason } => {
                assert!(t == "cams/a b/jpeg" && reason.contains("' '"))
            }
            other => panic!("{other:?}"),
        }
        match intake(&sources, msg("cams/gate/jpeg", b""), &counter) {
            Intake::Rejected { source: Some(s), image: Some(i), reason, .. } => {
                assert_eq!((s.as_str(), i.as_str(), reason.as_str()), ("gate", "cams/gate/jpeg#1", "empty payload"))
            }
            other => panic!("{other:?}"),
        }
        match intake(&sources, msg("cams/gate/jpeg", b"jpeg"), &counter) {
            Intake::Job(Job { source, image: ImageRef::Id(id), data: JobData::Bytes(b), .. }) => {
                assert_eq!((&*source, id.as_str(), b.as_slice()), ("gate", "cams/gate/jpeg#2", &b"jpeg"[..]))
            }
            other => panic!("{other:?}"),
        }
    }
}
