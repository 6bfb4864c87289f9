//! The fleet as its subscribers see it: every agent's retained `status` and `info` and its
//! latest `telemetry`, folded into one row per device (`yolo-edge fleet`). Reads only the wire
//! types of [`super::messages`]; a message that does not parse is counted, never trusted.

use std::collections::BTreeMap;

use serde::Serialize;

use super::messages::{Info, Status, Telemetry};

/// One agent, as its last messages describe it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FleetRow {
    pub device_id: String,
    /// `status`: true online, false offline (clean stop or Last Will), None not seen.
    pub online: Option<bool>,
    /// Model label (variant and file) from `info`.
    pub model: Option<String>,
    /// Device and dtype from `info`, e.g. `cuda:0 (NVIDIA H200)` and `f16`.
    pub device: Option<String>,
    pub dtype: Option<String>,
    /// Current batch (telemetry, else `info`).
    pub batch: Option<u64>,
    /// Process memory in use and the planner's budget, bytes (telemetry).
    pub memory_used: Option<u64>,
    pub memory_budget: Option<u64>,
    /// Pictures per second and p99 inference latency (ms) in the latest telemetry.
    pub fps: Option<f64>,
    pub infer_p99_ms: Option<f32>,
    /// Frames finished, from the latest telemetry.
    pub frames_ok: Option<u64>,
    /// `ts` of the latest telemetry (RFC 3339).
    pub last_seen: Option<String>,
}

/// The fleet under one topic prefix.
#[derive(Debug, Default)]
pub struct Fleet {
    prefix: String,
    rows: BTreeMap<String, FleetRow>,
    /// Messages on watched topics that did not parse.
    pub malformed: u64,
}

/// At most this many devices are tracked (a broker open to many publishers cannot grow the
/// table without bound).
pub const MAX_DEVICES: usize = 100_000;

impl Fleet {
    pub fn new(prefix: &str) -> Self {
        Self { prefix: prefix.to_string(), ..Default::default() }
    }

    /// The topic filters to subscribe to.
    pub fn filters(&self) -> [String; 3] {
        ["status", "info", "telemetry"].map(|leaf| format!("{}/+/{leaf}", self.prefix))
    }

    /// Folds one message in; returns whether it was one of the fleet's.
    pub fn update(&mut self, topic: &str, payload: &[u8]) -> bool {
        let Some(rest) = topic.strip_prefix(&self.prefix).and_then(|r| r.strip_prefix('/')) else { return false };
        let Some((device, leaf)) = rest.split_once('/') else { return false };
        if device.is_empty() || leaf.contains('/') || (!self.rows.contains_key(device) && self.rows.len() >= MAX_DEVICES) {
            return false;
        }
        match leaf {
            "status" => match Status::parse(payload) {
                Some(st) => self.entry(device).online = Some(st == Status::Online),
                None => self.malformed += 1,
            },
            "info" => match serde_json::from_slice::<Info>(payload) {
                Ok(i) => {
                    let r = self.entry(device);
                    r.model = Some(i.model.label.clone());
                    r.device = Some(i.device.clone());
                    r.dtype = Some(i.dtype.clone());
                    r.batch = r.batch.or(Some(i.batch_plan.current));
                }
                Err(_) => self.malformed += 1,
            },
            "telemetry" => match serde_json::from_slice::<Telemetry>(payload) {
                Ok(t) => {
                    let r = self.entry(device);
                    r.batch = Some(t.batch.current);
                    r.memory_used = t.process_memory.used.or(t.process_memory.rss);
                    r.memory_budget = t.batch.budget;
                    r.fps = Some(t.fps);
                    r.infer_p99_ms = Some(t.latency_ms.infer.p99);
                    r.frames_ok = Some(t.frames.ok);
                    r.last_seen = Some(t.ts.clone());
                }
                Err(_) => self.malformed += 1,
            },
            _ => return false,
        }
        true
    }

    fn entry(&mut self, device: &str) -> &mut FleetRow {
        self.rows.entry(device.to_string()).or_insert_with(|| FleetRow { device_id: device.to_string(), ..Default::default() })
    }

    /// One row per device, by device id.
    pub fn rows(&self) -> Vec<FleetRow> {
        self.rows.values().cloned().collect()
    }

    /// The rows as a fixed-width table for a terminal.
    pub fn table(&self) -> String {
        let mib = |b: Option<u64>| b.map_or("-".to_string(), |b| format!("{}", b >> 20));
        let opt = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".into());
        let mut out = format!(
            "{:<20} {:<8} {:<28} {:<24} {:<5} {:>5} {:>9} {:>9} {:>8} {:>8} {:<24}\n",
            "DEVICE", "STATUS", "MODEL", "ON", "DTYPE", "BATCH", "MEM MiB", "BUDGET", "IMG/S", "P99 ms", "LAST SEEN"
        );
        for r in self.rows.values() {
            out.push_str(&format!(
                "{:<20} {:<8} {:<28} {:<24} {:<5} {:>5} {:>9} {:>9} {:>8} {:>8} {:<24}\n",
                r.device_id,
                match r.online {
                    Some(true) => "online",
                    Some(false) => "offline",
                    None => "?",
                },
                opt(&r.model),
                opt(&r.device),
                opt(&r.dtype),
                r.batch.map_or("-".into(), |b| b.to_string()),
                mib(r.memory_used),
                mib(r.memory_budget),
                r.fps.map_or("-".into(), |f| format!("{f:.1}")),
                r.infer_p99_ms.map_or("-".into(), |p| format!("{p:.1}")),
                opt(&r.last_seen),
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_fold_status_and_ignore_foreign_or_malformed_messages() {
        let mut f = Fleet::new("yolo-edge");
        assert_eq!(f.filters()[0], "yolo-edge/+/status");
        assert!(f.update("yolo-edge/box-1/status", b"online"));
        assert!(f.update("yolo-edge/box-2/status", b"offline"));
        assert!(!f.update("other/box-3/status", b"online"));
        assert!(!f.update("yolo-edge/box-1/detections/cam", b"{}"));
        assert!(f.update("yolo-edge/box-1/telemetry", b"not json"));
        assert!(f.update("yolo-edge/box-1/status", b"maybe"));
        assert_eq!(f.malformed, 2);
        let rows = f.rows();
        assert_eq!(
            rows.iter().map(|r| (r.device_id.as_str(), r.online)).collect::<Vec<_>>(),
            [("box-1", Some(true)), ("box-2", Some(false))]
        );
        assert!(f.table().lines().nth(1).unwrap().starts_with("box-1"));
    }
}
