//! MQTT image messages as they come from the broker: the bytes of a PUBLISH packet (MQTT 5, and
//! 3.1.1), read by rumqttc with the agent's packet size cap, turned into an `Incoming` as the
//! connection does, then `sources::mqtt::intake` (topic filters, source id from the user
//! property or the topic, image id, empty payloads) and, for a job, the decode and letterbox of
//! its payload.
#![no_main]

use std::sync::atomic::AtomicU64;

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use yolo_edge::agent::mqtt::{max_incoming_packet, Incoming};
use yolo_edge::agent::pipeline::JobData;
use yolo_edge::agent::sources::mqtt::{intake, Intake, MqttSource};
use yolo_edge::vision::preprocess::{decode_image, letterbox, DecodeLimits};

#[path = "common/decoder_panics.rs"]
mod decoder_panics;

/// `input.max_bytes` of the fuzzed agent (the packet cap follows from it).
const MAX_BYTES: u64 = 1 << 20;

fn sources() -> Vec<MqttSource> {
    vec![
        MqttSource { id: None, filter: "cams/+/jpeg".into(), id_level: 2 },
        MqttSource { id: Some("door".into()), filter: "door/#".into(), id_level: 0 },
        MqttSource { id: None, filter: "site/#".into(), id_level: 0 },
    ]
}

fn handle(sources: &[MqttSource], m: Incoming, counter: &AtomicU64) {
    if let Intake::Job(job) = intake(sources, m, counter) {
        if let JobData::Bytes(b) = &job.data {
            let limits = DecodeLimits { max_pixels: 4_000_000, max_bytes: MAX_BYTES, ..DecodeLimits::default() };
            if let Ok(img) = decode_image(b, &limits) {
                let _ = letterbox(&img, 64);
            }
        }
    }
}

fuzz_target!(init: decoder_panics::let_decoder_panics_unwind(), |data: &[u8]| {
    let sources = sources();
    let counter = AtomicU64::new(0);
    let max = max_incoming_packet(MAX_BYTES);
    let mut buf = BytesMut::from(data);
    while let Ok(p) = rumqttc::v5::mqttbytes::v5::Packet::read(&mut buf, Some(max as u32)) {
        if let rumqttc::v5::mqttbytes::v5::Packet::Publish(p) = p {
            let m = Incoming {
                topic: String::from_utf8_lossy(&p.topic).into_owned(),
                payload: p.payload.to_vec(),
                properties: p.properties.map(|pr| pr.user_properties).unwrap_or_default(),
            };
            handle(&sources, m, &counter);
        }
    }
    let mut buf = BytesMut::from(data);
    if let Ok(rumqttc::Packet::Publish(p)) = rumqttc::Packet::read(&mut buf, max) {
        handle(&sources, Incoming { topic: p.topic, payload: p.payload.to_vec(), properties: vec![] }, &counter);
    }
});
