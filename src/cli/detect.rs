//! `yolo-edge detect`: images and video files in, JSON Lines / raw output / annotated pictures
//! out (a video: one record per frame, `{"video", "frame", "pts_ms", ...}`). One bad picture gets
//! its own error record; the others go on.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use candle_core::Tensor;
use clap::Args;

use yolo_edge::backend::device;
use yolo_edge::detector::{DecodedJpegs, Detector};
use yolo_edge::eval::dataset::is_video;
use yolo_edge::vision::annotate;
use yolo_edge::vision::feed::{Feed, FeedOptions, Picture};
use yolo_edge::vision::postprocess::{Detection, Thresholds};
use yolo_edge::vision::preprocess::{self, DecodeLimits, Letterboxed};

#[derive(Args)]
pub struct DetectArgs {
    /// Checkpoint (.pt or .safetensors).
    #[arg(long)]
    model: PathBuf,
    /// auto, cpu or cuda:N
    #[arg(long, default_value = "auto")]
    device: String,
    /// auto (f16 on CUDA, f32 on CPU), f32 or f16
    #[arg(long, default_value = "auto")]
    dtype: String,
    /// Network input size (multiple of 32).
    #[arg(long, default_value_t = 640, value_parser = super::common::parse_imgsz)]
    imgsz: usize,
    #[arg(long, default_value_t = 0.25)]
    conf: f32,
    #[arg(long, default_value_t = 0.7)]
    iou: f32,
    #[arg(long, default_value_t = 300)]
    max_det: usize,
    /// Pictures per forward pass (pictures of one input shape share a pass).
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// How pictures fit the network input: rect (the reference's `predict` default: the long
    /// side to imgsz, the short side padded to a multiple of 32) or square (imgsz x imgsz).
    #[arg(long, default_value = "rect")]
    fit: preprocess::Fit,
    #[command(flatten)]
    jpeg: super::common::JpegArgs,
    /// Write JSON Lines here (`-` for stdout), one object per input, in input order.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the raw output (B, 4+nc, anchors) as float32 .npy (decoded pictures only).
    #[arg(long)]
    raw_out: Option<PathBuf>,
    /// Write each picture with its boxes drawn into this folder.
    #[arg(long)]
    annotate: Option<PathBuf>,
    /// Images (JPEG, PNG, BMP, WebP), and video files (.mp4, .mkv, .mov, .avi, .webm, .ts, .h264,
    /// .h265: one output record per frame; needs a build with the `gstreamer` feature).
    #[arg(required = true)]
    images: Vec<PathBuf>,
    #[command(flatten)]
    tuning: super::common::TuningArgs,
}

