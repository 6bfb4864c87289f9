//! What the demo makes of the agent's MQTT messages: one readable line per message, the result
//! of every sample picture, the check of the detections against the objects drawn, and the
//! closing summary (pictures, detections per class, batch and why, memory, throughput).

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::time::{Duration, Instant};

use crate::agent::messages::{self, EventBody, Message, Status};
use crate::demo::samples::{DrawnObject, Shape};
use crate::eval::metrics::{match_predictions, LabeledBox};
use crate::vision::postprocess::Detection;

/// The sample classes, in class-id order (what the check needs the model to know).
pub const SAMPLE_CLASSES: [Shape; 5] = [Shape::Circle, Shape::Square, Shape::Triangle, Shape::Star, Shape::Ring];

/// A detection must overlap its drawn object this much (and name its class) to count as found.
pub const MATCH_IOU: f64 = 0.5;

/// What one message changed, for the caller to print (and to annotate a newly reported picture).
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    pub line: String,
    /// The picture whose detections just arrived (first delivery only).
    pub image: Option<String>,
}

/// Everything the subscriber has learned so far.
#[derive(Debug)]
pub struct Observer {
    expected: BTreeMap<String, Vec<DrawnObject>>,
    /// Detections of each reported picture, by file name.
    pub results: BTreeMap<String, Vec<Detection>>,
    /// Pictures the agent rejected, with its reason.
    pub failed: BTreeMap<String, String>,
    /// `(batch_size, infer_ms)` of every reported picture.
    batches: Vec<(u64, f64)>,
    /// The last `info` message.
    pub info: Option<messages::Info>,
    /// The last `telemetry` message.
    pub telemetry: Option<messages::Telemetry>,
    peak_high_water: Option<u64>,
    online_at: Option<Instant>,
    last_detection_at: Option<Instant>,
    pub offline: bool,
}

impl Observer {
    /// `expected`: the sample pictures' file names and the objects drawn in each.
    pub fn new(expected: BTreeMap<String, Vec<DrawnObject>>) -> Self {
        Self {
            expected,
            results: BTreeMap::new(),
            failed: BTreeMap::new(),
            batches: Vec::new(),
            info: None,
            telemetry: None,
            peak_high_water: None,
            online_at: None,
            last_detection_at: None,
            offline: false,
        }
    }

    /// True once every sample picture is reported (detected or failed).
    pub fn complete(&self) -> bool {
        self.expected.keys().all(|n| self.results.contains_key(n) || self.failed.contains_key(n))
    }

    pub fn reported(&self) -> usize {
        self.results.len() + self.failed.len()
    }

    /// Frames the last telemetry message counts as done (ok + failed).
    pub fn telemetry_frames(&self) -> u64 {
        self.telemetry.as_ref().map_or(0, |t| t.frames.ok + t.frames.failed)
    }

    /// Takes one message; `leaf` is its topic after `{prefix}/{device_id}/`. Every message is
    /// parsed into its type of [`crate::agent::messages`]; one that does not parse is shown as such.
    pub fn on_message(&mut self, leaf: &str, payload: &[u8], at: Instant) -> Option<Update> {
        let line = |s: String| Some(Update { line: s, image: None });
        let msg = match Message::parse(leaf, payload) {
            Ok(Some(m)) => m,
            Ok(None) => {
                return match serde_json::from_slice::<serde_json::Value>(payload) {
                    Ok(v) => line(format!("{leaf:<11} {v}")),
                    Err(_) => line(format!("{leaf:<11} (not JSON, {} bytes)", payload.len())),
                };
            }
            Err(e) if e.is_syntax() => return line(format!("{leaf:<11} (not JSON, {} bytes)", payload.len())),
            Err(e) => return line(format!("{leaf:<11} ({e})")),
        };
        match msg {
            Message::Status(s) => {
                match s {
                    Status::Online => self.online_at = self.online_at.or(Some(at)),
                    Status::Offline => self.offline = true,
                }
                line(format!("status      {}", s.as_payload()))
            }
            Message::Info(i) => {
                let text = info_line(&i);
                self.info = Some(i);
                line(text)
            }
            Message::Telemetry(t) => {
                if let Some(h) = t.process_memory.high_water {
                    self.peak_high_water = Some(self.peak_high_water.map_or(h, |p| p.max(h)));
                }
                let text = telemetry_line(&t);
                self.telemetry = Some(t);
                line(text)
            }
            Message::Event(e) => {
                if let EventBody::InputRejected { image: Some(image), stage, reason, .. } = &e.body {
                    self.failed.entry(file_name(image.name())).or_insert_with(|| format!("{stage}: {reason}"));
                }
                line(event_line(&e))
            }
            Message::Detections(d) => {
                let name = file_name(d.image.name());
                if self.results.contains_key(&name) {
                    return None; // a QoS 1 redelivery
                }
                self.batches.push((d.batch_size as u64, d.latency_ms.infer));
                self.last_detection_at = Some(at);
                let text = detection_line(&name, &d.detections);
                self.results.insert(name.clone(), d.detections);
                Some(Update { line: text, image: Some(name) })
            }
        }
    }

