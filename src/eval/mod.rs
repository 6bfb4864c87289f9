//! Model evaluation on a YOLO-format dataset (`yolo-edge eval`): mAP50, mAP50-95, precision and
//! recall per class, computed the way ultralytics' `val` computes them (multi-label NMS at
//! conf 0.001 / IoU 0.7, matching in letterboxed pixels, `metrics` for the rest). Images are
//! decoded in parallel one batch ahead of the forward pass.

pub mod dataset;
pub mod metrics;

use std::path::PathBuf;
use std::sync::mpsc::sync_channel;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;
use serde::Serialize;

use crate::detector::Detector;
use crate::vision::postprocess::{self, Candidate, Thresholds};
use crate::vision::preprocess::{self, DecodeLimits, Letterboxed};
use dataset::{Dataset, DatasetError, Label, Sample};
use metrics::{LabeledBox, ScoredPrediction};

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    #[error("inference failed: {0}")]
    Inference(#[from] candle_core::Error),
    #[error("no image of the split could be evaluated ({0} skipped)")]
    NothingEvaluated(usize),
    #[error("invalid option: {0}")]
    Options(String),
}

/// How to evaluate. The defaults are the reference's validation settings.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    pub thresholds: Thresholds,
    /// Pictures per forward pass.
    pub batch: usize,
    pub limits: DecodeLimits,
}

impl Default for EvalOptions {
    fn default() -> Self {
        Self { thresholds: Thresholds { conf: 0.001, iou: 0.7, max_det: 300 }, batch: 8, limits: DecodeLimits::default() }
    }
}

/// An image left out of the metrics, and why (unreadable picture or invalid label file).
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    pub image: PathBuf,
    pub reason: String,
}

/// The metrics of one class that has labelled objects.
#[derive(Debug, Clone, Serialize)]
pub struct ClassReport {
    pub class_id: usize,
    pub name: String,
    /// Images that contain at least one object of the class.
    pub images: usize,
    pub instances: usize,
    pub precision: f64,
    pub recall: f64,
    pub map50: f64,
    pub map50_95: f64,
}

/// The result of an evaluation run.
#[derive(Debug, Clone, Serialize)]
pub struct EvalReport {
    pub split: String,
    pub imgsz: usize,
    pub conf: f32,
    pub iou: f32,
    /// Images evaluated.
    pub images: usize,
    pub instances: usize,
    pub precision: f64,
    pub recall: f64,
    pub map50: f64,
    pub map50_95: f64,
    /// Confidence at which precision and recall are reported (peak of the smoothed mean F1).
    pub best_f1_confidence: f64,
    pub classes: Vec<ClassReport>,
    pub skipped: Vec<Skipped>,
    pub seconds: f64,
    pub images_per_second: f64,
}

/// One decoded picture with its labels.
struct Prepared {
    lb: Letterboxed,
    labels: Vec<Label>,
}

fn prepare(s: &Sample, imgsz: u32, nc: Option<usize>, limits: &DecodeLimits) -> Result<Prepared, Skipped> {
    let skip = |reason: String| Skipped { image: s.image.clone(), reason };
    let labels = match std::fs::read_to_string(&s.labels) {
        Ok(text) => dataset::parse_labels(&text, nc).map_err(|e| skip(format!("{}: {e}", s.labels.display())))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => vec![], // background image
        Err(e) => return Err(skip(format!("{}: {e}", s.labels.display()))),
    };
    let img = preprocess::load_image(&s.image, limits).map_err(|e| skip(e.to_string()))?;
    Ok(Prepared { lb: preprocess::letterbox(&img, imgsz), labels })
}

/// Multi-label candidates (every class score above `conf` of every anchor), as the reference's
/// validation NMS takes them, in network-input pixels.
pub fn multilabel_candidates(raw: &Tensor, conf: f32) -> candle_core::Result<Vec<Vec<Candidate>>> {
    let (b, no, a) = raw.dims3()?;
    if no < 5 {
        candle_core::bail!("raw output has {no} rows, expected 4 box rows and at least one class");
    }
    let v = raw.to_dtype(DType::F32)?.to_device(&Device::Cpu)?.flatten_all()?.to_vec1::<f32>()?;
    Ok((0..b)
        .map(|i| {
            let o = i * no * a;
            let mut out = Vec::new();
            for j in 0..a {
                for c in 0..no - 4 {
                    let s = v[o + (4 + c) * a + j];
                    if s > conf {
                        out.push(Candidate { xywh: [v[o + j], v[o + a + j], v[o + 2 * a + j], v[o + 3 * a + j]], score: s, class_id: c });
                    }
                }
            }
            out
        })
        .collect())
}

