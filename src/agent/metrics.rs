//! The agent's Prometheus metrics (`/metrics`): a prometheus-client collector that reads the
//! shared [`Stats`], device memory and the running model at scrape time, rendered as OpenMetrics
//! or as the classic text format 0.0.4 ([`to_text_004`]; promtool and older scrapers read only
//! that). Labels are bounded: stage, queue, source (capped in [`Stats`]) and result.
//! Uses `agent::telemetry`, `agent::pipeline` (the model's name); nothing else of the agent.

use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::agent::pipeline::ModelMeta;
use crate::agent::telemetry::{process_rss, MemorySource, Stage, Stats};

/// The content type of the classic Prometheus text format.
pub const TEXT_004: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The content type of OpenMetrics 1.0 text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The exposition format of a scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text format 0.0.4.
    Text004,
    /// OpenMetrics 1.0 text.
    OpenMetrics,
}

impl Format {
    /// The format a scraper asks for in its `Accept` header: OpenMetrics when it names
    /// `application/openmetrics-text` (with a q above 0), else the 0.0.4 text format.
    pub fn from_accept(accept: Option<&str>) -> Format {
        let wants_om = accept.unwrap_or("").split(',').any(|part| {
            let mut it = part.split(';').map(str::trim);
            let media = it.next().unwrap_or("");
            let q = it.filter_map(|p| p.strip_prefix("q=")).find_map(|q| q.parse::<f64>().ok()).unwrap_or(1.0);
            media.eq_ignore_ascii_case("application/openmetrics-text") && q > 0.0
        });
        if wants_om {
            Format::OpenMetrics
        } else {
            Format::Text004
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text004 => TEXT_004,
            Format::OpenMetrics => OPENMETRICS,
        }
    }
}

/// What the exporter can only know once the model is loaded and the pipeline runs.
pub struct Context {
    pub memory: Arc<dyn MemorySource>,
    pub model: Arc<RwLock<ModelMeta>>,
    pub max_batch: u64,
    pub spool_max_bytes: u64,
}

struct Inner {
    stats: Arc<Stats>,
    ctx: RwLock<Option<Context>>,
    /// The labels of `yolo_edge_build_info` (version, device, dtype).
    build: Vec<(&'static str, String)>,
    started_unix_s: f64,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentCollector").finish_non_exhaustive()
    }
}

/// The agent's metrics, rendered on each scrape.
pub struct Exporter {
    inner: Arc<Inner>,
    registry: Registry,
}

impl Exporter {
    /// `device` is the device's name (`cpu`, `cuda:0 (NVIDIA ...)`), `dtype` the compute dtype.
    pub fn new(stats: Arc<Stats>, device: &str, dtype: &str) -> Self {
        let started_unix_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        let build = vec![("version", env!("CARGO_PKG_VERSION").to_string()), ("device", device.to_string()), ("dtype", dtype.to_string())];
        let inner = Arc::new(Inner { stats, ctx: RwLock::new(None), build, started_unix_s });
        let mut registry = Registry::default();
        registry.register_collector(Box::new(inner.clone()));
        Self { inner, registry }
    }

    /// Adds device memory and model figures (from when the pipeline runs).
    pub fn attach(&self, ctx: Context) {
        if let Ok(mut c) = self.inner.ctx.write() {
            *c = Some(ctx);
        }
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.inner.stats
    }

    /// The metrics now, in `format`.
    pub fn render(&self, format: Format) -> String {
        let mut om = String::with_capacity(16 << 10);
        if let Err(e) = prometheus_client::encoding::text::encode(&mut om, &self.registry) {
            tracing::error!("cannot encode metrics: {e}");
        }
        match format {
            Format::OpenMetrics => om,
            Format::Text004 => to_text_004(&om),
        }
    }
}

