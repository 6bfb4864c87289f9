//! The detection head (ultralytics `Detect`, WongKinYiu `DDetect`) with Distribution Focal Loss
//! decoding: box and class branches per level, DFL expectation, anchor decode to xywh pixels,
//! sigmoid scores — the reference's eval-mode output `(B, 4 + nc, anchors)`.

use std::sync::Mutex;

use candle_core::{DType, Device, Module, Tensor};
use serde::Serialize;

use super::blocks::Conv;
use super::layout::Lay;
use super::{ModelError, Vb};

/// Which classification branch the checkpoint has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadStyle {
    /// YOLOv8/v9 (`legacy=True`): `cv3` = Conv 3x3, Conv 3x3, Conv2d 1x1.
    Classic,
    /// ultralytics >= 8.3: `cv3` = [DWConv 3x3, Conv 1x1] x 2, Conv2d 1x1.
    Depthwise,
}

#[derive(Debug, Clone)]
struct Branch {
    convs: Vec<Conv>,
    out: Conv,
}

impl Branch {
    /// The branch with its last convolution's bias left out ([`Conv::forward_unbiased`]).
    #[cfg(feature = "cuda")]
    fn forward_unbiased(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mut y = x.clone();
        for c in &self.convs {
            y = c.forward(&y)?;
        }
        self.out.forward_unbiased(&y)
    }
}

impl Module for Branch {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mut y = x.clone();
        for c in &self.convs {
            y = c.forward(&y)?;
        }
        self.out.forward(&y)
    }
}

/// Anchor centres and strides per input size `(h, w)`, kept on the device for the model's life:
/// a captured CUDA graph reads them at the address they had when it was captured, so an entry
/// is never replaced or dropped while the model lives.
type AnchorCache = std::collections::HashMap<(usize, usize), (Tensor, Tensor)>;

/// Input sizes whose anchors are kept (a few hundred KiB each at most); anchors of further
/// sizes are computed on every pass.
const MAX_ANCHOR_SHAPES: usize = 64;

#[derive(Debug)]
pub struct Detect {
    boxes: Vec<Branch>,
    classes: Vec<Branch>,
    /// DFL projection weights (0..reg_max), shaped (1, 1, reg_max, 1).
    proj: Tensor,
    /// The same weights as `reg_max` f32 values (the fused CUDA and the CPU decode's input).
    proj_f32: Tensor,
    /// Per level, the biases of the box and class branches' last convolutions as f32 (the
    /// fused CUDA decode adds them as it reads the branches).
    #[cfg(feature = "cuda")]
    biases_f32: Vec<(Tensor, Tensor)>,
    pub nc: usize,
    pub reg_max: usize,
    pub style: HeadStyle,
    /// The layout of the feature maps (the branches run in it; their small outputs become NCHW).
    lay: Lay,
    anchors: Mutex<AnchorCache>,
}