pub fn run(a: DetectArgs) -> anyhow::Result<ExitCode> {
    a.tuning.install()?;
    anyhow::ensure!(a.batch >= 1, "--batch must be at least 1");
    anyhow::ensure!((0.0..=1.0).contains(&a.conf) && (0.0..=1.0).contains(&a.iou), "--conf and --iou must be within 0..1");
    let dev = device::parse_device(&a.device)?;
    let dtype = device::parse_dtype(&a.dtype, &dev)?;
    let det = Detector::load(&a.model, &dev, dtype, Some(a.imgsz)).with_context(|| format!("loading model {}", a.model.display()))?;
    // on CUDA every batch replays a captured graph (`--cuda-graphs off`: eager); a last, partial
    // batch is padded up to the next power of two, as in the agent
    det.use_graphs(true);
    det.set_graph_ladder(a.batch);
    let th = Thresholds { conf: a.conf, iou: a.iou, max_det: a.max_det };
    let mut json: Option<Box<dyn Write>> = match &a.json {
        Some(p) if p.as_os_str() == "-" => Some(Box::new(std::io::stdout().lock())),
        Some(p) => Some(Box::new(std::io::BufWriter::new(std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?))),
        None => None,
    };
    if let Some(dir) = &a.annotate {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let limits = DecodeLimits::default();
    let mut out = Output { raws: Vec::new(), failed: 0, total: 0, dets: 0 };
    let mut ctx = Ctx {
        det: &det,
        th: &th,
        imgsz: a.imgsz as u32,
        fit: a.fit,
        raw_out: a.raw_out.is_some(),
        limits,
        annotate: a.annotate.as_deref(),
        json: json.as_mut(),
    };
    // the raw output is of pictures letterboxed on the host
    let jpeg_on_device = a.raw_out.is_none() && a.jpeg.setup(&det)?;
    let feed = FeedOptions {
        batch: a.batch,
        imgsz: a.imgsz as u32,
        fit: a.fit,
        limits,
        keep_decoded: a.annotate.is_some(),
        jpeg_on_device,
        ahead: 2,
    };
    let mut pictures: Vec<PathBuf> = Vec::new();
    for path in &a.images {
        if !is_video(path) {
            pictures.push(path.clone());
            continue;
        }
        // pictures before the video keep their place in the output
        ctx.pictures(std::mem::take(&mut pictures), feed, &mut out)?;
        ctx.video(path, a.batch, &mut out)?;
    }
    ctx.pictures(pictures, feed, &mut out)?;
    let Output { raws, failed, total, dets: total_dets } = out;
    if let Some(w) = json.as_mut() {
        w.flush()?;
    }
    if let Some(p) = &a.raw_out {
        if raws.is_empty() {
            eprintln!("warning: no picture decoded, {} not written", p.display());
        } else {
            anyhow::ensure!(
                raws.iter().all(|r| r.dims()[1..] == raws[0].dims()[1..]),
                "--raw-out needs one input shape for every picture: use --fit square, or pictures of one shape"
            );
            Tensor::cat(&raws, 0)?.write_npy(p).with_context(|| format!("writing {}", p.display()))?;
        }
    }
    eprintln!("{total} picture(s) and frame(s), {failed} failed, {total_dets} detection(s)");
    Ok(if failed > 0 { ExitCode::from(super::exit::PARTIAL) } else { ExitCode::SUCCESS })
}

struct Output {
    raws: Vec<Tensor>,
    failed: usize,
    /// Pictures and frames.
    total: usize,
    dets: usize,
}

/// One picture or frame to detect on: the fields naming it in its record, and its pixels.
struct Item {
    name: serde_json::Map<String, serde_json::Value>,
    /// The annotated picture's file name (without extension).
    stem: String,
    picture: Result<Picture, String>,
}

struct Ctx<'a> {
    det: &'a Detector,
    th: &'a Thresholds,
    /// How video frames are letterboxed (pictures come letterboxed from the feed).
    #[cfg_attr(not(feature = "gstreamer"), allow(dead_code))]
    imgsz: u32,
    #[cfg_attr(not(feature = "gstreamer"), allow(dead_code))]
    fit: preprocess::Fit,
    raw_out: bool,
    limits: DecodeLimits,
    annotate: Option<&'a std::path::Path>,
    json: Option<&'a mut Box<dyn Write>>,
}

