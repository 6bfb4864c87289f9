//! What several subcommands share: loading a model by path or `random:<variant>`, and the
//! acceleration settings (`[tuning]` of the agent's config) as command-line flags.

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device};
use clap::Args;

use yolo_edge::backend::tuning::{self, Allocator, Tuning};
use yolo_edge::detector::{Detector, JpegDecoder, JpegSetup};
use yolo_edge::model::random as randweights;
use yolo_edge::model::{BuildOptions, YoloV9};
use yolo_edge::units::ByteSize;

/// A detector from a checkpoint path, or from `random:yolov9X` (seeded random weights, for
/// speed and memory measurements), with a name for reports.
pub fn load_detector(spec: &str, dev: &Device, dtype: DType, imgsz: usize, seed: u64) -> anyhow::Result<(String, Detector)> {
    match randweights::parse_spec(spec) {
        Some(v) => {
            let v = v?;
            let ck = randweights::random_checkpoint(v, seed)?;
            let m = YoloV9::from_checkpoint(&ck, &BuildOptions::new(dev.clone(), dtype))?;
            Ok((format!("{} (random)", v.name()), Detector::from_model(m, imgsz)))
        }
        None => {
            let det = Detector::load(Path::new(spec), dev, dtype, Some(imgsz)).with_context(|| format!("loading {spec}"))?;
            Ok((det.info().variant.name().to_string(), det))
        }
    }
}

/// `--imgsz`: a positive multiple of 32, at most [`yolo_edge::detector::MAX_IMGSZ`].
pub fn parse_imgsz(s: &str) -> Result<usize, String> {
    yolo_edge::detector::check_imgsz(s.parse().map_err(|e| format!("{s}: {e}"))?)
}

/// A network input shape as `WxH` (e.g. `640x384`), each side a positive multiple of 32, at most
/// [`yolo_edge::detector::MAX_IMGSZ`].
pub fn parse_input_shape(s: &str) -> Result<(usize, usize), String> {
    let (w, h) = s.split_once('x').ok_or("expected WxH")?;
    let (w, h): (usize, usize) = (w.parse().map_err(|e| format!("{w}: {e}"))?, h.parse().map_err(|e| format!("{h}: {e}"))?);
    let max = yolo_edge::detector::MAX_IMGSZ;
    if w == 0 || h == 0 || w % 32 != 0 || h % 32 != 0 || w > max || h > max {
        return Err(format!("{s}: sides must be positive multiples of 32 up to {max}"));
    }
    Ok((w, h))
}

/// `on` or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    On,
    Off,
}

/// The acceleration layer's settings as flags; each left out keeps its default
/// ([`Tuning::default`], the same as an agent config without `[tuning]`).
#[derive(Debug, Clone, Args)]
pub struct TuningArgs {
    /// Passes on CUDA replay captured CUDA graphs, one per input shape and batch size.
    #[arg(long, value_enum)]
    cuda_graphs: Option<Switch>,
    /// f16 convolutions with their epilogue (bias, SiLU, residual, the write into a
    /// concatenation) as one cuDNN kernel where that times faster (lower small-batch latency;
    /// seconds of start-up per input shape and batch size).
    #[arg(long, value_enum)]
    cudnn_fusion: Option<Switch>,
    /// File that keeps the fused-convolution decisions (with --cudnn-fusion on), so that a later
    /// run builds only the kept plans; its folder must exist.
    #[arg(long, value_name = "FILE")]
    cudnn_fusion_cache: Option<std::path::PathBuf>,
    /// How activations are placed on a CUDA device.
    #[arg(long, value_enum)]
    allocator: Option<AllocatorArg>,
    /// Threads that pack pictures into the pinned upload buffer (0: the cores, at most 8).
    #[arg(long)]
    upload_threads: Option<usize>,
    /// Smallest workspace offered to cuDNN's algorithm search per convolution, e.g. 256MiB.
    #[arg(long)]
    cudnn_workspace_min: Option<ByteSize>,
    /// Workspace offered per convolution as a multiple of its input + output bytes.
    #[arg(long)]
    cudnn_workspace_scale: Option<f64>,
    /// How much slower than the fastest a cuDNN algorithm may be to save workspace (0.05 = 5 %).
    #[arg(long)]
    cudnn_algo_slack: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum AllocatorArg {
    Arena,
    Pool,
}

impl TuningArgs {
    /// The settings these flags give, validated.
    pub fn tuning(&self) -> anyhow::Result<Tuning> {
        let d = Tuning::default();
        let t = Tuning {
            cuda_graphs: self.cuda_graphs.map_or(d.cuda_graphs, |s| s == Switch::On),
            cudnn_fusion: self.cudnn_fusion.map_or(d.cudnn_fusion, |s| s == Switch::On),
            cudnn_fusion_cache: self.cudnn_fusion_cache.clone().or(d.cudnn_fusion_cache),
            allocator: match self.allocator {
                None => d.allocator,
                Some(AllocatorArg::Arena) => Allocator::Arena,
                Some(AllocatorArg::Pool) => Allocator::Pool,
            },
            upload_threads: self.upload_threads.unwrap_or(d.upload_threads),
            cudnn_workspace_min: self.cudnn_workspace_min.unwrap_or(d.cudnn_workspace_min),
            cudnn_workspace_scale: self.cudnn_workspace_scale.unwrap_or(d.cudnn_workspace_scale),
            cudnn_algo_slack: self.cudnn_algo_slack.unwrap_or(d.cudnn_algo_slack),
        };
        t.validate().map_err(|e| anyhow::anyhow!("--{}: {}", e.key.replace('_', "-"), e.why))?;
        Ok(t)
    }

    /// Validates the flags and makes them the process's settings, before any model is built.
    pub fn install(&self) -> anyhow::Result<Tuning> {
        let t = self.tuning()?;
        tuning::install(t.clone())?;
        Ok(t)
    }
}

/// Who decodes JPEG files, as command-line flags (`detect`, `bench`'s end-to-end mode).
#[derive(Args)]
pub struct JpegArgs {
    /// Who decodes JPEG files: cpu (the reference's pixels, bit for bit), nvjpeg (on the GPU,
    /// letterboxed on the device) or auto. `detect` with --raw-out or --annotate decodes on the
    /// CPU: both need the host's pixels.
    #[arg(long, default_value = "cpu")]
    pub jpeg_decoder: JpegDecoder,
    /// nvJPEG decoders at once (with --jpeg-decoder nvjpeg or auto), each on a thread of its own
    /// decoding a batch ahead of the model: the host's side of a decode (parsing, queueing) takes
    /// about as long as the GPU's, so two keep the GPU's decoder busier than one (BENCHMARKS.md).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=8))]
    pub jpeg_decoders: u64,
}

impl JpegArgs {
    /// Sets `det` up for the chosen decoder; whether JPEGs are then decoded on the device.
    pub fn setup(&self, det: &Detector) -> anyhow::Result<bool> {
        let lanes = self.jpeg_decoders as usize;
        match det.set_jpeg_decoder(self.jpeg_decoder, lanes).map_err(|why| anyhow::anyhow!("--jpeg-decoder nvjpeg: {why}"))? {
            JpegSetup::Host => Ok(false),
            JpegSetup::Device { backend } => {
                eprintln!("JPEG files decoded by nvJPEG ({backend} backend, {lanes} at once) and letterboxed on the device");
                Ok(true)
            }
            JpegSetup::HostInstead { why } => {
                eprintln!("warning: {why}");
                Ok(false)
            }
        }
    }
}