/// Converts prometheus-client's OpenMetrics text into the Prometheus text format 0.0.4: a
/// counter's family is named with its `_total` suffix (`# TYPE x_total counter`), an info metric
/// becomes a gauge named `x_info`, `unknown` becomes `untyped`, and `# UNIT`, `# EOF` and
/// exemplars are dropped. Samples are the same in both formats otherwise (label escaping, `+Inf`).
pub fn to_text_004(om: &str) -> String {
    let mut out = String::with_capacity(om.len());
    // HELP comes before TYPE, and the 0.0.4 name depends on the type
    let mut help: Option<(&str, &str)> = None;
    for line in om.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name, text));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (family, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let (name, kind) = match kind {
                "counter" => (format!("{family}_total"), "counter"),
                "info" => (format!("{family}_info"), "gauge"),
                "gauge" | "histogram" | "summary" => (family.to_string(), kind),
                _ => (family.to_string(), "untyped"),
            };
            if let Some((_, text)) = help.take().filter(|h| h.0 == family) {
                let _ = writeln!(out, "# HELP {name} {text}");
            }
            let _ = writeln!(out, "# TYPE {name} {kind}");
        } else if line.starts_with('#') || line.is_empty() {
            // `# UNIT`, `# EOF`
        } else {
            // an exemplar follows ` # ` after the value, outside the label set
            let labels_end = label_set_end(line);
            let sample = match line[labels_end..].find(" # ") {
                Some(i) => &line[..labels_end + i],
                None => line,
            };
            out.push_str(sample);
            out.push('\n');
        }
    }
    out
}

/// The byte offset just past a sample line's label set (`{...}`, quotes and escapes heeded), or
/// past its name when it has none.
fn label_set_end(line: &str) -> usize {
    let Some(open) = line.find(['{', ' ']) else { return line.len() };
    if line.as_bytes()[open] == b' ' {
        return open;
    }
    let (mut quoted, mut escaped) = (false, false);
    for (i, c) in line[open..].char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return open + i + 1,
            _ => {}
        }
    }
    line.len()
}

/// A label value as both text formats write it: `\`, `"` and newlines escaped.
fn label_value(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

const BYTES: Option<&Unit> = Some(&Unit::Bytes);
const SECONDS: Option<&Unit> = Some(&Unit::Seconds);

struct Out<'a> {
    enc: DescriptorEncoder<'a>,
}