    /// The check: whether the model knows the sample classes, and if so how many drawn objects
    /// were found (IoU >= 0.5, same class) among the reported pictures.
    pub fn check(&self) -> Option<Check> {
        let classes = self.info.as_ref()?.model.classes.iter().map(String::as_str).collect::<Vec<_>>();
        if classes != SAMPLE_CLASSES.map(Shape::name) {
            return None;
        }
        let mut c = Check::default();
        for (name, truth) in &self.expected {
            let Some(dets) = self.results.get(name) else { continue };
            let mut dets = dets.clone();
            dets.sort_by(|a, b| b.confidence.total_cmp(&a.confidence));
            let preds: Vec<LabeledBox> = dets.iter().map(|d| LabeledBox { class_id: d.class_id, bbox: d.bbox.map(f64::from) }).collect();
            let gts: Vec<LabeledBox> = truth.iter().map(|o| LabeledBox { class_id: o.shape.class_id(), bbox: o.bbox }).collect();
            let correct = match_predictions(&preds, &gts);
            for g in &gts {
                c.drawn[g.class_id] += 1;
            }
            for (p, ok) in preds.iter().zip(&correct) {
                // index 0 is IoU 0.50; every correct prediction claims its own drawn object
                if ok[0] {
                    c.found[p.class_id] += 1;
                } else {
                    c.extra += 1;
                }
            }
        }
        Some(c)
    }

    /// The closing summary; `wall` is the demo's whole run time.
    pub fn summary(&self, written: usize, wall: Duration) -> Summary {
        let mut per_class: BTreeMap<String, usize> = BTreeMap::new();
        let mut order: Vec<String> = Vec::new();
        for d in self.results.values().flatten() {
            if !per_class.contains_key(&d.label) {
                order.push(d.label.clone());
            }
            *per_class.entry(d.label.clone()).or_default() += 1;
        }
        // class-id order reads better than alphabetical
        let mut ids: BTreeMap<String, usize> = BTreeMap::new();
        for d in self.results.values().flatten() {
            ids.entry(d.label.clone()).or_insert(d.class_id);
        }
        order.sort_by_key(|l| ids.get(l).copied().unwrap_or(usize::MAX));
        let info = self.info.as_ref();
        let plan = info.map(|i| &i.batch_plan);
        let tel = self.telemetry.as_ref();
        let processing = self.online_at.zip(self.last_detection_at).map(|(a, b)| b.saturating_duration_since(a));
        let mut infer: Vec<f64> = self.batches.iter().map(|b| b.1).collect();
        infer.sort_by(f64::total_cmp);
        let mut sizes: Vec<u64> = self.batches.iter().map(|b| b.0).collect();
        sizes.sort_unstable();
        Summary {
            written,
            reported: self.results.len(),
            failed: self.failed.len(),
            detections: order.into_iter().map(|l| (l.clone(), per_class[&l])).collect(),
            check: self.check(),
            model: info.map(|i| i.model.label.clone()),
            device: info.map_or_else(|| "? ?".to_string(), |i| format!("{} {}", i.device, i.dtype)),
            imgsz: info.map(|i| i.imgsz as u64),
            batch: plan.map(|p| p.startup),
            batch_reason: plan.map(|p| p.reason.clone()),
            batch_sizes_seen: {
                sizes.dedup();
                sizes
            },
            memory_peak: self.peak_high_water,
            device_total: tel.and_then(|t| t.device_memory.total),
            device_free: tel.and_then(|t| t.device_memory.free),
            memory_fraction: plan.map(|p| p.memory_fraction),
            memory_limit: plan.and_then(|p| p.memory_limit),
            processing,
            infer_ms_p50: infer.get(infer.len().saturating_sub(1) / 2).copied(),
            agent_fps: tel.map(|t| t.fps),
            wall,
        }
    }
}

