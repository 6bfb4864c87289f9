//! `yolo-edge eval`: mAP50, mAP50-95, precision and recall of a model on a YOLO-format dataset,
//! as a table (and optionally JSON), with ultralytics `val`'s defaults.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use yolo_edge::backend::device;
use yolo_edge::detector::Detector;
use yolo_edge::eval::{self, dataset::Dataset, EvalOptions, EvalReport};
use yolo_edge::vision::postprocess::Thresholds;

#[derive(Args)]
pub struct EvalArgs {
    /// Checkpoint (.pt or .safetensors).
    #[arg(long)]
    model: PathBuf,
    /// A data.yaml, a folder holding one, or a folder with images/<split>/ (or images/) and labels/.
    /// Video files among the images are evaluated frame by frame, frame N of images/clip.mp4
    /// labelled by labels/clip/N.txt (needs the `gstreamer` feature).
    #[arg(long)]
    data: PathBuf,
    /// Split to evaluate (a key of data.yaml, or the folder under images/).
    #[arg(long, default_value = "test")]
    split: String,
    /// Network input size (multiple of 32; default: the size the model was trained at).
    #[arg(long, value_parser = super::common::parse_imgsz)]
    imgsz: Option<usize>,
    #[arg(long, default_value_t = 0.001)]
    conf: f32,
    #[arg(long, default_value_t = 0.7)]
    iou: f32,
    #[arg(long, default_value_t = 300)]
    max_det: usize,
    /// Pictures per forward pass.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// auto, cpu or cuda:N
    #[arg(long, default_value = "auto")]
    device: String,
    /// auto (f16 on CUDA, f32 on CPU), f32 or f16
    #[arg(long, default_value = "auto")]
    dtype: String,
    /// Also write the report as JSON here (`-` for stdout, the table then goes to stderr).
    #[arg(long)]
    json: Option<PathBuf>,
    #[command(flatten)]
    tuning: super::common::TuningArgs,
}

pub fn run(a: EvalArgs) -> anyhow::Result<ExitCode> {
    a.tuning.install()?;
    anyhow::ensure!(a.batch >= 1, "--batch must be at least 1");
    anyhow::ensure!((0.0..=1.0).contains(&a.conf) && (0.0..=1.0).contains(&a.iou), "--conf and --iou must be within 0..1");
    let ds = Dataset::open(&a.data, &a.split).with_context(|| format!("opening dataset {}", a.data.display()))?;
    let dev = device::parse_device(&a.device)?;
    let dtype = device::parse_dtype(&a.dtype, &dev)?;
    let det = Detector::load(&a.model, &dev, dtype, a.imgsz).with_context(|| format!("loading model {}", a.model.display()))?;
    if !ds.names.is_empty() && ds.names != det.info().names {
        eprintln!(
            "warning: the dataset's classes {:?} differ from the model's {:?}; the dataset's names are shown",
            ds.names,
            det.info().names
        );
    }
    eprintln!(
        "evaluating {} on {} images{} of `{}` ({}) at {}x{}, {} {}",
        a.model.display(),
        ds.samples.len(),
        if ds.videos.is_empty() { String::new() } else { format!(" and the frames of {} video(s)", ds.videos.len()) },
        ds.split,
        ds.root.display(),
        det.imgsz(),
        det.imgsz(),
        device::device_name(&dev),
        device::dtype_name(dtype)
    );
    let opts =
        EvalOptions { thresholds: Thresholds { conf: a.conf, iou: a.iou, max_det: a.max_det }, batch: a.batch, ..Default::default() };
    // what the progress line last showed: a tenth of the total, or (a split with videos, whose
    // frames are counted only as they are read) a count of pictures and frames
    let mut shown = 0;
    let mut progress = |done: usize, total: Option<usize>| match total {
        Some(total) => {
            let tenth = done * 10 / total.max(1);
            if tenth > shown {
                shown = tenth;
                eprint!("\r{done}/{total} images");
                if done == total {
                    eprintln!();
                }
            }
        }
        None if done >= shown + 100 => {
            shown = done;
            eprint!("\r{done} images and frames");
        }
        None => {}
    };
    let report = eval::evaluate(&det, &ds, &opts, &mut progress)?;
    if !ds.videos.is_empty() {
        eprintln!();
    }
    for s in &report.skipped {
        eprintln!("skipped {s}");
    }
    let to_stdout = a.json.as_ref().is_some_and(|p| p.as_os_str() == "-");
    let table = format_table(&report);
    if to_stdout {
        eprint!("{table}");
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{table}");
        if let Some(p) = &a.json {
            let mut f = std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
            writeln!(f, "{}", serde_json::to_string_pretty(&report)?)?;
        }
    }
    Ok(if report.skipped.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(super::exit::PARTIAL) })
}

/// The reference's layout: one `all` row, then one row per class that has labelled objects.
pub fn format_table(r: &EvalReport) -> String {
    let mut s = format!("{:>22}{:>11}{:>11}{:>11}{:>11}{:>11}{:>11}\n", "Class", "Images", "Instances", "P", "R", "mAP50", "mAP50-95");
    let row = |name: &str, images: usize, inst: usize, p: f64, rc: f64, m50: f64, m: f64| {
        format!("{name:>22}{images:>11}{inst:>11}{p:>11.4}{rc:>11.4}{m50:>11.4}{m:>11.4}\n")
    };
    s += &row("all", r.images, r.instances, r.precision, r.recall, r.map50, r.map50_95);
    for c in &r.classes {
        s += &row(&c.name, c.images, c.instances, c.precision, c.recall, c.map50, c.map50_95);
    }
    s += &format!(
        "{} images in {:.1} s ({:.1} images/s), {} skipped; conf {} iou {} imgsz {}\n",
        r.images,
        r.seconds,
        r.images_per_second,
        r.skipped.len(),
        r.conf,
        r.iou,
        r.imgsz
    );
    s
}
