//! YOLOv9 (t, s, m, c, e) in candle: the layer graph of ultralytics' `DetectionModel`, loaded
//! from the checkpoint's own `model.N...` names, with the variant, head style, classes and
//! strides read from the checkpoint.

pub mod arch;
pub mod blocks;
pub mod head;
pub mod layout;
pub mod random;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Module, Tensor};
use serde::Serialize;

use crate::weights::{Checkpoint, SourceFormat, TrackedTensors, WeightsError};
pub use arch::Variant;
use arch::{Kind, LayerSpec};
use blocks::{cb_fuse, AConv, ADown, CbLinear, Conv, Elan, Sppelan};
use head::Detect;
pub use head::HeadStyle;

/// Why a model could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error("unknown architecture: {0}")]
    Architecture(String),
    #[error("tensor computation failed: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Where BatchNorm statistics measured during calibration are collected.
pub(crate) type CalibSink = Arc<Mutex<Vec<(String, Tensor, Tensor)>>>;
type ExportSink = Arc<Mutex<Vec<(String, Tensor)>>>;

/// A prefix over a checkpoint's tensors, like `candle_nn::VarBuilder`, but with typed errors that
/// name the file and tensor, and usage tracking.
#[derive(Clone)]
pub struct Vb {
    tensors: TrackedTensors,
    prefix: String,
    device: Device,
    dtype: DType,
    calib: Option<CalibSink>,
    export: Option<ExportSink>,
    lay: layout::Lay,
}

