//! MQTT image source: JPEG/PNG payloads on subscribed topics. The source id is the configured
//! id, else an MQTT 5 user property `source`, else a topic level (or the whole topic).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use crate::agent::events::EventSink;
use crate::agent::messages::{EventBody, ImageName, InputStage};
use crate::agent::mqtt::Incoming;
use crate::agent::pipeline::{Completion, ImageRef, Job, JobData};
use crate::agent::telemetry::Stats;

/// A configured image topic.
#[derive(Debug, Clone)]
pub struct MqttSource {
    pub id: Option<String>,
    pub filter: String,
    /// 1-based topic level used as source id (0: the whole topic).
    pub id_level: usize,
}

/// MQTT topic filter matching (`+` one level, `#` the rest).
pub fn matches(filter: &str, topic: &str) -> bool {
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

fn source_id(src: &MqttSource, m: &Incoming) -> String {
    if let Some(id) = &src.id {
        return id.clone();
    }
    if let Some((_, v)) = m.properties.iter().find(|(k, _)| k == "source") {
        return super::topic_level(v);
    }
    match m.topic.split('/').nth(src.id_level.wrapping_sub(1)) {
        Some(l) if src.id_level > 0 => super::topic_level(l),
        _ => super::topic_level(&m.topic.replace('/', "_")),
    }
}

/// Turns incoming messages into jobs until `stop` turns true or the message feed ends.
pub async fn run(
    sources: Vec<MqttSource>,
    mut incoming: mpsc::Receiver<Incoming>,
    intake: mpsc::Sender<Job>,
    mut stop: watch::Receiver<bool>,
    events: EventSink,
    stats: Arc<Stats>,
) {
    let counter = AtomicU64::new(0);
    loop {
        let m = tokio::select! {
            m = incoming.recv() => match m { Some(m) => m, None => return },
            _ = stop.changed() => return,
        };
        let Some(src) = sources.iter().find(|s| matches(&s.filter, &m.topic)) else { continue };
        let id = source_id(src, &m);
        let n = counter.fetch_add(1, Relaxed);
        let image_id =
            m.properties.iter().find(|(k, _)| k == "image_id").map(|(_, v)| v.clone()).unwrap_or_else(|| format!("{}#{n}", m.topic));
        if m.payload.is_empty() {
            stats.inputs_rejected.fetch_add(1, Relaxed);
            stats.frames_failed.fetch_add(1, Relaxed);
            events.emit(EventBody::InputRejected {
                source: Some(id.clone()),
                image: Some(ImageName::Id { id: image_id }),
                topic: None,
                stage: InputStage::Intake,
                reason: "empty payload".into(),
            });
            continue;
        }
        let job = Job {
            source: Arc::from(id.as_str()),
            image: ImageRef::Id(image_id),
            data: JobData::Bytes(m.payload),
            completion: Completion::None,
        };
        tokio::select! {
            r = intake.send(job) => if r.is_err() { return },
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
        let src = MqttSource { id: None, filter: "cams/+/jpeg".into(), id_level: 2 };
        let m = Incoming { topic: "cams/door/jpeg".into(), payload: vec![], properties: vec![] };
        assert_eq!(source_id(&src, &m), "door");
    }
}