impl Ctx<'_> {
    /// Image files, decoded on every core a few batches ahead of the model ([`Feed`]).
    fn pictures(&mut self, paths: Vec<PathBuf>, o: FeedOptions, out: &mut Output) -> anyhow::Result<()> {
        if paths.is_empty() {
            return Ok(());
        }
        let feed = Feed::spawn(paths, o).context("starting the picture feed")?;
        let (det, limits) = (self.det, self.limits);
        det.each_decoded(feed, &limits, |batch, decoded| {
            let items = batch
                .into_iter()
                .map(|p| {
                    let mut name = serde_json::Map::new();
                    name.insert("image".into(), serde_json::json!(p.path));
                    let stem = p.path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "image".into());
                    Item { name, stem, picture: p.picture.map_err(|e| e.to_string()) }
                })
                .collect();
            self.run(items, decoded, out)
        })
    }

    #[cfg(feature = "gstreamer")]
    fn video(&mut self, path: &std::path::Path, batch: usize, out: &mut Output) -> anyhow::Result<()> {
        use rayon::prelude::*;
        use yolo_edge::media::{DecoderPref, VideoReader};
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "video".into());
        let mut reader = match VideoReader::open(path, DecoderPref::Cpu) {
            Ok(r) => r,
            Err(e) => {
                out.failed += 1;
                eprintln!("error: {}: {e}", path.display());
                return self.record(serde_json::json!({"video": path, "error": e.to_string()}));
            }
        };
        let mut index = 0u64;
        loop {
            let mut items = Vec::with_capacity(batch);
            let mut error = None;
            for f in reader.by_ref() {
                match f {
                    Ok(f) => {
                        let mut name = serde_json::Map::new();
                        name.insert("video".into(), serde_json::json!(path));
                        name.insert("frame".into(), serde_json::json!(index));
                        name.insert("pts_ms".into(), serde_json::json!(f.pts_ns.map(|n| n as f64 / 1e6)));
                        let image =
                            image::RgbImage::from_raw(f.width, f.height, f.data).ok_or_else(|| "frame of the wrong size".to_string());
                        items.push((name, format!("{stem}-{index:06}"), image));
                        index += 1;
                        if items.len() == batch {
                            break;
                        }
                    }
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
            let last = items.len() < batch;
            let (imgsz, fit, keep) = (self.imgsz, self.fit, self.annotate.is_some());
            let items = items
                .into_par_iter()
                .map(|(name, stem, image)| {
                    let picture = image.map(|img| Picture {
                        pixels: yolo_edge::vision::feed::Pixels::Letterboxed(preprocess::letterbox_fit(&img, imgsz, fit)),
                        decoded: keep.then_some(img),
                    });
                    Item { name, stem, picture }
                })
                .collect();
            self.run(items, None, out)?;
            if let Some(e) = error {
                out.failed += 1;
                eprintln!("error: {}: frame {index}: {e}", path.display());
                return self.record(serde_json::json!({"video": path, "frame": index, "error": e.to_string()}));
            }
            if last {
                return Ok(());
            }
        }
    }

    #[cfg(not(feature = "gstreamer"))]
    fn video(&mut self, path: &std::path::Path, _batch: usize, out: &mut Output) -> anyhow::Result<()> {
        out.failed += 1;
        let e = "reading video needs a yolo-edge built with the `gstreamer` feature";
        eprintln!("error: {}: {e}", path.display());
        self.record(serde_json::json!({"video": path, "error": e}))
    }

    fn record(&mut self, r: serde_json::Value) -> anyhow::Result<()> {
        if let Some(w) = self.json.as_mut() {
            writeln!(w, "{r}")?;
        }
        Ok(())
    }

    /// Runs (one forward pass per input shape) and writes one record per item, in order.
    /// `decoded`: the items' JPEGs already on the device ([`Detector::each_decoded`]).
    fn run(&mut self, items: Vec<Item>, decoded: Option<DecodedJpegs>, out: &mut Output) -> anyhow::Result<()> {
        let ok: Vec<&Picture> = items.iter().filter_map(|it| it.picture.as_ref().ok()).collect();
        let results: Vec<Result<Vec<Detection>, String>> = if self.raw_out {
            self.run_raw(&ok, out)?.into_iter().map(Ok).collect()
        } else {
            let r = self.det.detect_pictures_decoded(&ok, decoded, self.th, &self.limits).context("forward pass")?;
            r.into_iter().map(|d| d.map_err(|e| e.to_string())).collect()
        };
        let mut results = results.into_iter();
        for it in items {
            out.total += 1;
            let mut record = it.name;
            let outcome = it.picture.and_then(|p| results.next().unwrap_or_else(|| Ok(Vec::new())).map(|d| (p, d)));
            match outcome {
                Err(e) => {
                    out.failed += 1;
                    let name = record.values().next().map(|v| v.to_string()).unwrap_or_default();
                    eprintln!("error: {name}: {e}");
                    record.insert("error".into(), serde_json::json!(e));
                }
                Ok((p, dets)) => {
                    out.dets += dets.len();
                    let g = *p.geometry();
                    if let (Some(dir), Some(mut img)) = (self.annotate, p.decoded) {
                        annotate::draw(&mut img, &dets);
                        let path = dir.join(format!("{}.jpg", it.stem));
                        img.save(&path).with_context(|| format!("writing {}", path.display()))?;
                    }
                    record.insert("width".into(), serde_json::json!(g.orig_w));
                    record.insert("height".into(), serde_json::json!(g.orig_h));
                    record.insert("detections".into(), serde_json::json!(dets));
                }
            }
            self.record(serde_json::Value::Object(record))?;
        }
        Ok(())
    }

    /// The raw outputs (kept for `--raw-out`) and detections of pictures letterboxed on the host,
    /// one pass per input shape.
    fn run_raw(&mut self, ok: &[&Picture], out: &mut Output) -> anyhow::Result<Vec<Vec<Detection>>> {
        let ok: Vec<&Letterboxed> = ok.iter().filter_map(|p| p.letterboxed()).collect();
        let mut shapes: Vec<(u32, u32)> = Vec::new();
        for lb in &ok {
            let s = (lb.geometry.in_w, lb.geometry.in_h);
            if !shapes.contains(&s) {
                shapes.push(s);
            }
        }
        let mut by_picture: Vec<Vec<Detection>> = vec![Vec::new(); ok.len()];
        for shape in shapes {
            let idx: Vec<usize> = (0..ok.len()).filter(|&i| (ok[i].geometry.in_w, ok[i].geometry.in_h) == shape).collect();
            let group: Vec<&Letterboxed> = idx.iter().map(|&i| ok[i]).collect();
            let raw = self.det.raw(&group).context("forward pass")?;
            let cands = self.det.candidates(&raw, self.th.conf)?;
            out.raws.push(raw.to_dtype(candle_core::DType::F32)?.to_device(&candle_core::Device::Cpu)?);
            for (c, &i) in cands.into_iter().zip(&idx) {
                by_picture[i] = yolo_edge::vision::postprocess::finish(c, self.th, &ok[i].geometry, &self.det.info().names);
            }
        }
        Ok(by_picture)
    }
}