/// Drawn objects found by the detections, per class id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Check {
    pub drawn: [usize; 5],
    pub found: [usize; 5],
    /// Detections that match no drawn object (wrong place or wrong class).
    pub extra: usize,
}

impl Check {
    pub fn drawn_total(&self) -> usize {
        self.drawn.iter().sum()
    }
    pub fn found_total(&self) -> usize {
        self.found.iter().sum()
    }
}

/// The closing summary of a demo run.
#[derive(Debug, Clone)]
pub struct Summary {
    pub written: usize,
    pub reported: usize,
    pub failed: usize,
    /// `(label, count)` in class-id order.
    pub detections: Vec<(String, usize)>,
    /// None when the model does not know the sample classes.
    pub check: Option<Check>,
    pub model: Option<String>,
    pub device: String,
    pub imgsz: Option<u64>,
    pub batch: Option<u64>,
    pub batch_reason: Option<String>,
    pub batch_sizes_seen: Vec<u64>,
    pub memory_peak: Option<u64>,
    pub device_total: Option<u64>,
    pub device_free: Option<u64>,
    pub memory_fraction: Option<f64>,
    pub memory_limit: Option<u64>,
    /// From the agent's `online` to the last picture's detections.
    pub processing: Option<Duration>,
    pub infer_ms_p50: Option<f64>,
    pub agent_fps: Option<f64>,
    pub wall: Duration,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total: usize = self.detections.iter().map(|d| d.1).sum();
        writeln!(f, "summary")?;
        writeln!(f, "  pictures    {} written, {} reported, {} failed", self.written, self.reported, self.failed)?;
        let per: Vec<String> = self.detections.iter().map(|(l, n)| format!("{l} {n}")).collect();
        writeln!(f, "  detections  {total}{}", if per.is_empty() { String::new() } else { format!(" ({})", per.join(", ")) })?;
        match &self.check {
            Some(c) => {
                let per: Vec<String> =
                    SAMPLE_CLASSES.iter().map(|s| format!("{} {}/{}", s.name(), c.found[s.class_id()], c.drawn[s.class_id()])).collect();
                writeln!(
                    f,
                    "  check       {} of {} drawn objects found (IoU >= {MATCH_IOU}, right class): {}; {} other detections",
                    c.found_total(),
                    c.drawn_total(),
                    per.join(", "),
                    c.extra
                )?;
            }
            None => writeln!(
                f,
                "  check       skipped: the model's classes are not the samples' ({})",
                SAMPLE_CLASSES.map(Shape::name).join(", ")
            )?,
        }
        writeln!(
            f,
            "  model       {} on {}{}",
            self.model.as_deref().unwrap_or("?"),
            self.device,
            self.imgsz.map(|s| format!(", {s} x {s} input")).unwrap_or_default()
        )?;
        let seen: Vec<String> = self.batch_sizes_seen.iter().map(u64::to_string).collect();
        writeln!(
            f,
            "  batch       {} ({}); batches run: {}",
            self.batch.map_or("?".into(), |b| b.to_string()),
            self.batch_reason.as_deref().unwrap_or("reason not reported"),
            if seen.is_empty() { "none".into() } else { format!("size {}", seen.join(", ")) }
        )?;
        let mut mem = format!("peak {} (process high-water)", self.memory_peak.map_or("not reported".into(), bytes));
        if let (Some(t), Some(free)) = (self.device_total, self.device_free) {
            let _ = write!(mem, "; device {} total, {} free", bytes(t), bytes(free));
            if let Some(frac) = self.memory_fraction {
                let base = self.memory_limit.map_or(free, |l| l.min(free));
                let _ = write!(
                    mem,
                    "; budget {} = {frac} x {}",
                    bytes((base as f64 * frac) as u64),
                    if self.memory_limit.is_some() { "min(free, memory_limit)" } else { "free" }
                );
            }
        }
        writeln!(f, "  memory      {mem}")?;
        let mut thr = match self.processing {
            Some(d) if d > Duration::ZERO && self.reported > 0 => {
                format!(
                    "{:.1} img/s ({} pictures in {:.2} s, online to last detection)",
                    self.reported as f64 / d.as_secs_f64(),
                    self.reported,
                    d.as_secs_f64()
                )
            }
            _ => "not measured".into(),
        };
        if let Some(ms) = self.infer_ms_p50 {
            let _ = write!(thr, "; inference {ms:.0} ms per batch (median)");
        }
        writeln!(f, "  throughput  {thr}")?;
        write!(f, "  wall time   {:.1} s (broker, model load and warm-up included)", self.wall.as_secs_f64())
    }
}

