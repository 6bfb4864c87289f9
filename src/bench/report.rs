//! Benchmark results and their renderings: the Markdown table operators look for
//! (batch | peak memory | latency | throughput, OOM marked), CSV, and a PNG chart of
//! throughput and peak memory against batch size (plotters, embedded DejaVu Sans Mono).

use std::path::Path;

use serde::Serialize;

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("writing {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("drawing the chart {path}: {reason}")]
    Chart { path: String, reason: String },
}

/// What happened at one (model, dtype, mode, batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Oom,
    Error,
}

/// One row of the benchmark.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub model: String,
    pub dtype: String,
    /// `model` (tensor in, raw out) or `e2e` (JPEG files in, detections out).
    pub mode: String,
    pub batch: usize,
    pub status: Status,
    /// Median (p50) wall-clock latency of one batch (ms): the host's call until the device is
    /// done.
    pub latency_ms: Option<f64>,
    /// 99th percentile of the wall-clock latency (ms).
    pub p99_ms: Option<f64>,
    pub min_ms: Option<f64>,
    pub max_ms: Option<f64>,
    /// Median and 99th percentile of the device's own time per batch (ms, CUDA events around
    /// the call); none on the CPU.
    pub device_p50_ms: Option<f64>,
    pub device_p99_ms: Option<f64>,
    /// batch / median latency; end to end, pictures per second while files stream through
    /// ([`Row::e2e`]).
    pub images_per_s: Option<f64>,
    /// Peak device memory above the resident model during one batch (MiB).
    pub peak_mib: Option<f64>,
    pub iters: usize,
    pub error: Option<String>,
    /// End to end only: where the host's time goes per picture when files stream through
    /// (`images_per_s` is then that stream's throughput, not batch / latency).
    pub e2e: Option<E2eCost>,
}

/// The host's cost per picture of the end-to-end path, measured while pictures stream through
/// the decode feed into the model, batch after batch.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct E2eCost {
    /// CPU time per picture (ms) on the feed's threads: reading the file, decoding, letterboxing.
    pub read_ms: f64,
    pub decode_ms: f64,
    pub letterbox_ms: f64,
    /// Wall time per picture (ms) of the inference thread's call: upload, the pass, the
    /// candidates' copy back, NMS.
    pub detect_ms: f64,
    /// Wall time per picture (ms) the inference thread waited for the feed.
    pub wait_ms: f64,
    /// Cores the feed kept busy on average (its CPU time over the wall time).
    pub feed_cores: f64,
    /// Pictures streamed.
    pub pictures: usize,
}

/// The `p`-th percentile (0-100, nearest rank) of `v`; `None` when `v` is empty. Sorts `v`.
pub fn percentile(v: &mut [f64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0 * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

/// The median of `v` (the mean of the middle two for an even count); `None` when empty. Sorts `v`.
pub fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

impl Row {
    pub fn per_image_mib(&self) -> Option<f64> {
        self.peak_mib.map(|p| p / self.batch as f64)
    }
}

fn f(v: Option<f64>, prec: usize) -> String {
    v.map_or(String::new(), |x| format!("{x:.prec$}"))
}

/// The Markdown table.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "| model | dtype | mode | batch | peak memory (MiB) | MiB/image | latency (ms) | throughput (img/s) | p99 (ms) | device p50 (ms) | device p99 (ms) |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let (peak, lat, ips) = match r.status {
            Status::Ok => (f(r.peak_mib, 1), f(r.latency_ms, 2), f(r.images_per_s, 1)),
            Status::Oom => ("**OOM**".into(), "-".into(), "-".into()),
            Status::Error => ("error".into(), "-".into(), "-".into()),
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.model,
            r.dtype,
            r.mode,
            r.batch,
            peak,
            f(r.per_image_mib(), 1),
            lat,
            ips,
            f(r.p99_ms, 2),
            f(r.device_p50_ms, 3),
            f(r.device_p99_ms, 3)
        ));
    }
    s
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The end-to-end rows' host cost per picture, as a Markdown table (empty without such rows).
pub fn e2e_markdown(rows: &[Row]) -> String {
    let e2e: Vec<(&Row, &E2eCost)> = rows.iter().filter_map(|r| r.e2e.as_ref().map(|c| (r, c))).collect();
    if e2e.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "| model | dtype | batch | streamed (img/s) | read (ms/img) | decode (ms/img) | letterbox (ms/img) | detect (ms/img) | waiting for the feed (ms/img) | feed cores busy | decode share of host CPU |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (r, c) in e2e {
        let cpu = c.read_ms + c.decode_ms + c.letterbox_ms + c.detect_ms;
        s.push_str(&format!(
            "| {} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.1} | {:.0}% |\n",
            r.model,
            r.dtype,
            r.batch,
            f(r.images_per_s, 1),
            c.read_ms,
            c.decode_ms,
            c.letterbox_ms,
            c.detect_ms,
            c.wait_ms,
            c.feed_cores,
            if cpu > 0.0 { 100.0 * c.decode_ms / cpu } else { 0.0 }
        ));
    }
    s
}