impl Out<'_> {
    fn counter(&mut self, name: &str, help: &str, v: &AtomicU64) -> fmt::Result {
        let m = self.enc.encode_descriptor(name, help, None, MetricType::Counter)?;
        ConstCounter::new(v.load(Relaxed)).encode(m)
    }

    fn gauge<N: prometheus_client::encoding::EncodeGaugeValue>(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<&Unit>,
        v: N,
    ) -> fmt::Result {
        let m = self.enc.encode_descriptor(name, help, unit, MetricType::Gauge)?;
        ConstGauge::new(v).encode(m)
    }

    fn gauges(&mut self, name: &str, help: &str, unit: Option<&Unit>, label: &str, values: &[(&str, u64)]) -> fmt::Result {
        let mut m = self.enc.encode_descriptor(name, help, unit, MetricType::Gauge)?;
        for (l, v) in values {
            let labels = [(label, label_value(l))];
            ConstGauge::new(*v).encode(m.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn info(&mut self, name: &str, help: &str, labels: &[(&str, String)]) -> fmt::Result {
        let mut m = self.enc.encode_descriptor(name, help, None, MetricType::Info)?;
        let labels: Vec<(&str, String)> = labels.iter().map(|(k, v)| (*k, label_value(v))).collect();
        m.encode_info(&labels)
    }
}

impl Collector for Inner {
    fn encode(&self, enc: DescriptorEncoder) -> fmt::Result {
        let s = &*self.stats;
        let g = |a: &AtomicU64| a.load(Relaxed);
        let mut o = Out { enc };
        let ctx = self.ctx.read().ok();
        let ctx = ctx.as_ref().and_then(|c| c.as_ref());

        // readiness and identity
        o.gauge(
            "yolo_edge_ready",
            "Whether the agent is ready (1): model loaded, broker connected or spool accepting",
            None,
            i64::from(s.readiness().is_ok()),
        )?;
        o.gauge(
            "yolo_edge_model_ready",
            "Whether a model is loaded and serving (0 while a model loads)",
            None,
            i64::from(s.model_ready.load(Relaxed)),
        )?;
        o.gauge("yolo_edge_start_time", "When the agent started, seconds since the Unix epoch", SECONDS, self.started_unix_s)?;
        o.info("yolo_edge_build", "The agent's version, device and dtype", &self.build)?;
        if let Some(c) = ctx {
            let m = c.model.read().map(|m| m.clone()).unwrap_or_else(|e| e.into_inner().clone());
            o.info(
                "yolo_edge_model",
                "The model serving now",
                &[("variant", m.variant), ("label", m.label), ("sha256", m.sha256), ("classes", m.nc.to_string())],
            )?;
        }

        // pictures
        {
            let mut m = o.enc.encode_descriptor(
                "yolo_edge_frames",
                "Pictures finished, by source and result (ok: detections published or spooled; failed: rejected at intake, decode or inference)",
                None,
                MetricType::Counter,
            )?;
            for (source, result, n) in s.frames_by_source() {
                let labels = [("source", label_value(&source)), ("result", result.name().to_string())];
                ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
            }
        }
        // camera and video streams (labels bounded by the configured streams)
        let streams = s.streams();
        if !streams.is_empty() {
            let mut m = o.enc.encode_descriptor(
                "yolo_edge_stream_frames",
                "Stream frames by result (in: delivered by the decoder; dropped: replaced while waiting for inference; skipped: over max_fps; published)",
                None,
                MetricType::Counter,
            )?;
            for (id, st) in &streams {
                for (result, v) in [("in", &st.frames_in), ("dropped", &st.dropped), ("skipped", &st.skipped), ("published", &st.published)]
                {
                    let labels = [("stream", label_value(id)), ("result", result.to_string())];
                    ConstCounter::new(v.load(Relaxed)).encode(m.encode_family(&labels)?)?;
                }
            }
            let mut m = o.enc.encode_descriptor(
                "yolo_edge_stream_reconnects",
                "Stream connections lost (error, end of a live stream, stall) and retried",
                None,
                MetricType::Counter,
            )?;
            for (id, st) in &streams {
                ConstCounter::new(st.reconnects.load(Relaxed)).encode(m.encode_family(&[("stream", label_value(id))])?)?;
            }
            let mut m = o.enc.encode_descriptor(
                "yolo_edge_stream_stuck_teardowns",
                "Old pipelines that did not stop when told to and still hold their threads, sockets and buffers",
                None,
                MetricType::Gauge,
            )?;
            for (id, st) in &streams {
                ConstGauge::new(st.stuck_teardowns.load(Relaxed) as i64).encode(m.encode_family(&[("stream", label_value(id))])?)?;
            }
            let mut m = o.enc.encode_descriptor(
                "yolo_edge_stream_decoder",
                "The decoder element each stream uses (empty until the codec is known) and its state",
                None,
                MetricType::Info,
            )?;
            for (id, st) in &streams {
                let labels = [
                    ("stream", label_value(id)),
                    ("kind", st.kind.clone()),
                    ("decoder", label_value(&st.decoder().unwrap_or_default())),
                    ("requested", st.decoder_requested.clone()),
                    ("state", st.state().name().to_string()),
                ];
                m.encode_info(&labels)?;
            }
            let mut m = o.enc.encode_descriptor(
                "yolo_edge_stream_capture_to_publish",
                "From a stream frame reaching the agent to its detection message being built",
                SECONDS,
                MetricType::Histogram,
            )?;
            for (id, st) in &streams {
                let h = st.capture_to_publish_histogram();
                m.encode_family(&[("stream", label_value(id))])?.encode_histogram::<NoLabelSet>(h.sum_s, h.count, &h.buckets, None)?;
            }
        }
        o.counter("yolo_edge_frames_received", "Pictures taken from the intake into decoding", &s.frames_in)?;
        o.counter("yolo_edge_inputs_rejected", "Pictures rejected (intake, decode or inference)", &s.inputs_rejected)?;
        o.counter("yolo_edge_batches", "Batches run on the inference thread", &s.batches)?;
        {
            let mut m = o.enc.encode_descriptor(
                "yolo_edge_stage_duration",
                "Time per picture (decode, preprocess, queue_wait, post, publish) or per batch (infer) in each pipeline stage",
                SECONDS,
                MetricType::Histogram,
            )?;
            for stage in Stage::ALL {
                let h = s.histogram(stage);
                let labels = [("stage", stage.name())];
                m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(h.sum_s, h.count, &h.buckets, None)?;
            }
        }

        // batching and memory
        o.gauge("yolo_edge_batch_size_current", "The batch size the inference thread runs now", None, g(&s.batch_current))?;
        o.gauge(
            "yolo_edge_batch_size_planned",
            "The batch size chosen at startup (fixed by config or planned from memory)",
            None,
            g(&s.batch_startup),
        )?;
        o.gauge(
            "yolo_edge_batch_size_ceiling",
            "The largest batch the input shapes of the last minute allow (the plan scaled by their pixels)",
            None,
            g(&s.batch_ceiling),
        )?;
        if let Some(c) = ctx {
            o.gauge("yolo_edge_batch_size_max", "The configured max_batch", None, c.max_batch)?;
        }
        o.counter("yolo_edge_oom_fallbacks", "Out-of-memory errors that split or failed a batch", &s.oom_fallbacks)?;
        o.gauge(
            "yolo_edge_memory_high",
            "1 while the memory watchdog holds memory high (from memory_high to memory_ok), else 0",
            None,
            u64::from(s.memory_high.load(Relaxed)),
        )?;
        if g(&s.plan_budget) > 0 {
            o.gauge("yolo_edge_memory_budget", "The planner's memory budget for batches", BYTES, g(&s.plan_budget))?;
            o.gauge("yolo_edge_plan_verified_peak", "The peak the planner measured at the planned batch", BYTES, g(&s.plan_verified_peak))?;
        }
        if let Some(&base) = s.budget_watch.get() {
            o.gauge(
                "yolo_edge_process_device_memory_model",
                "The memory pool's reservation with the model alone (CUDA, after a plan): reserved above this is held against the budget",
                BYTES,
                base,
            )?;
        }
        if let Some(c) = ctx {
            let mem = c.memory.query();
            let figures = [
                ("yolo_edge_device_memory_capacity", "The device's memory (host memory or its cgroup limit on the CPU)", mem.total),
                ("yolo_edge_device_memory_free", "Free memory on the device", mem.free),
                ("yolo_edge_device_memory_used", "Used memory on the device, by every process", mem.used),
                ("yolo_edge_process_device_memory_used", "Memory this process's allocations hold on the device", mem.process_used),
                (
                    "yolo_edge_process_device_memory_reserved",
                    "Memory this process reserves on the device (CUDA pool; resident set on the CPU)",
                    mem.process_reserved,
                ),
                ("yolo_edge_process_device_memory_high_water", "High-water mark of this process's device memory", mem.process_high_water),
            ];
            for (name, help, v) in figures {
                if let Some(v) = v {
                    o.gauge(name, help, BYTES, v)?;
                }
            }
        }
        if let Some(rss) = process_rss() {
            o.gauge("yolo_edge_process_resident_memory", "Resident set size of the agent process", BYTES, rss)?;
        }

        // queues, spool, MQTT
        o.gauges(
            "yolo_edge_queue_depth",
            "Items waiting in each bounded queue (intake, decoded, results) and MQTT messages queued or in flight (mqtt)",
            None,
            "queue",
            &[("intake", g(&s.q_intake)), ("decoded", g(&s.q_decoded)), ("results", g(&s.q_results)), ("mqtt", g(&s.mqtt_queued))],
        )?;
        o.gauge("yolo_edge_spool_messages", "Detection messages in the spool, waiting for the broker", None, g(&s.spool_len))?;
        o.gauge("yolo_edge_spool", "Bytes of the spool's messages", BYTES, g(&s.spool_bytes))?;
        if let Some(c) = ctx {
            o.gauge("yolo_edge_spool_capacity", "The spool's size limit (spool.max_bytes)", BYTES, c.spool_max_bytes)?;
        }
        o.gauge(
            "yolo_edge_spool_accepting",
            "Whether the spool has room for another message",
            None,
            i64::from(s.spool_accepting.load(Relaxed)),
        )?;
        o.counter("yolo_edge_spooled_messages", "Detection messages written to the spool", &s.spooled_total)?;
        o.counter("yolo_edge_spool_replayed_messages", "Spooled messages delivered after a reconnect", &s.spool_replayed)?;
        o.gauge("yolo_edge_mqtt_connected", "Whether the MQTT connection is up (1)", None, i64::from(s.mqtt_connected.load(Relaxed)))?;
        o.gauge(
            "yolo_edge_mqtt_inflight_messages",
            "Messages handed to the MQTT client and not yet acknowledged",
            None,
            g(&s.mqtt_inflight),
        )?;
        o.counter("yolo_edge_mqtt_reconnects", "MQTT connections made after the first", &s.reconnects)?;
        o.counter("yolo_edge_mqtt_connect_refused", "MQTT connection attempts the broker refused", &s.connect_refused)?;
        o.counter("yolo_edge_detection_messages_published", "Detection messages handed to the MQTT client", &s.detections_published)?;
        o.counter("yolo_edge_detection_messages_acked", "Detection messages the broker acknowledged", &s.detections_acked)?;
        o.counter("yolo_edge_events_dropped", "Events dropped while the broker was away", &s.events_dropped)?;

        // configuration
        o.counter("yolo_edge_config_applied", "Config file changes applied live", &s.config_applied)?;
        o.counter("yolo_edge_config_rejected", "Config file changes rejected (the running config stays)", &s.config_rejected)?;
        o.counter("yolo_edge_model_reloads", "Models swapped in live", &s.model_reloads)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::telemetry::{DeviceMemory, FrameResult};

    struct FixedMemory;
    impl MemorySource for FixedMemory {
        fn query(&self) -> DeviceMemory {
            DeviceMemory {
                total: Some(8 << 30),
                free: Some(6 << 30),
                used: Some(2 << 30),
                process_used: Some(1 << 30),
                process_reserved: Some(3 << 29),
                process_high_water: Some(1 << 31),
                limit: Some("cgroup:/system.slice/yolo-edge.service memory.max".into()),
            }
        }
    }

    fn exporter() -> Exporter {
        let stats = Arc::new(Stats::default());
        stats.count_frame(Some("cam"), FrameResult::Ok);
        stats.count_frame(Some("cam"), FrameResult::Ok);
        stats.count_frame(Some("we\"ird"), FrameResult::Failed);
        stats.record(Stage::Infer, 40.0);
        stats.record_decode(2.0, Some(0.3));
        stats.batch_current.store(4, Relaxed);
        stats.plan_budget.store(1 << 30, Relaxed);
        stats.model_ready.store(true, Relaxed);
        stats.mqtt_connected.store(true, Relaxed);
        let e = Exporter::new(stats, "cpu", "f32");
        let meta = ModelMeta {
            variant: "yolov9-t".into(),
            nc: 1,
            names: vec!["ball".into()],
            sha256: "ab".repeat(32),
            path: "/m.pt".into(),
            label: "yolov9-t:abababababab".into(),
        };
        e.attach(Context { memory: Arc::new(FixedMemory), model: Arc::new(RwLock::new(meta)), max_batch: 8, spool_max_bytes: 64 << 20 });
        e
    }

    #[test]
    fn text_004_names_counters_and_infos_as_the_classic_format_does() {
        let e = exporter();
        let t = e.render(Format::Text004);
        for want in [
            "# HELP yolo_edge_frames_total Pictures finished",
            "# TYPE yolo_edge_frames_total counter\n",
            "yolo_edge_frames_total{source=\"cam\",result=\"ok\"} 2\n",
            "yolo_edge_frames_total{source=\"we\\\"ird\",result=\"failed\"} 1\n",
            "# TYPE yolo_edge_build_info gauge\n",
            "yolo_edge_build_info{version=\"",
            "# TYPE yolo_edge_model_info gauge\n",
            "yolo_edge_model_info{variant=\"yolov9-t\",label=\"yolov9-t:abababababab\",sha256=\"abab",
            "# TYPE yolo_edge_stage_duration_seconds histogram\n",
            "yolo_edge_stage_duration_seconds_bucket{le=\"0.05\",stage=\"infer\"} 1\n",
            "yolo_edge_stage_duration_seconds_bucket{le=\"+Inf\",stage=\"infer\"} 1\n",
            "yolo_edge_stage_duration_seconds_count{stage=\"preprocess\"} 1\n",
            "yolo_edge_stage_duration_seconds_count{stage=\"publish\"} 0\n",
            "# TYPE yolo_edge_device_memory_used_bytes gauge\nyolo_edge_device_memory_used_bytes 2147483648\n",
            "yolo_edge_memory_budget_bytes 1073741824\n",
            "yolo_edge_batch_size_current 4\n",
            "yolo_edge_batch_size_max 8\n",
            "yolo_edge_queue_depth{queue=\"mqtt\"} 0\n",
            "yolo_edge_spool_capacity_bytes 67108864\n",
            "yolo_edge_mqtt_connected 1\n",
            "yolo_edge_ready 1\n",
            "# TYPE yolo_edge_oom_fallbacks_total counter\nyolo_edge_oom_fallbacks_total 0\n",
        ] {
            assert!(t.contains(want), "missing {want:?} in:\n{t}");
        }
        assert!(!t.contains("# EOF") && !t.contains("# UNIT") && !t.contains(" info\n") && !t.contains(" unknown\n"), "{t}");
        // every family's TYPE names the samples that follow it
        let mut family = String::new();
        for line in t.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                family = rest.split(' ').next().unwrap().to_string();
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                let ok = name == family || ["_bucket", "_sum", "_count"].iter().any(|s| name.strip_suffix(s) == Some(&family));
                assert!(ok, "sample {name} under family {family}");
            }
        }
        // no picture-level label (image ids, paths) anywhere
        assert!(!t.contains("image") && !t.contains("/m.pt"), "{t}");
    }

    #[test]
    fn openmetrics_is_served_as_prometheus_client_writes_it() {
        let e = exporter();
        let om = e.render(Format::OpenMetrics);
        assert!(om.ends_with("# EOF\n"), "{om}");
        assert!(
            om.contains("# TYPE yolo_edge_frames counter\n") && om.contains("yolo_edge_frames_total{source=\"cam\",result=\"ok\"} 2\n")
        );
        assert!(om.contains("# TYPE yolo_edge_build info\n") && om.contains("# UNIT yolo_edge_spool_bytes bytes\n"), "{om}");
        // the 0.0.4 rendering is the same samples
        let samples = |t: &str| t.lines().filter(|l| !l.starts_with('#')).map(str::to_string).collect::<Vec<_>>();
        assert_eq!(samples(&om), samples(&to_text_004(&om)));
    }

    #[test]
    fn conversion_drops_exemplars_units_and_eof() {
        let om = "# HELP a_seconds A.\n# TYPE a_seconds counter\n# UNIT a_seconds seconds\na_seconds_total{k=\"v # {x}\"} 3 # {id=\"1\"} 1.0\n# HELP i Info.\n# TYPE i info\ni_info{v=\"1\"} 1\n# HELP u U.\n# TYPE u unknown\nu 2\n# EOF\n";
        assert_eq!(
            to_text_004(om),
            "# HELP a_seconds_total A.\n# TYPE a_seconds_total counter\na_seconds_total{k=\"v # {x}\"} 3\n# HELP i_info Info.\n# TYPE i_info gauge\ni_info{v=\"1\"} 1\n# HELP u U.\n# TYPE u untyped\nu 2\n"
        );
    }

    #[test]
    fn accept_headers_choose_the_format() {
        // what Prometheus 2.x sends
        let prom = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::from_accept(Some(prom)), Format::OpenMetrics);
        assert_eq!(Format::from_accept(Some("text/plain")), Format::Text004);
        assert_eq!(Format::from_accept(Some("application/openmetrics-text;q=0")), Format::Text004);
        assert_eq!(Format::from_accept(None), Format::Text004);
        assert_eq!(Format::Text004.content_type(), "text/plain; version=0.0.4; charset=utf-8");
    }

    #[test]
    fn before_the_model_is_loaded_the_agent_is_alive_and_not_ready() {
        let e = Exporter::new(Arc::new(Stats::default()), "cpu", "f32");
        let t = e.render(Format::Text004);
        assert!(t.contains("yolo_edge_ready 0\n") && t.contains("yolo_edge_model_ready 0\n"), "{t}");
        assert!(!t.contains("yolo_edge_model_info") && !t.contains("yolo_edge_memory_budget_bytes"), "{t}");
        // the build's labels are known from the start: one series for the process's life
        let build = format!("yolo_edge_build_info{{version=\"{}\",device=\"cpu\",dtype=\"f32\"}} 1\n", env!("CARGO_PKG_VERSION"));
        assert!(t.contains(&build), "{t}");
    }
}
