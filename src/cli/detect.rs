//! `yolo-edge detect`: images in, JSON Lines / raw output / annotated pictures out. One bad
//! picture gets its own error record; the others go on.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use candle_core::Tensor;
use clap::Args;
use rayon::prelude::*;

use yolo_edge::backend::device;
use yolo_edge::detector::Detector;
use yolo_edge::vision::annotate;
use yolo_edge::vision::postprocess::Thresholds;
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
    #[arg(long, default_value_t = 640)]
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
    /// Write JSON Lines here (`-` for stdout), one object per input, in input order.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the raw output (B, 4+nc, anchors) as float32 .npy (decoded pictures only).
    #[arg(long)]
    raw_out: Option<PathBuf>,
    /// Write each picture with its boxes drawn into this folder.
    #[arg(long)]
    annotate: Option<PathBuf>,
    /// Images (JPEG, PNG, BMP, WebP).
    #[arg(required = true)]
    images: Vec<PathBuf>,
    #[command(flatten)]
    tuning: super::common::TuningArgs,
}

pub fn run(a: DetectArgs) -> anyhow::Result<ExitCode> {
    a.tuning.install()?;
    anyhow::ensure!(a.batch >= 1, "--batch must be at least 1");
    anyhow::ensure!(a.imgsz > 0 && a.imgsz % 32 == 0, "--imgsz must be a positive multiple of 32, got {}", a.imgsz);
    anyhow::ensure!((0.0..=1.0).contains(&a.conf) && (0.0..=1.0).contains(&a.iou), "--conf and --iou must be within 0..1");
    let dev = device::parse_device(&a.device)?;
    let dtype = device::parse_dtype(&a.dtype, &dev)?;
    let det = Detector::load(&a.model, &dev, dtype, Some(a.imgsz)).with_context(|| format!("loading model {}", a.model.display()))?;
    det.use_graphs(true); // batch 1 on CUDA replays a captured graph (`--cuda-graphs off`: eager)
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
    let mut raws: Vec<Tensor> = Vec::new();
    let mut failed = 0usize;
    let mut total_dets = 0usize;
    for chunk in a.images.chunks(a.batch) {
        // decode + letterbox in parallel; keep per-picture errors
        let prepared: Vec<Result<(image::RgbImage, Letterboxed), String>> = chunk
            .par_iter()
            .map(|p| {
                let img = preprocess::load_image(p, &limits).map_err(|e| e.to_string())?;
                let lb = preprocess::letterbox_fit(&img, a.imgsz as u32, a.fit);
                Ok((img, lb))
            })
            .collect();
        // one forward pass per input shape, in order of first appearance; records stay in input order
        let ok: Vec<&Letterboxed> = prepared.iter().filter_map(|r| r.as_ref().ok().map(|(_, lb)| lb)).collect();
        let mut shapes: Vec<(u32, u32)> = Vec::new();
        for lb in &ok {
            let s = (lb.geometry.in_w, lb.geometry.in_h);
            if !shapes.contains(&s) {
                shapes.push(s);
            }
        }
        let mut by_picture: Vec<Option<Vec<yolo_edge::vision::postprocess::Detection>>> = vec![None; ok.len()];
        for shape in shapes {
            let idx: Vec<usize> = (0..ok.len()).filter(|&i| (ok[i].geometry.in_w, ok[i].geometry.in_h) == shape).collect();
            let group: Vec<&Letterboxed> = idx.iter().map(|&i| ok[i]).collect();
            let raw = det.raw(&group).context("forward pass")?;
            let cands = det.candidates(&raw, th.conf)?;
            if a.raw_out.is_some() {
                raws.push(raw.to_dtype(candle_core::DType::F32)?.to_device(&candle_core::Device::Cpu)?);
            }
            for (c, &i) in cands.into_iter().zip(&idx) {
                by_picture[i] = Some(yolo_edge::vision::postprocess::finish(c, &th, &ok[i].geometry, &det.info().names));
            }
        }
        let mut results = by_picture.into_iter().map(Option::unwrap_or_default);
        for (path, prep) in chunk.iter().zip(prepared) {
            let record = match prep {
                Err(e) => {
                    failed += 1;
                    eprintln!("error: {}: {e}", path.display());
                    serde_json::json!({"image": path, "error": e})
                }
                Ok((mut img, _)) => {
                    let dets = results.next().unwrap_or_default();
                    total_dets += dets.len();
                    if let Some(dir) = &a.annotate {
                        annotate::draw(&mut img, &dets);
                        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "image".into());
                        let out = dir.join(format!("{name}.jpg"));
                        img.save(&out).with_context(|| format!("writing {}", out.display()))?;
                    }
                    serde_json::json!({"image": path, "width": img.width(), "height": img.height(), "detections": dets})
                }
            };
            if let Some(w) = json.as_mut() {
                writeln!(w, "{record}")?;
            }
        }
    }
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
    eprintln!("{} image(s), {} failed, {} detection(s)", a.images.len(), failed, total_dets);
    Ok(if failed > 0 { ExitCode::from(super::exit::PARTIAL) } else { ExitCode::SUCCESS })
}