/// CSV with a header line.
pub fn csv(rows: &[Row]) -> String {
    let mut s = String::from(
        "model,dtype,mode,batch,status,latency_ms,min_ms,max_ms,images_per_s,peak_mib,mib_per_image,iters,error,p99_ms,device_p50_ms,device_p99_ms,read_ms,decode_ms,letterbox_ms,detect_ms,wait_ms,feed_cores\n",
    );
    for r in rows {
        let status = match r.status {
            Status::Ok => "ok",
            Status::Oom => "oom",
            Status::Error => "error",
        };
        let e = |g: fn(&E2eCost) -> f64| f(r.e2e.as_ref().map(g), 3);
        s.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
            csv_field(&r.model),
            r.dtype,
            r.mode,
            r.batch,
            status,
            f(r.latency_ms, 3),
            f(r.min_ms, 3),
            f(r.max_ms, 3),
            f(r.images_per_s, 1),
            f(r.peak_mib, 1),
            f(r.per_image_mib(), 2),
            r.iters,
            csv_field(r.error.as_deref().unwrap_or("")),
            f(r.p99_ms, 3),
            f(r.device_p50_ms, 4),
            f(r.device_p99_ms, 4),
            e(|c| c.read_ms),
            e(|c| c.decode_ms),
            e(|c| c.letterbox_ms),
            e(|c| c.detect_ms),
            e(|c| c.wait_ms),
            e(|c| c.feed_cores)
        ));
    }
    s
}

pub fn write(path: &Path, text: &str) -> Result<(), ReportError> {
    std::fs::write(path, text).map_err(|source| ReportError::Io { path: path.display().to_string(), source })
}

static FONT: &[u8] = include_bytes!("../assets/fonts/DejaVuSansMono.ttf");