/// Evaluates `det` on `ds`. `progress(done, total)` is called after each batch.
pub fn evaluate(det: &Detector, ds: &Dataset, opts: &EvalOptions, progress: &mut dyn FnMut(usize, usize)) -> Result<EvalReport, EvalError> {
    if opts.batch == 0 {
        return Err(EvalError::Options("batch must be at least 1".into()));
    }
    let th = opts.thresholds;
    let imgsz = det.imgsz();
    let nc_labels = if ds.names.is_empty() { None } else { Some(ds.names.len()) };
    let start = Instant::now();
    let total = ds.samples.len();

    let mut preds: Vec<ScoredPrediction> = Vec::new();
    let mut target_classes: Vec<usize> = Vec::new();
    let mut images_per_class: Vec<usize> = Vec::new();
    let mut skipped: Vec<Skipped> = Vec::new();
    let mut seen = 0usize;

    std::thread::scope(|scope| -> Result<(), EvalError> {
        // decoder: one batch ahead of the forward pass, each batch decoded in parallel
        let (tx, rx) = sync_channel::<Vec<Result<Prepared, Skipped>>>(1);
        scope.spawn(move || {
            for chunk in ds.samples.chunks(opts.batch) {
                let batch: Vec<_> = chunk.par_iter().map(|s| prepare(s, imgsz as u32, nc_labels, &opts.limits)).collect();
                if tx.send(batch).is_err() {
                    break; // the consumer stopped (error)
                }
            }
        });
        let mut done = 0;
        for batch in rx {
            done += batch.len();
            let mut ok: Vec<Prepared> = Vec::with_capacity(batch.len());
            for r in batch {
                match r {
                    Ok(p) => ok.push(p),
                    Err(s) => skipped.push(s),
                }
            }
            if !ok.is_empty() {
                let lbs: Vec<&Letterboxed> = ok.iter().map(|p| &p.lb).collect();
                let raw = det.raw(&lbs)?;
                let cands = multilabel_candidates(&raw, th.conf)?;
                for (p, c) in ok.iter().zip(cands) {
                    seen += 1;
                    let g = &p.lb.geometry;
                    let gts: Vec<LabeledBox> = p
                        .labels
                        .iter()
                        .map(|l| {
                            // ground truth into the letterboxed picture, where predictions live
                            let [x1, y1, x2, y2] = l.xyxy(g.new_w as f64, g.new_h as f64);
                            let (dx, dy) = (g.left as f64, g.top as f64);
                            LabeledBox { class_id: l.class_id, bbox: [x1 + dx, y1 + dy, x2 + dx, y2 + dy] }
                        })
                        .collect();
                    let kept = postprocess::nms(c, &th);
                    let boxes: Vec<LabeledBox> = kept
                        .iter()
                        .map(|(c, b)| LabeledBox { class_id: c.class_id, bbox: [b[0] as f64, b[1] as f64, b[2] as f64, b[3] as f64] })
                        .collect();
                    let correct = metrics::match_predictions(&boxes, &gts);
                    preds.extend(kept.iter().zip(correct).map(|((c, _), correct)| ScoredPrediction {
                        confidence: c.score as f64,
                        class_id: c.class_id,
                        correct,
                    }));
                    let mut present: Vec<usize> = gts.iter().map(|g| g.class_id).collect();
                    target_classes.extend(&present);
                    present.sort_unstable();
                    present.dedup();
                    for c in present {
                        if images_per_class.len() <= c {
                            images_per_class.resize(c + 1, 0);
                        }
                        images_per_class[c] += 1;
                    }
                }
            }
            progress(done, total);
        }
        Ok(())
    })?;

    if seen == 0 {
        return Err(EvalError::NothingEvaluated(skipped.len()));
    }
    let summary = metrics::ap_per_class(&preds, &target_classes);
    let names = if ds.names.is_empty() { &det.info().names } else { &ds.names };
    let seconds = start.elapsed().as_secs_f64();
    Ok(EvalReport {
        split: ds.split.clone(),
        imgsz,
        conf: th.conf,
        iou: th.iou,
        images: seen,
        instances: target_classes.len(),
        precision: summary.precision,
        recall: summary.recall,
        map50: summary.map50,
        map50_95: summary.map50_95,
        best_f1_confidence: summary.best_f1_confidence,
        classes: summary
            .classes
            .iter()
            .map(|c| ClassReport {
                class_id: c.class_id,
                name: names.get(c.class_id).cloned().unwrap_or_else(|| c.class_id.to_string()),
                images: images_per_class.get(c.class_id).copied().unwrap_or(0),
                instances: c.instances,
                precision: c.precision,
                recall: c.recall,
                map50: c.ap50(),
                map50_95: c.ap50_95(),
            })
            .collect(),
        skipped,
        seconds,
        images_per_second: seen as f64 / seconds.max(1e-9),
    })
}
