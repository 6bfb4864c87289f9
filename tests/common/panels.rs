//! Dashboard panels drawn from a real Prometheus: the range query of each panel of
//! `deploy/grafana/yolo-edge.json`, rendered as line charts into one PNG with plotters, so that
//! the docs show what the dashboard shows for a real run (`docs/monitoring.md`).

use std::path::Path;

use plotters::prelude::*;

static FONT: &[u8] = include_bytes!("../../src/assets/fonts/DejaVuSansMono.ttf");

/// One line of a panel: its label and (seconds since the start, value) points.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// One panel: a title, the unit its values are shown in, and its lines.
pub struct Panel {
    pub title: String,
    pub unit: Unit,
    pub series: Vec<Series>,
}

/// How a panel's values are shown.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Unit {
    /// Bytes, shown in MiB.
    Bytes,
    /// Seconds, shown in milliseconds.
    Seconds,
    /// Per second.
    Rate,
    /// A plain number.
    Count,
}

impl Unit {
    fn scale(self, v: f64) -> f64 {
        match self {
            Unit::Bytes => v / (1u64 << 20) as f64,
            Unit::Seconds => v * 1e3,
            Unit::Rate | Unit::Count => v,
        }
    }

    fn axis(self) -> &'static str {
        match self {
            Unit::Bytes => "MiB",
            Unit::Seconds => "ms",
            Unit::Rate => "per second",
            Unit::Count => "",
        }
    }
}

/// The series of a Prometheus range-query result (`data.result`), with times relative to
/// `start` (Unix seconds); each line is labelled by its labels other than the instance and job,
/// or by `expr` where it has none (e.g. an `increase(...)` summed over them).
pub fn series_of(result: &[serde_json::Value], start: f64, expr: &str) -> Vec<Series> {
    result
        .iter()
        .map(|r| {
            let labels: Vec<String> = r["metric"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .filter(|(k, _)| !matches!(k.as_str(), "instance" | "job"))
                        .map(|(k, v)| {
                            let v = v.as_str().unwrap_or_default();
                            if k == "__name__" {
                                v.trim_start_matches("yolo_edge_").to_string()
                            } else {
                                format!("{k}={v}")
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            let points = r["values"]
                .as_array()
                .map(|vs| {
                    vs.iter()
                        .filter_map(|p| Some((p[0].as_f64()? - start, p[1].as_str()?.parse::<f64>().ok().filter(|v| v.is_finite())?)))
                        .collect()
                })
                .unwrap_or_default();
            let label = if labels.is_empty() { expr.replace("{instance=~\".+\"}", "") } else { labels.join(" ") };
            Series { label, points }
        })
        .collect()
}

/// Draws `panels` in a grid of `cols` columns, 600x380 pixels each, into the PNG at `path`.
pub fn render(path: &Path, panels: &[Panel], cols: usize) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    let rows = panels.len().div_ceil(cols);
    let root = BitMapBackend::new(path, (600 * cols as u32, 380 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    for (area, panel) in root.split_evenly((rows, cols)).iter().zip(panels) {
        let u = panel.unit;
        let pts = || panel.series.iter().flat_map(|s| s.points.iter());
        let x_max = pts().map(|p| p.0).fold(1.0, f64::max);
        let y_max = pts().map(|p| u.scale(p.1)).fold(0.0, f64::max);
        let y_max = if y_max > 0.0 { y_max * 1.15 } else { 1.0 };
        let mut c = ChartBuilder::on(area)
            .margin(12)
            .x_label_area_size(35)
            .y_label_area_size(70)
            .caption(&panel.title, ("sans-serif", 18))
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)
            .map_err(|x| e(&x))?;
        c.configure_mesh().x_desc("seconds").y_desc(u.axis()).label_style(("sans-serif", 12)).draw().map_err(|x| e(&x))?;
        for (i, s) in panel.series.iter().enumerate() {
            let style = ShapeStyle { color: Palette99::pick(i).to_rgba(), filled: true, stroke_width: 2 };
            c.draw_series(LineSeries::new(s.points.iter().map(|&(x, y)| (x, u.scale(y))), style))
                .map_err(|x| e(&x))?
                .label(s.label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        }
        c.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 11))
            .draw()
            .map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))
}