/// Draws throughput (left) and peak memory (right) against batch (log2 axis), one line per
/// (model, dtype, mode) with OOM batches marked by crosses on the memory panel's top edge.
pub fn chart(rows: &[Row], title: &str, path: &Path) -> Result<(), ReportError> {
    use plotters::prelude::*;
    let cerr = |e: &dyn std::fmt::Display| ReportError::Chart { path: path.display().to_string(), reason: e.to_string() };
    let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    let mut series: Vec<(String, Vec<&Row>)> = Vec::new();
    for r in rows {
        let key = format!("{} {} {}", r.model, r.dtype, r.mode);
        match series.iter_mut().find(|s| s.0 == key) {
            Some(s) => s.1.push(r),
            None => series.push((key, vec![r])),
        }
    }
    let ok = |r: &&Row| r.status == Status::Ok;
    let max_b = rows.iter().map(|r| r.batch).max().unwrap_or(1).max(2) as f64;
    let max_ips = rows.iter().filter(ok).filter_map(|r| r.images_per_s).fold(1.0, f64::max) * 1.1;
    let max_mem = rows.iter().filter(ok).filter_map(|r| r.peak_mib).fold(1.0, f64::max) * 1.1;
    let root = BitMapBackend::new(path, (1600, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| cerr(&e))?;
    let root = root.titled(title, ("sans-serif", 24)).map_err(|e| cerr(&e))?;
    let (left, right) = root.split_horizontally(800);
    let x_range = (1.0f64..max_b * 1.2).log_scale();
    for (area, is_mem) in [(left, false), (right, true)] {
        let mut c = ChartBuilder::on(&area)
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(80)
            .caption(if is_mem { "peak device memory (MiB) vs batch" } else { "throughput (img/s) vs batch" }, ("sans-serif", 20))
            .build_cartesian_2d(x_range.clone(), 0f64..if is_mem { max_mem } else { max_ips })
            .map_err(|e| cerr(&e))?;
        c.configure_mesh()
            .x_desc("batch")
            .y_desc(if is_mem { "MiB" } else { "images / s" })
            .x_label_formatter(&|v| format!("{v:.0}"))
            .draw()
            .map_err(|e| cerr(&e))?;
        for (i, (name, rs)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let pts: Vec<(f64, f64)> = rs
                .iter()
                .filter(|r| r.status == Status::Ok)
                .filter_map(|r| Some((r.batch as f64, if is_mem { r.peak_mib? } else { r.images_per_s? })))
                .collect();
            let style = ShapeStyle { color, filled: true, stroke_width: 2 };
            c.draw_series(LineSeries::new(pts.clone(), style))
                .map_err(|e| cerr(&e))?
                .label(name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
            c.draw_series(pts.iter().map(|&p| Circle::new(p, 3, style))).map_err(|e| cerr(&e))?;
            if is_mem {
                let top = max_mem * 0.98;
                c.draw_series(
                    rs.iter()
                        .filter(|r| r.status == Status::Oom)
                        .map(|r| Cross::new((r.batch as f64, top), 6, ShapeStyle { color, filled: false, stroke_width: 3 })),
                )
                .map_err(|e| cerr(&e))?;
            }
        }
        c.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(|e| cerr(&e))?;
    }
    root.present().map_err(|e| cerr(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(batch: usize, status: Status) -> Row {
        let ok = status == Status::Ok;
        Row {
            model: "yolov9t".into(),
            dtype: "f16".into(),
            mode: "model".into(),
            batch,
            status,
            latency_ms: ok.then_some(2.0 * batch as f64),
            p99_ms: ok.then_some(2.4 * batch as f64),
            min_ms: ok.then_some(1.9 * batch as f64),
            max_ms: ok.then_some(2.5 * batch as f64),
            device_p50_ms: ok.then_some(1.5 * batch as f64),
            device_p99_ms: None,
            images_per_s: ok.then_some(500.0),
            peak_mib: ok.then_some(100.0 + 20.0 * batch as f64),
            iters: 5,
            error: (!ok).then(|| "CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\"".into()),
            e2e: None,
        }
    }

    #[test]
    fn tables_mark_oom_and_quote_csv() {
        let rows = vec![row(1, Status::Ok), row(2, Status::Ok), row(4, Status::Oom)];
        let md = markdown(&rows);
        assert_eq!(md.lines().count(), 5);
        assert!(md.contains("| yolov9t | f16 | model | 4 | **OOM** |"));
        assert!(md.contains("| 2 | 140.0 | 70.0 | 4.00 | 500.0 | 4.80 | 3.000 |  |"), "{md}");
        let c = csv(&rows);
        assert_eq!(c.lines().count(), 4);
        assert!(c.lines().nth(1).unwrap().ends_with(",5,,2.400,1.5000,,,,,,,"), "{c}");
        assert!(c.lines().nth(3).unwrap().ends_with(",oom,,,,,,,5,\"CUDA_ERROR_OUT_OF_MEMORY, \"\"out of memory\"\"\",,,,,,,,,"));
        assert_eq!(e2e_markdown(&rows), "", "no end-to-end rows, no table");
    }

    #[test]
    fn end_to_end_rows_get_their_host_cost_table_and_columns() {
        let mut r = row(8, Status::Ok);
        r.mode = "e2e".into();
        r.images_per_s = Some(800.0);
        r.e2e = Some(E2eCost {
            read_ms: 0.1,
            decode_ms: 14.0,
            letterbox_ms: 2.5,
            detect_ms: 1.0,
            wait_ms: 0.3,
            feed_cores: 13.2,
            pictures: 160,
        });
        let md = e2e_markdown(&[r.clone()]);
        assert!(md.contains("| yolov9t | f16 | 8 | 800.0 | 0.100 | 14.000 | 2.500 | 1.000 | 0.300 | 13.2 | 80% |"), "{md}");
        assert!(csv(&[r]).lines().nth(1).unwrap().ends_with(",0.100,14.000,2.500,1.000,0.300,13.200"));
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut v: Vec<f64> = (1..=1000).rev().map(f64::from).collect();
        assert_eq!(percentile(&mut v, 50.0), Some(500.0));
        assert_eq!(percentile(&mut v, 99.0), Some(990.0));
        assert_eq!(percentile(&mut v, 100.0), Some(1000.0));
        assert_eq!(percentile(&mut v, 0.0), Some(1.0));
        assert_eq!(percentile(&mut [7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&mut [], 50.0), None);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn chart_is_a_png() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.png");
        let mut rows = vec![row(1, Status::Ok), row(2, Status::Ok), row(4, Status::Oom)];
        let mut r2 = row(1, Status::Ok);
        r2.dtype = "f32".into();
        rows.push(r2);
        chart(&rows, "test chart", &p).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        assert!(bytes.len() > 10_000);
    }
}