impl Detect {
    pub fn load(vb: &Vb, ch: &[usize]) -> Result<Self, ModelError> {
        // a tensor's first dimension, its output channels (0: missing, or a scalar)
        let outputs = |name: &str| vb.shape_of(name).and_then(|s| s.first().copied()).unwrap_or(0);
        let c2 = outputs("cv2.0.0.conv.weight");
        let reg4 = outputs("cv2.0.2.weight");
        let style = if vb.contains("cv3.0.0.0.conv.weight") { HeadStyle::Depthwise } else { HeadStyle::Classic };
        let nc = outputs("cv3.0.2.weight");
        let c3 = match style {
            HeadStyle::Classic => outputs("cv3.0.0.conv.weight"),
            HeadStyle::Depthwise => outputs("cv3.0.0.1.conv.weight"),
        };
        if c2 == 0 || reg4 == 0 || !reg4.is_multiple_of(4) || nc == 0 || c3 == 0 {
            return Err(ModelError::Architecture(format!(
                "{}: detection head `{}` is incomplete (cv2/cv3 tensors missing or malformed)",
                vb.path().display(),
                vb.name("")
            )));
        }
        let reg_max = reg4 / 4;
        let mut boxes = Vec::new();
        let mut classes = Vec::new();
        for (i, &x) in ch.iter().enumerate() {
            let b = vb.pp(format!("cv2.{i}"));
            boxes.push(Branch {
                convs: vec![Conv::load(&b.pp("0"), x, c2, 3, 1, true)?, Conv::load(&b.pp("1"), c2, c2, 3, 1, true)?],
                out: Conv::load_plain(&b.pp("2"), c2, reg4, 1)?,
            });
            let c = vb.pp(format!("cv3.{i}"));
            let convs = match style {
                HeadStyle::Classic => vec![Conv::load(&c.pp("0"), x, c3, 3, 1, true)?, Conv::load(&c.pp("1"), c3, c3, 3, 1, true)?],
                HeadStyle::Depthwise => vec![
                    Conv::load(&c.pp("0.0"), x, x, 3, 1, true)?,
                    Conv::load(&c.pp("0.1"), x, c3, 1, 1, true)?,
                    Conv::load(&c.pp("1.0"), c3, c3, 3, 1, true)?,
                    Conv::load(&c.pp("1.1"), c3, c3, 1, 1, true)?,
                ],
            };
            classes.push(Branch { convs, out: Conv::load_plain(&c.pp("2"), c3, nc, 1)? });
        }
        let proj = if vb.contains("dfl.conv.weight") {
            vb.get("dfl.conv.weight", &[1, reg_max, 1, 1])?
        } else {
            Tensor::arange(0f32, reg_max as f32, &Device::Cpu)?
        };
        vb.export("dfl.conv.weight", &proj.reshape((1, reg_max, 1, 1))?)?;
        let proj_f32 = proj.flatten_all()?.to_dtype(DType::F32)?.to_device(vb.device())?;
        let proj = proj.reshape((1, 1, reg_max, 1))?.to_dtype(vb.dtype())?.to_device(vb.device())?;
        #[cfg(feature = "cuda")]
        let biases_f32 = boxes
            .iter()
            .zip(&classes)
            .map(|(b, c)| Ok((b.out.bias().to_dtype(DType::F32)?, c.out.bias().to_dtype(DType::F32)?)))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Self {
            boxes,
            classes,
            proj,
            proj_f32,
            #[cfg(feature = "cuda")]
            biases_f32,
            nc,
            reg_max,
            style,
            lay: vb.lay(),
            anchors: Mutex::new(AnchorCache::new()),
        })
    }

    fn anchors(&self, feats: &[Tensor], input_hw: (usize, usize)) -> candle_core::Result<(Tensor, Tensor)> {
        let mut cache = self.anchors.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((a, s)) = cache.get(&input_hw) {
            return Ok((a.clone(), s.clone()));
        }
        let mut pts = Vec::new();
        let mut strides = Vec::new();
        for f in feats {
            let (_, h, w) = self.lay.chw(f)?;
            let stride = (input_hw.0 / h) as f32;
            for y in 0..h {
                for x in 0..w {
                    pts.push((x as f32 + 0.5, y as f32 + 0.5));
                    strides.push(stride);
                }
            }
        }
        let n = pts.len();
        let xs: Vec<f32> = pts.iter().map(|p| p.0).chain(pts.iter().map(|p| p.1)).collect();
        let dev = feats[0].device();
        let dt = feats[0].dtype();
        let a = Tensor::from_vec(xs, (1, 2, n), dev)?.to_dtype(dt)?;
        let s = Tensor::from_vec(strides, (1, 1, n), dev)?.to_dtype(dt)?;
        if cache.len() < MAX_ANCHOR_SHAPES {
            cache.insert(input_hw, (a.clone(), s.clone()));
        }
        Ok((a, s))
    }

    /// Raw output `(B, 4 + nc, A)`: xywh in input pixels, then sigmoid class scores. Where `out`
    /// is given (shaped and typed as the raw output), the fused CUDA decode writes it there and
    /// returns that tensor; the other paths return their own.
    pub fn forward(&self, feats: &[Tensor], input_hw: (usize, usize), out: Option<&Tensor>) -> candle_core::Result<Tensor> {
        #[cfg(feature = "cuda")]
        if self.lay == Lay::Nhwc && feats[0].device().is_cuda() {
            return self.forward_fused(feats, input_hw, out);
        }
        let _ = out;
        let b = feats[0].dim(0)?;
        let mut box_parts = Vec::with_capacity(feats.len());
        let mut cls_parts = Vec::with_capacity(feats.len());
        for (i, f) in feats.iter().enumerate() {
            let (bx, cl) = (self.boxes[i].forward(f)?, self.classes[i].forward(f)?);
            let flat = |t: &Tensor| crate::backend::profile::scope(|| "head: relayout".into(), || self.lay.to_nchw(t)?.flatten_from(2));
            box_parts.push(flat(&bx)?);
            cls_parts.push(flat(&cl)?);
        }
        crate::backend::profile::scope(
            || "head: DFL + decode".into(),
            || {
                if crate::backend::is_cpu_f32(&feats[0]) {
                    self.decode_cpu(feats, input_hw, b, &box_parts, &cls_parts)
                } else {
                    self.decode(feats, input_hw, b, &box_parts, &cls_parts)
                }
            },
        )
    }

    /// The CUDA path of [`Self::forward`] on channels-last features: for each level its branches
    /// (their last convolutions without bias), then one decode kernel
    /// (`crate::backend::decode_level`) that adds those biases and writes the level's anchors of
    /// the one raw output.
    #[cfg(feature = "cuda")]
    fn forward_fused(&self, feats: &[Tensor], input_hw: (usize, usize), out: Option<&Tensor>) -> candle_core::Result<Tensor> {
        let mut total = 0;
        for f in feats {
            let (_, h, w) = self.lay.chw(f)?;
            total += h * w;
        }
        let out = match out {
            Some(o) => o.clone(),
            // SAFETY: every anchor of the output belongs to one level, and each level's decode
            // below writes all of its anchors before the output is returned (an error drops it).
            None => unsafe { Tensor::empty((feats[0].dim(0)?, 4 + self.nc, total), feats[0].dtype(), feats[0].device())? },
        };
        let mut offset = 0;
        for (i, f) in feats.iter().enumerate() {
            let (bx, cl) = (self.boxes[i].forward_unbiased(f)?, self.classes[i].forward_unbiased(f)?);
            let (_, h, w) = self.lay.chw(f)?;
            let stride = (input_hw.0 / h.max(1)) as f32;
            let (bb, cb) = &self.biases_f32[i];
            crate::backend::profile::scope(
                || "head: bias + DFL + decode (fused)".into(),
                || crate::backend::decode_level(&out, offset, (&bx, bb), (&cl, cb), &self.proj_f32, stride),
            )?;
            offset += h * w;
        }
        Ok(out)
    }

    /// [`Self::decode`] of f32 parts on the CPU, in one pass ([`crate::backend::cpu_head_decode`]).
    fn decode_cpu(
        &self,
        feats: &[Tensor],
        input_hw: (usize, usize),
        b: usize,
        box_parts: &[Tensor],
        cls_parts: &[Tensor],
    ) -> candle_core::Result<Tensor> {
        use crate::backend::{cpu_head_decode, with_cpu_f32, CpuHeadLevel};
        let mut grids = Vec::with_capacity(feats.len());
        for f in feats {
            let (_, h, w) = self.lay.chw(f)?;
            grids.push((w, h * w, (input_hw.0 / h.max(1)) as f32));
        }
        let proj = self.proj_f32.to_vec1::<f32>()?;
        let parts: Vec<&Tensor> = box_parts.iter().chain(cls_parts).collect();
        let out = with_cpu_f32(&parts, |v| {
            let (boxes, classes) = v.split_at(box_parts.len());
            let levels: Vec<CpuHeadLevel<'_>> = grids
                .iter()
                .zip(boxes.iter().zip(classes))
                .map(|(&(grid_w, anchors, stride), (bx, cl))| CpuHeadLevel { boxes: bx, classes: cl, grid_w, anchors, stride })
                .collect();
            cpu_head_decode(&levels, b, self.nc, &proj)
        })?;
        let a = grids.iter().map(|g| g.1).sum::<usize>();
        Tensor::from_vec(out, (b, 4 + self.nc, a), &Device::Cpu)
    }

    /// DFL expectation, anchor decode and sigmoid over the flattened branch outputs.
    fn decode(
        &self,
        feats: &[Tensor],
        input_hw: (usize, usize),
        b: usize,
        box_parts: &[Tensor],
        cls_parts: &[Tensor],
    ) -> candle_core::Result<Tensor> {
        let boxes = Tensor::cat(box_parts, 2)?; // (b, 4*reg, A)
        let cls = Tensor::cat(cls_parts, 2)?; // (b, nc, A)
        let a = boxes.dim(2)?;
        // DFL: softmax over the reg_max bins of each side, expectation with the projection.
        let d = boxes.reshape((b, 4, self.reg_max, a))?;
        let d = candle_nn::ops::softmax(&d, 2)?;
        let dist = d.broadcast_mul(&self.proj)?.sum(2)?; // (b, 4, A)
        let (anchors, strides) = self.anchors(feats, input_hw)?;
        let lt = dist.narrow(1, 0, 2)?;
        let rb = dist.narrow(1, 2, 2)?;
        let x1y1 = anchors.broadcast_sub(&lt)?;
        let x2y2 = anchors.broadcast_add(&rb)?;
        let cxy = ((&x1y1 + &x2y2)? * 0.5)?;
        let wh = (x2y2 - x1y1)?;
        let dbox = Tensor::cat(&[cxy, wh], 1)?.broadcast_mul(&strides)?;
        let scores = candle_nn::ops::sigmoid(&cls)?.to_dtype(dbox.dtype())?;
        Tensor::cat(&[dbox, scores], 1)
    }

    pub fn dtype(&self) -> DType {
        self.proj.dtype()
    }
}