/// `1.5 GiB`, `412 MiB`, `800 KiB`.
pub fn bytes(n: u64) -> String {
    let n = n as f64;
    if n >= (1u64 << 30) as f64 {
        format!("{:.1} GiB", n / (1u64 << 30) as f64)
    } else if n >= (1u64 << 20) as f64 {
        format!("{:.0} MiB", n / (1u64 << 20) as f64)
    } else {
        format!("{:.0} KiB", n / 1024.0)
    }
}

/// The file name of a picture's path or id (`/data/in/a.png` -> `a.png`).
fn file_name(p: &str) -> String {
    std::path::Path::new(p).file_name().map_or(p.to_string(), |n| n.to_string_lossy().into_owned())
}

/// `sample-01.png  3 detections: circle 0.93 [40 40 140 140], ...`
pub fn detection_line(name: &str, dets: &[Detection]) -> String {
    let list: Vec<String> = dets
        .iter()
        .map(|d| {
            let [x1, y1, x2, y2] = d.bbox.map(|v| v.round() as i64);
            format!("{} {:.2} [{x1} {y1} {x2} {y2}]", d.label, d.confidence)
        })
        .collect();
    format!(
        "detections  {name}  {} detection{}{}{}",
        dets.len(),
        if dets.len() == 1 { "" } else { "s" },
        if list.is_empty() { "" } else { ": " },
        list.join(", ")
    )
}

fn telemetry_line(t: &messages::Telemetry) -> String {
    let (f, batch) = (&t.frames, t.batch.current);
    let mut s = format!("telemetry   frames {} ok, {} failed · {:.2} img/s · batch {batch}", f.ok, f.failed, t.fps);
    let pm = &t.process_memory;
    if let Some(r) = pm.rss {
        let _ = write!(s, " · memory {}", bytes(r));
        if let Some(h) = pm.high_water {
            let _ = write!(s, " (peak {})", bytes(h));
        }
    }
    let p = t.latency_ms.infer.p50;
    if p > 0.0 {
        let _ = write!(s, " · infer p50 {p:.0} ms");
    }
    s
}

fn info_line(i: &messages::Info) -> String {
    let m = &i.model;
    let shown = if m.classes.len() > 8 { format!("{}, ...", m.classes[..8].join(", ")) } else { m.classes.join(", ") };
    format!(
        "info        model {} ({} classes: {shown}) on {} {}, {} px; batch {} ({})",
        m.label,
        m.classes.len(),
        i.device,
        i.dtype,
        i.imgsz,
        i.batch_plan.startup,
        i.batch_plan.reason,
    )
}

