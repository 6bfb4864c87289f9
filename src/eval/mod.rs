//! Model evaluation on a YOLO-format dataset (`yolo-edge eval`): mAP50, mAP50-95, precision and
//! recall per class, computed the way ultralytics' `val` computes them (multi-label NMS at
//! conf 0.001 / IoU 0.7, matching in letterboxed pixels, `metrics` for the rest). Images are
//! decoded in parallel one batch ahead of the forward pass; a split's video files follow, their
//! frames decoded in order through `media` (feature `gstreamer`) and evaluated as pictures.

pub mod dataset;
pub mod metrics;

use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;
use serde::Serialize;

use crate::detector::Detector;
use crate::vision::postprocess::{self, Candidate, Thresholds};
use crate::vision::preprocess::{self, DecodeLimits, Letterboxed};
use dataset::{Dataset, DatasetError, Label, Sample, VideoSample};
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

/// An image or video frame left out of the metrics, and why (unreadable picture or video,
/// invalid label file).
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    /// The picture, or the video file.
    pub image: PathBuf,
    /// The frame of a video (from 0); absent for a picture, and for a whole video.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frame: Option<u64>,
    pub reason: String,
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.frame {
            Some(i) => write!(f, "{} frame {i}: {}", self.image.display(), self.reason),
            None => write!(f, "{}: {}", self.image.display(), self.reason),
        }
    }
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
    /// Images and video frames evaluated.
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

/// The labels of one picture or frame; a missing file means no objects (a background image).
fn read_labels(path: &Path, nc: Option<usize>) -> Result<Vec<Label>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => dataset::parse_labels(&text, nc).map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(vec![]),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

fn prepare(s: &Sample, imgsz: u32, nc: Option<usize>, limits: &DecodeLimits) -> Result<Prepared, Skipped> {
    let skip = |reason: String| Skipped { image: s.image.clone(), frame: None, reason };
    let labels = read_labels(&s.labels, nc).map_err(skip)?;
    let img = preprocess::load_image(&s.image, limits).map_err(|e| skip(e.to_string()))?;
    Ok(Prepared { lb: preprocess::letterbox(&img, imgsz), labels })
}

/// Sends the frames of `v`, letterboxed with their labels, in batches of `batch`; false when
/// the consumer stopped. An unreadable video or a decode error mid-way becomes one [`Skipped`]
/// (the frames before it are kept); label files naming frames past the video's end are
/// reported, since their objects would otherwise be silently left out.
#[cfg(feature = "gstreamer")]
fn send_video(v: &VideoSample, batch: usize, imgsz: u32, nc: Option<usize>, tx: &SyncSender<Vec<Result<Prepared, Skipped>>>) -> bool {
    use crate::media::{DecoderPref, VideoReader};
    let skip = |frame: Option<u64>, reason: String| Skipped { image: v.video.clone(), frame, reason };
    let labels = match v.frame_labels() {
        Ok(l) => l,
        Err(e) => return tx.send(vec![Err(skip(None, e.to_string()))]).is_ok(),
    };
    let reader = match VideoReader::open(&v.video, DecoderPref::Cpu) {
        Ok(r) => r,
        Err(e) => return tx.send(vec![Err(skip(None, e.to_string()))]).is_ok(),
    };
    let mut pending = Vec::with_capacity(batch);
    let mut frames = 0u64;
    for f in reader {
        let item = match f {
            Ok(f) => {
                let index = frames;
                frames += 1;
                let lb = image::RgbImage::from_raw(f.width, f.height, f.data)
                    .map(|img| preprocess::letterbox(&img, imgsz))
                    .ok_or_else(|| skip(Some(index), "frame of the wrong size".into()));
                let found = labels.get(&index).map(|p| read_labels(p, nc)).unwrap_or(Ok(vec![]));
                lb.and_then(|lb| found.map(|labels| Prepared { lb, labels }).map_err(|e| skip(Some(index), e)))
            }
            // the reader ends after an error: the frames before it count
            Err(e) => Err(skip(Some(frames), e.to_string())),
        };
        pending.push(item);
        if pending.len() == batch && tx.send(std::mem::take(&mut pending)).is_err() {
            return false;
        }
    }
    let past: Vec<u64> = labels.range(frames..).map(|(i, _)| *i).collect();
    if let (Some(first), Some(last)) = (past.first(), past.last()) {
        pending.push(Err(skip(
            None,
            format!("{} label file(s) name frames {first}..={last}, past the video's last frame ({frames} frames)", past.len()),
        )));
    }
    pending.is_empty() || tx.send(pending).is_ok()
}

#[cfg(not(feature = "gstreamer"))]
fn send_video(v: &VideoSample, _batch: usize, _imgsz: u32, _nc: Option<usize>, tx: &SyncSender<Vec<Result<Prepared, Skipped>>>) -> bool {
    let reason = "reading video needs a yolo-edge built with the `gstreamer` feature".to_string();
    tx.send(vec![Err(Skipped { image: v.video.clone(), frame: None, reason })]).is_ok()
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

/// Evaluates `det` on `ds`. `progress(done, total)` is called after each batch, with the number
/// of pictures and frames taken so far and the total when it is known (not for a split with
/// videos: their frame counts are known only once they are read).
pub fn evaluate(
    det: &Detector,
    ds: &Dataset,
    opts: &EvalOptions,
    progress: &mut dyn FnMut(usize, Option<usize>),
) -> Result<EvalReport, EvalError> {
    if opts.batch == 0 {
        return Err(EvalError::Options("batch must be at least 1".into()));
    }
    let th = opts.thresholds;
    let imgsz = det.imgsz();
    let nc_labels = if ds.names.is_empty() { None } else { Some(ds.names.len()) };
    let start = Instant::now();
    let total = if ds.videos.is_empty() { Some(ds.samples.len()) } else { None };

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
                    return; // the consumer stopped (error)
                }
            }
            for v in &ds.videos {
                if !send_video(v, opts.batch, imgsz as u32, nc_labels, &tx) {
                    return;
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