impl Vb {
    pub fn pp(&self, s: impl std::fmt::Display) -> Self {
        let mut v = self.clone();
        v.prefix = if self.prefix.is_empty() { s.to_string() } else { format!("{}.{s}", self.prefix) };
        v
    }
    pub fn name(&self, s: &str) -> String {
        match (self.prefix.is_empty(), s.is_empty()) {
            (true, _) => s.to_string(),
            (false, true) => self.prefix.clone(),
            (false, false) => format!("{}.{s}", self.prefix),
        }
    }
    pub fn get(&self, s: &str, shape: &[usize]) -> Result<Tensor, ModelError> {
        Ok(self.tensors.get(&self.name(s), shape)?)
    }
    pub fn contains(&self, s: &str) -> bool {
        self.tensors.contains(&self.name(s))
    }
    pub fn shape_of(&self, s: &str) -> Option<Vec<usize>> {
        self.tensors.shape_of(&self.name(s))
    }
    pub fn ignore(&self, s: &str) {
        self.tensors.ignore(&self.name(s))
    }
    pub fn device(&self) -> &Device {
        &self.device
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The checkpoint file, for errors.
    pub fn path(&self) -> &std::path::Path {
        self.tensors.path()
    }
    /// The activation layout the model runs in.
    pub fn lay(&self) -> layout::Lay {
        self.lay
    }
    pub(crate) fn calib(&self) -> Option<CalibSink> {
        self.calib.clone()
    }
    /// Records a folded tensor for `convert` (no-op unless exporting).
    pub fn export(&self, s: &str, t: &Tensor) -> Result<(), ModelError> {
        if let Some(e) = &self.export {
            e.lock().unwrap().push((self.name(s), t.to_dtype(DType::F32)?.to_device(&Device::Cpu)?));
        }
        Ok(())
    }
    pub fn without_export(&self) -> Self {
        let mut v = self.clone();
        v.export = None;
        v
    }
}

/// What the checkpoint says the model is.
#[derive(Debug, Clone, Serialize)]
pub struct ModelInfo {
    pub variant: Variant,
    pub head: HeadStyle,
    pub nc: usize,
    pub names: Vec<String>,
    pub strides: Vec<usize>,
    pub reg_max: usize,
    pub imgsz: usize,
    pub parameters: usize,
    pub source: SourceFormat,
    pub sha256: String,
    pub path: String,
}

// built once at load and never moved in the hot path: boxing the large variants buys nothing
#[allow(clippy::large_enum_variant)]
enum Layer {
    Identity,
    Conv(Conv),
    Elan(Elan),
    AConv(AConv),
    ADown(ADown),
    Sppelan(Sppelan),
    Upsample,
    Concat,
    CbLinear(CbLinear),
    CbFuse(Vec<usize>),
    Detect(Detect),
}

enum Out {
    One(Tensor),
    Many(Vec<Tensor>),
}

impl Out {
    fn one(&self) -> candle_core::Result<&Tensor> {
        match self {
            Out::One(t) => Ok(t),
            Out::Many(_) => Err(candle_core::Error::Msg("layer output is a split, not a tensor".into())),
        }
    }
}

/// A loaded YOLOv9 detection model.
pub struct YoloV9 {
    specs: Vec<LayerSpec>,
    layers: Vec<Layer>,
    /// For each layer, the last layer index that reads its output (to free activations early).
    last_use: Vec<usize>,
    info: ModelInfo,
    device: Device,
    dtype: DType,
    lay: layout::Lay,
}

/// Options for building a model from a checkpoint.
#[derive(Clone)]
pub struct BuildOptions {
    pub device: Device,
    pub dtype: DType,
    /// Measure BatchNorm statistics instead of reading them (test and golden generation only).
    pub(crate) calib: Option<CalibSink>,
    pub(crate) export: Option<ExportSink>,
    /// The activation layout; `None` picks it for the device ([`layout::choose`]). Forcing NHWC
    /// on the CPU runs the GPU path's graph logic with candle's ops (tests).
    pub layout: Option<layout::Lay>,
}

impl BuildOptions {
    pub fn new(device: Device, dtype: DType) -> Self {
        Self { device, dtype, calib: None, export: None, layout: None }
    }
}

impl YoloV9 {
    /// Builds the model from a checkpoint: recognises variant and head, checks every tensor's
    /// name and shape, folds BatchNorm and RepConv, and rejects left-over tensors.
    pub fn from_checkpoint(ck: &Checkpoint, opts: &BuildOptions) -> Result<Self, ModelError> {
        let tensors = TrackedTensors::new(&ck.path, ck.tensors.clone());
        let shape_of = |n: &str| tensors.shape_of(n);
        let variant =
            arch::detect_variant(&shape_of).map_err(|reason| WeightsError::UnknownArchitecture { path: ck.path.clone(), reason })?;
        let specs = variant.layers();
        let ch = arch::channels(&specs, 3);
        let lay = match (opts.layout, opts.calib.is_some()) {
            // BatchNorm calibration measures NCHW statistics
            (_, true) => layout::Lay::Nchw,
            (Some(l), false) => l,
            (None, false) => layout::choose(&opts.device, false),
        };
        if lay == layout::Lay::Nhwc {
            tracing::debug!("activations channels-last (NHWC) on the GPU");
        }
        let root = Vb {
            tensors: tensors.clone(),
            prefix: "model".into(),
            device: opts.device.clone(),
            dtype: opts.dtype,
            calib: opts.calib.clone(),
            export: opts.export.clone(),
            lay,
        };
        let src_ch = |i: usize, f: isize| -> usize {
            if f < 0 {
                if i == 0 {
                    3
                } else {
                    ch[i - 1][0]
                }
            } else {
                ch[f as usize][0]
            }
        };
        let mut layers = Vec::with_capacity(specs.len());
        for (i, spec) in specs.iter().enumerate() {
            let vb = root.pp(i);
            let c1 = src_ch(i, spec.from[0]);
            let layer = match &spec.kind {
                Kind::Identity => Layer::Identity,
                Kind::Conv { c2, k, s } => Layer::Conv(Conv::load(&vb, c1, *c2, *k, *s, true)?),
                Kind::Elan1 { c2, c3, c4 } => Layer::Elan(Elan::load_elan1(&vb, c1, *c2, *c3, *c4)?),
                Kind::RepNcspElan4 { c2, c3, c4, n } => Layer::Elan(Elan::load_repncsp(&vb, c1, *c2, *c3, *c4, *n)?),
                Kind::AConv { c2 } => Layer::AConv(AConv::load(&vb, c1, *c2)?),
                Kind::ADown { c2 } => Layer::ADown(ADown::load(&vb, c1, *c2)?),
                Kind::Sppelan { c2, c3 } => Layer::Sppelan(Sppelan::load(&vb, c1, *c2, *c3)?),
                Kind::Upsample => Layer::Upsample,
                Kind::Concat => Layer::Concat,
                Kind::CbLinear { c2s } => Layer::CbLinear(CbLinear::load(&vb, c1, c2s)?),
                Kind::CbFuse { idx } => Layer::CbFuse(idx.clone()),
                Kind::Detect => {
                    let det_ch: Vec<usize> = spec.from.iter().map(|&f| src_ch(i, f)).collect();
                    Layer::Detect(Detect::load(&vb, &det_ch)?)
                }
            };
            layers.push(layer);
        }
        let unused = tensors.unused();
        if !unused.is_empty() {
            return Err(WeightsError::Unexpected {
                path: ck.path.clone(),
                arch: variant.name().into(),
                count: unused.len(),
                examples: unused.into_iter().take(5).collect(),
            }
            .into());
        }
        let Some(Layer::Detect(det)) = layers.last() else { unreachable!("every table ends with Detect") };
        let nc = det.nc;
        let names = match &ck.names {
            Some(n) if n.len() == nc => n.clone(),
            _ => (0..nc).map(|i| format!("class{i}")).collect(),
        };
        let strides = vec![8, 16, 32];
        if let Some(s) = &ck.strides {
            if s.iter().map(|v| *v as usize).collect::<Vec<_>>() != strides {
                return Err(ModelError::Architecture(format!("{}: model strides {s:?}, expected {strides:?}", ck.path.display())));
            }
        }
        let parameters = ck
            .tensors
            .iter()
            .filter(|(k, _)| {
                !k.ends_with("running_mean")
                    && !k.ends_with("running_var")
                    && !k.ends_with("num_batches_tracked")
                    && !k.ends_with("dfl.conv.weight")
            })
            .map(|(_, t)| t.elem_count())
            .sum();
        let info = ModelInfo {
            variant,
            head: det.style,
            nc,
            names,
            strides,
            reg_max: det.reg_max,
            imgsz: ck.imgsz.unwrap_or(640),
            parameters,
            source: ck.format,
            sha256: ck.sha256.clone(),
            path: ck.path.display().to_string(),
        };
        let mut last_use = vec![0usize; specs.len()];
        for (i, spec) in specs.iter().enumerate() {
            for &f in &spec.from {
                let src = if f < 0 { i.wrapping_sub(1) } else { f as usize };
                if src < specs.len() {
                    last_use[src] = last_use[src].max(i);
                }
            }
        }
        Ok(Self { specs, layers, last_use, info, device: opts.device.clone(), dtype: opts.dtype, lay })
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }
    pub fn device(&self) -> &Device {
        &self.device
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The activation layout it runs in (NHWC on CUDA with cuDNN).
    pub fn lay(&self) -> layout::Lay {
        self.lay
    }

    /// Runs the network on a normalised batch `(B, 3, H, W)` (values in 0..1, the model's dtype)
    /// and returns the reference's raw output `(B, 4 + nc, anchors)`.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.forward_into(x, None)
    }