/// `event       TYPE {fields}`: the body's fields without the envelope.
fn event_line(e: &messages::Event) -> String {
    let mut body = serde_json::to_value(&e.body).unwrap_or_default();
    if let Some(o) = body.as_object_mut() {
        o.remove("type");
    }
    format!("event       {} {body}", e.body.kind())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::messages::{examples, ImageName, InputStage};

    fn obj(shape: Shape, bbox: [f64; 4]) -> DrawnObject {
        DrawnObject { shape, bbox }
    }

    fn det(class_id: usize, conf: f32, bbox: [f32; 4]) -> Detection {
        Detection { class_id, label: SAMPLE_CLASSES[class_id].name().to_string(), confidence: conf, bbox }
    }

    fn observer() -> Observer {
        let mut e = BTreeMap::new();
        e.insert("a.png".into(), vec![obj(Shape::Circle, [0.0, 0.0, 100.0, 100.0]), obj(Shape::Star, [200.0, 0.0, 300.0, 100.0])]);
        e.insert("b.png".into(), vec![obj(Shape::Ring, [0.0, 0.0, 50.0, 50.0])]);
        Observer::new(e)
    }

    fn info(classes: &[&str]) -> Vec<u8> {
        let mut i = examples::info(classes);
        i.batch_plan.reason = "auto on CPU".into();
        serde_json::to_vec(&i).unwrap()
    }

    fn detection(name: &str, dets: Vec<Detection>) -> Vec<u8> {
        let mut d = examples::detections(name, dets);
        d.batch_size = 2;
        serde_json::to_vec(&d).unwrap()
    }

    #[test]
    fn messages_lines_completion_and_check() {
        let mut o = observer();
        let t0 = Instant::now();
        assert_eq!(o.on_message("status", b"online", t0).unwrap().line, "status      online");
        assert!(o.on_message("info", &info(&SAMPLE_CLASSES.map(Shape::name)), t0).unwrap().line.contains("batch 4 (auto on CPU)"));
        // circle found, star found at a shifted but overlapping box, one false square
        let dets =
            vec![det(0, 0.9, [2.0, 2.0, 98.0, 101.0]), det(3, 0.8, [215.0, 0.0, 300.0, 100.0]), det(1, 0.4, [0.0, 0.0, 100.0, 100.0])];
        let u = o.on_message("detections/samples", &detection("a.png", dets), t0).unwrap();
        assert_eq!(u.image.as_deref(), Some("a.png"));
        assert!(u.line.starts_with("detections  a.png  3 detections: circle 0.90 [2 2 98 101], star 0.80"), "{}", u.line);
        assert!(!o.complete());
        // a redelivery changes nothing
        assert!(o.on_message("detections/samples", &detection("a.png", vec![]), t0).is_none());
        // the ring is missed: a circle at its place is the wrong class
        let t1 = t0 + Duration::from_secs(2);
        o.on_message("detections/samples", &detection("b.png", vec![det(0, 0.7, [0.0, 0.0, 50.0, 50.0])]), t1).unwrap();
        assert!(o.complete());
        let c = o.check().unwrap();
        assert_eq!((c.found_total(), c.drawn_total(), c.extra), (2, 3, 2));
        assert_eq!(c.found, [1, 0, 0, 1, 0]);
        let tel = serde_json::to_vec(&examples::telemetry()).unwrap();
        assert_eq!(
            o.on_message("telemetry", &tel, t1).unwrap().line,
            "telemetry   frames 3 ok, 0 failed · 1.50 img/s · batch 4 · memory 300 MiB (peak 310 MiB) · infer p50 80 ms"
        );
        assert_eq!(o.telemetry_frames(), 3);
        let s = o.summary(2, Duration::from_secs(9)).to_string();
        assert!(s.contains("pictures    2 written, 2 reported, 0 failed"), "{s}");
        assert!(s.contains("detections  4 (circle 2, square 1, star 1)"), "{s}");
        assert!(s.contains("check       2 of 3 drawn objects found"), "{s}");
        assert!(s.contains("batch       4 (auto on CPU); batches run: size 2"), "{s}");
        assert!(s.contains("peak 310 MiB") && s.contains("budget 8.0 GiB = 0.8 x free"), "{s}");
        assert!(s.contains("1.0 img/s (2 pictures in 2.00 s"), "{s}");
        assert!(s.contains("wall time   9.0 s"), "{s}");
        o.on_message("status", b"offline", t1);
        assert!(o.offline);
    }

    #[test]
    fn rejected_pictures_complete_the_run_and_other_models_skip_the_check() {
        let mut o = observer();
        let t = Instant::now();
        o.on_message("info", &info(&["ball"]), t);
        o.on_message("detections/samples", &detection("a.png", vec![det(0, 0.9, [0.0, 0.0, 100.0, 100.0])]), t);
        let ev = examples::event(EventBody::InputRejected {
            source: Some("samples".into()),
            image: Some(ImageName::Path { path: "/x/in/b.png".into() }),
            topic: None,
            stage: InputStage::Decode,
            reason: "truncated".into(),
        });
        let line = o.on_message("events", &serde_json::to_vec(&ev).unwrap(), t).unwrap().line;
        assert!(
            line.starts_with("event       input_rejected {") && line.contains(r#""reason":"truncated""#) && !line.contains(r#""v":"#),
            "{line}"
        );
        assert!(!line.contains(r#""type":"#), "{line}");
        assert!(o.complete());
        assert_eq!(o.failed["b.png"], "decode: truncated");
        assert!(o.check().is_none());
        assert!(o.summary(2, Duration::ZERO).to_string().contains("check       skipped"));
        assert!(o.on_message("telemetry", b"{{", t).unwrap().line.contains("not JSON"));
        // JSON of another shape is not taken
        let line = o.on_message("telemetry", br#"{"frames": {"ok": 9}}"#, t).unwrap().line;
        assert!(line.contains("not a valid Telemetry message"), "{line}");
        assert_eq!(o.telemetry_frames(), 0);
        assert!(o.on_message("status", b"rebooting", t).unwrap().line.contains("not a valid Status message"));
    }
}