    /// [`Self::forward`], with `out` (shaped and typed as the raw output) a buffer the raw output
    /// may be written into (a CUDA graph's fixed output): the fused CUDA head does and returns it;
    /// other paths return a tensor of their own.
    pub fn forward_into(&self, x: &Tensor, out: Option<&Tensor>) -> candle_core::Result<Tensor> {
        let lay = self.lay;
        self.forward_laid(&crate::backend::profile::scope(|| "input relayout".into(), || lay.from_nchw(x))?, out)
    }

    /// [`Self::forward_into`] on an input already in the model's own layout ([`Self::lay`]):
    /// `(B, 3, H, W)` for NCHW, `(B, H, W, 3)` for NHWC (as the network input is normalised on
    /// CUDA).
    pub fn forward_laid(&self, x: &Tensor, out: Option<&Tensor>) -> candle_core::Result<Tensor> {
        let lay = self.lay;
        let (_, h, w) = lay.chw(x)?;
        let mut outs: Vec<Option<Out>> = (0..self.layers.len()).map(|_| None).collect();
        for (i, (spec, layer)) in self.specs.iter().zip(&self.layers).enumerate() {
            let input = |k: usize, outs: &Vec<Option<Out>>| -> candle_core::Result<Tensor> {
                let f = spec.from[k];
                if f < 0 && i == 0 {
                    return Ok(x.clone());
                }
                let src = if f < 0 { i - 1 } else { f as usize };
                Ok(outs[src].as_ref().ok_or_else(|| candle_core::Error::Msg(format!("layer {src} output missing")))?.one()?.clone())
            };
            let out = match layer {
                Layer::Identity => Out::One(input(0, &outs)?),
                Layer::Conv(m) => Out::One(m.forward(&input(0, &outs)?)?),
                Layer::Elan(m) => Out::One(m.forward(&input(0, &outs)?)?),
                Layer::AConv(m) => Out::One(m.forward(&input(0, &outs)?)?),
                Layer::ADown(m) => Out::One(m.forward(&input(0, &outs)?)?),
                Layer::Sppelan(m) => Out::One(m.forward(&input(0, &outs)?)?),
                Layer::Upsample => {
                    let t = input(0, &outs)?;
                    let (_, th, tw) = lay.chw(&t)?;
                    Out::One(crate::backend::profile::scope(|| "upsample".into(), || lay.upsample(&t, th * 2, tw * 2))?)
                }
                Layer::Concat => {
                    let ts = (0..spec.from.len()).map(|k| input(k, &outs)).collect::<candle_core::Result<Vec<_>>>()?;
                    Out::One(crate::backend::profile::scope(|| "concat (neck)".into(), || lay.cat_c(&ts))?)
                }
                Layer::CbLinear(m) => Out::Many(m.forward(&input(0, &outs)?)?),
                Layer::CbFuse(idx) => {
                    let picked = spec.from[..spec.from.len() - 1]
                        .iter()
                        .zip(idx)
                        .map(|(&f, &j)| match outs[f as usize].as_ref() {
                            Some(Out::Many(v)) => {
                                v.get(j).cloned().ok_or_else(|| candle_core::Error::Msg(format!("CBFuse: layer {f} has no split {j}")))
                            }
                            _ => Err(candle_core::Error::Msg(format!("CBFuse: layer {f} is not a CBLinear"))),
                        })
                        .collect::<candle_core::Result<Vec<_>>>()?;
                    let last = input(spec.from.len() - 1, &outs)?;
                    Out::One(crate::backend::profile::scope(|| "cbfuse (upsample+add)".into(), || cb_fuse(lay, &picked, &last))?)
                }
                Layer::Detect(d) => {
                    let feats = (0..spec.from.len()).map(|k| input(k, &outs)).collect::<candle_core::Result<Vec<_>>>()?;
                    return d.forward(&feats, (h, w), out);
                }
            };
            outs[i] = Some(out);
            // free activations nobody reads any more
            for (j, o) in outs.iter_mut().enumerate().take(i) {
                if self.last_use[j] <= i {
                    *o = None;
                }
            }
        }
        Err(candle_core::Error::Msg("model has no Detect layer".into()))
    }

    /// Multiply-accumulates x2 of one forward pass at `imgsz`, in GFLOPs (as ultralytics reports).
    pub fn gflops(&self, imgsz: usize) -> candle_core::Result<f64> {
        let x = Tensor::zeros((1, 3, imgsz, imgsz), self.dtype, &self.device)?;
        blocks::MACS.with(|m| m.set(Some(0)));
        let r = self.forward(&x);
        let macs = blocks::MACS.with(|m| m.take()).unwrap_or(0);
        r?;
        Ok(2.0 * macs as f64 / 1e9)
    }
}

/// Measures BatchNorm running statistics on `images` (normalised, `(B, 3, H, W)`) the way
/// `scripts/make_goldens.py` calibrates the reference, and returns them as state-dict tensors.
/// Used to build seeded random-weight models whose activations depend on real pictures.
pub fn calibrate_batchnorm(ck: &Checkpoint, images: &Tensor) -> Result<HashMap<String, Tensor>, ModelError> {
    let sink: CalibSink = Arc::default();
    let mut opts = BuildOptions::new(images.device().clone(), DType::F32);
    opts.calib = Some(sink.clone());
    // a checkpoint without running stats: only the calibration path reads it
    let model = YoloV9::from_checkpoint(ck, &opts)?;
    model.forward(images)?;
    let stats = sink.lock().unwrap();
    let mut out = HashMap::new();
    for (name, mean, var) in stats.iter() {
        out.insert(format!("{name}.running_mean"), mean.to_device(&Device::Cpu)?);
        out.insert(format!("{name}.running_var"), var.to_device(&Device::Cpu)?);
    }
    Ok(out)
}

/// Folds a checkpoint and returns its tensors in the fused layout that `convert` writes.
pub fn fused_tensors(ck: &Checkpoint) -> Result<(ModelInfo, Vec<(String, Tensor)>), ModelError> {
    let sink: ExportSink = Arc::default();
    let mut opts = BuildOptions::new(Device::Cpu, DType::F32);
    opts.export = Some(sink.clone());
    let model = YoloV9::from_checkpoint(ck, &opts)?;
    let tensors = std::mem::take(&mut *sink.lock().unwrap());
    Ok((model.info, tensors))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The channels-last graph (the CUDA path's splits, concats, pools, upsampling, CBFuse and
    /// head relayout), run with candle's CPU ops, gives the NCHW model's output: every block
    /// type of YOLOv9 (t: ELAN1, AConv, SPPELAN; e: RepNCSPELAN4, ADown, CBLinear/CBFuse).
    #[test]
    fn nhwc_graph_equals_nchw() {
        let _memory = crate::process_memory_test_lock();
        for variant in [Variant::T, Variant::E] {
            let ck = crate::model::random::random_checkpoint(variant, 7).unwrap();
            let build = |lay| {
                let mut o = BuildOptions::new(Device::Cpu, DType::F32);
                o.layout = Some(lay);
                YoloV9::from_checkpoint(&ck, &o).unwrap()
            };
            let (a, b) = (build(layout::Lay::Nchw), build(layout::Lay::Nhwc));
            assert_eq!((a.lay(), b.lay()), (layout::Lay::Nchw, layout::Lay::Nhwc));
            let x = Tensor::rand(0f32, 1f32, (2, 3, 64, 96), &Device::Cpu).unwrap();
            let (ya, yb) = (a.forward(&x).unwrap(), b.forward(&x).unwrap());
            assert_eq!(ya.dims(), yb.dims());
            let diff = (&ya - &yb).unwrap().sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap().sqrt();
            let norm = ya.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap().sqrt();
            assert!(norm.is_finite() && norm > 0.0, "{variant:?}: output norm {norm}");
            assert!(diff / norm < 1e-5, "{variant:?}: NHWC vs NCHW relative error {}", diff / norm);
        }
    }
}
