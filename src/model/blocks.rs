//! The YOLOv9 building blocks (ultralytics `nn/modules/{conv,block}.py`), each loaded from the
//! checkpoint's own state-dict names with BatchNorm and RepConv branches folded into one
//! convolution at load time (in f32, then cast to the run dtype).

use candle_core::{DType, Module, Tensor, D};

use super::layout::Lay;
use super::{ModelError, Vb};

/// BatchNorm epsilon of every YOLOv9 checkpoint (ultralytics and WongKinYiu set 1e-3).
pub const BN_EPS: f64 = 1e-3;

thread_local! {
    /// Multiply-accumulate counter used by [`crate::model::YoloV9::gflops`].
    pub(crate) static MACS: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

fn count_macs(w: &Tensor, out: &Tensor) {
    MACS.with(|m| {
        if let Some(v) = m.get() {
            let (_, cin_g, kh, kw) = w.dims4().unwrap_or((0, 0, 0, 0));
            let n = out.elem_count() as u64 / out.dim(0).unwrap_or(1) as u64;
            m.set(Some(v + n * (cin_g * kh * kw) as u64));
        }
    })
}

/// A 2-D convolution with bias, optionally followed by SiLU: the fused form of ultralytics
/// `Conv` (conv + BatchNorm + SiLU), `RepConv`, `DWConv` and plain `nn.Conv2d`.
#[derive(Debug, Clone)]
pub struct Conv {
    weight: Tensor,
    bias: Tensor,
    stride: usize,
    padding: usize,
    groups: usize,
    act: bool,
    /// The activation layout; on NHWC the weight is stored `(K, R, S, C/groups)`.
    lay: Lay,
    /// The weight packed for the CPU kernel (f32 CPU convolutions of one group).
    packed: Option<std::sync::Arc<crate::backend::PackedWeights>>,
    /// Set while BatchNorm statistics are being measured (tests, calibration).
    calib: Option<Calib>,
}

#[derive(Debug, Clone)]
struct Calib {
    name: String,
    gamma: Tensor,
    beta: Tensor,
    sink: super::CalibSink,
}

/// Reads a conv weight `[c2, c1/g, k, k]` and infers the group count from its shape. A group
/// count must divide both channel counts (as in `nn.Conv2d`); a weight that fits no such count is
/// checked against the ungrouped shape, and refused.
fn conv_weight(vb: &Vb, name: &str, c1: usize, c2: usize, k: usize) -> Result<(Tensor, usize), ModelError> {
    let shape = vb.shape_of(name).unwrap_or_default();
    let groups = match shape.as_slice() {
        [o, i, kh, kw] if *o == c2 && *kh == k && *kw == k && *i > 0 && c1.is_multiple_of(*i) && c2.is_multiple_of(c1 / *i) => c1 / *i,
        _ => 1,
    };
    let w = vb.get(name, &[c2, c1 / groups, k, k])?;
    Ok((w, groups))
}

impl Conv {
    /// ultralytics `Conv(c1, c2, k, s)` (padding k/2; groups from the checkpoint, so `DWConv` and
    /// the official DDetect's grouped conv load too), fused or not in the file.
    pub fn load(vb: &Vb, c1: usize, c2: usize, k: usize, s: usize, act: bool) -> Result<Self, ModelError> {
        let (w, groups) = conv_weight(vb, "conv.weight", c1, c2, k)?;
        if !vb.contains("bn.weight") {
            // already fused (`yolo-edge convert`, or ultralytics' model.fuse())
            let b = vb.get("conv.bias", &[c2])?;
            return Self::from_parts(vb, "conv", w, b, s, k / 2, groups, act);
        }
        let gamma = vb.get("bn.weight", &[c2])?;
        let beta = vb.get("bn.bias", &[c2])?;
        vb.ignore("bn.num_batches_tracked");
        if let Some(sink) = vb.calib() {
            let name = vb.name("bn");
            let dev = vb.device();
            return Ok(Self {
                weight: w.to_device(dev)?,
                bias: Tensor::zeros(c2, DType::F32, dev)?,
                stride: s,
                padding: k / 2,
                groups,
                act,
                lay: Lay::Nchw,
                packed: None,
                calib: Some(Calib { name, gamma: gamma.to_device(dev)?, beta: beta.to_device(dev)?, sink }),
            });
        }
        let mean = vb.get("bn.running_mean", &[c2])?;
        let var = vb.get("bn.running_var", &[c2])?;
        let scale = (gamma / (var + BN_EPS)?.sqrt()?)?;
        let w = w.broadcast_mul(&scale.reshape((c2, 1, 1, 1))?)?;
        let b = (beta - (mean * &scale)?)?;
        Self::from_parts(vb, "conv", w, b, s, k / 2, groups, act)
    }

    /// `nn.Conv2d(c1, c2, k, bias=True)` stored as `weight`/`bias` (Detect's last layers, CBLinear).
    pub fn load_plain(vb: &Vb, c1: usize, c2: usize, k: usize) -> Result<Self, ModelError> {
        let (w, groups) = conv_weight(vb, "weight", c1, c2, k)?;
        let b = vb.get("bias", &[c2])?;
        Self::from_parts(vb, "", w, b, 1, k / 2, groups, false)
    }

    /// Finishes a folded layer; `convert` records it under `<prefix>[.name].weight/.bias`.
    #[allow(clippy::too_many_arguments)]
    fn from_parts(
        vb: &Vb,
        name: &str,
        w: Tensor,
        b: Tensor,
        stride: usize,
        padding: usize,
        groups: usize,
        act: bool,
    ) -> Result<Self, ModelError> {
        let (dev, dt) = (vb.device(), vb.dtype());
        let dot = if name.is_empty() { String::new() } else { format!("{name}.") };
        vb.export(&format!("{dot}weight"), &w)?;
        vb.export(&format!("{dot}bias"), &b)?;
        let lay = vb.lay();
        let w = if lay == Lay::Nhwc { w.permute((0, 2, 3, 1))?.contiguous()? } else { w };
        let weight = w.to_dtype(dt)?.to_device(dev)?;
        let packed = if lay == Lay::Nchw && groups == 1 && weight.dtype() == DType::F32 && weight.device().is_cpu() {
            Some(std::sync::Arc::new(crate::backend::PackedWeights::new(&weight)?))
        } else {
            None
        };
        Ok(Self { weight, bias: b.to_dtype(dt)?.to_device(dev)?, stride, padding, groups, act, lay, packed, calib: None })
    }

    /// The activation layout this layer reads and writes.
    pub fn lay(&self) -> Lay {
        self.lay
    }

    /// The weight as `(K, C/groups, R, S)`, whatever the layout.
    fn weight_kcrs(&self) -> candle_core::Result<Tensor> {
        match self.lay {
            Lay::Nchw => Ok(self.weight.clone()),
            Lay::Nhwc => self.weight.permute((0, 3, 1, 2))?.contiguous(),
        }
    }

    /// Folded f32 weight and bias, for merging RepConv branches.
    fn folded(&self) -> Result<(Tensor, Tensor), ModelError> {
        Ok((self.weight_kcrs()?.to_dtype(DType::F32)?, self.bias.to_dtype(DType::F32)?))
    }

    /// Merges RepConv's 3x3 and 1x1 branches (both folded, no activation) into one 3x3 conv + SiLU.
    fn merge_rep(a: &Conv, b: &Conv, vb: &Vb) -> Result<Self, ModelError> {
        let (wa, ba) = a.folded()?;
        let (wb, bb) = b.folded()?;
        let wb = wb.pad_with_zeros(2, 1, 1)?.pad_with_zeros(3, 1, 1)?;
        Self::from_parts(vb, "conv", (wa + wb)?, (ba + bb)?, a.stride, a.padding, a.groups, true)
    }

    /// "conv 3x3/2 64->128 @80x80" for the profile table.
    fn op_name(&self, x: &Tensor) -> String {
        let (co, _, k, _) = self.weight.dims4().unwrap_or_default();
        let (ci, h, w) = self.lay.chw(x).unwrap_or_default();
        let g = if self.groups > 1 { format!(" g{}", self.groups) } else { String::new() };
        format!("conv {k}x{k}/{} {ci}->{co}{g} @{h}x{w}", self.stride)
    }

    fn conv(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if self.lay == Lay::Nhwc {
            let y = self.conv_nhwc(x)?;
            count_macs(&self.weight, &y);
            return Ok(y);
        }
        let (c_out, cin_g, k, _) = self.weight.dims4()?;
        let c_in = x.dim(1)?;
        let y =
            if self.groups > 1 && self.groups == c_in && cin_g == 1 && c_out == c_in && self.stride == 1 && !crate::backend::cudnn_takes(x)
            {
                depthwise(x, &self.weight, k, self.padding)?
            } else if self.groups == 1 && x.device().is_cpu() {
                im2col_gemm(x, &self.weight, self.stride, self.padding)?
            } else {
                crate::backend::conv2d(x, &self.weight, self.padding, self.stride, self.groups)?
            };
        count_macs(&self.weight, &y);
        Ok(y)
    }
}

impl Conv {
    /// The convolution of channels-last `x`: a 1x1 one is one GEMM over `(N*H*W, C)`, any other
    /// goes to cuDNN with NHWC descriptors; a shape cuDNN cannot run takes candle's NCHW path,
    /// re-laid out both ways.
    fn conv_nhwc(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (co, k, _, cin_g) = self.weight.dims4()?;
        let (n, h, w, c) = x.dims4()?;
        if k == 1 && self.stride == 1 && self.padding == 0 && self.groups == 1 {
            if c != cin_g {
                candle_core::bail!("1x1 convolution of {c} channels with a weight for {cin_g}");
            }
            let x2 = Lay::Nhwc.contiguous_c(x)?.reshape((n * h * w, c))?;
            return x2.matmul(&self.weight.reshape((co, cin_g))?.t()?)?.reshape((n, h, w, co));
        }
        #[cfg(feature = "cudnn")]
        if let Some(r) = crate::backend::cudnn_conv2d(x, &self.weight, self.padding, self.stride, self.groups, true) {
            return r;
        }
        let y = crate::backend::conv2d(&Lay::Nhwc.to_nchw(x)?, &self.weight_kcrs()?, self.padding, self.stride, self.groups)?;
        Lay::Nhwc.from_nchw(&y)
    }
}

/// Convolution on the CPU as one im2col copy and one GEMM over the whole batch: candle's CPU
/// conv re-lays out input and kernel on every call and tiles small GEMMs, several times slower.
fn im2col_gemm(x: &Tensor, w: &Tensor, s: usize, p: usize) -> candle_core::Result<Tensor> {
    let (b, c, h, wd) = x.dims4()?;
    let (co, ci, k, _) = w.dims4()?;
    let oh = (h + 2 * p - k) / s + 1;
    let ow = (wd + 2 * p - k) / s + 1;
    let wm = w.reshape((co, ci * k * k))?;
    // channels first, so that the GEMM's N dimension covers every picture of the batch
    let xc = x.transpose(0, 1)?; // (c, b, h, w)
    let cols = if k == 1 && s == 1 && p == 0 {
        xc.reshape((c, b * h * wd))?
    } else {
        // pad so that every tap can take `o * s` rows/columns, then subsample by the stride
        let need_h = (k - 1) + oh * s;
        let need_w = (k - 1) + ow * s;
        let xp = xc.pad_with_zeros(2, p, need_h.saturating_sub(h + p))?.pad_with_zeros(3, p, need_w.saturating_sub(wd + p))?;
        let wp = xp.dim(3)?;
        let mut taps = Vec::with_capacity(k * k);
        for i in 0..k {
            let rows = xp.narrow(2, i, oh * s)?;
            let rows = if s > 1 { rows.reshape((c, b, oh, s, wp))?.narrow(3, 0, 1)?.squeeze(3)? } else { rows };
            for j in 0..k {
                let t = rows.narrow(3, j, ow * s)?;
                let t = if s > 1 { t.reshape((c, b, oh, ow, s))?.narrow(4, 0, 1)?.squeeze(4)? } else { t };
                taps.push(t);
            }
        }
        Tensor::stack(&taps, 1)?.reshape((c * k * k, b * oh * ow))?
    };
    let y = wm.matmul(&cols)?.reshape((co, b, oh, ow))?;
    if b == 1 {
        y.reshape((1, co, oh, ow))
    } else {
        y.transpose(0, 1)?.contiguous()
    }
}

/// Depthwise k x k convolution (stride 1) as k*k shifted multiply-adds: candle's grouped
/// convolution runs one convolution per group, which is slow for hundreds of groups.
fn depthwise(x: &Tensor, w: &Tensor, k: usize, pad: usize) -> candle_core::Result<Tensor> {
    let (_, c, h, wd) = x.dims4()?;
    let xp = x.pad_with_zeros(2, pad, pad)?.pad_with_zeros(3, pad, pad)?;
    let w = w.reshape((c, k * k))?;
    let mut acc: Option<Tensor> = None;
    for i in 0..k {
        let rows = xp.narrow(2, i, h)?;
        for j in 0..k {
            let tap = w.narrow(1, i * k + j, 1)?.reshape((1, c, 1, 1))?;
            let term = rows.narrow(3, j, wd)?.broadcast_mul(&tap)?;
            acc = Some(match acc {
                None => term,
                Some(a) => (a + term)?,
            });
        }
    }
    acc.ok_or_else(|| candle_core::Error::Msg("empty depthwise kernel".into()))
}

impl Conv {
    /// `act(conv(cat(xs, 1)) + bias) (+ residual)`. On the CPU in f32 this is one pass
    /// ([`crate::backend::cpu_fused_conv2d`]): no concatenation, bias, activation or residual tensors in between.
    pub fn forward_cat(&self, xs: &[&Tensor], residual: Option<&Tensor>) -> candle_core::Result<Tensor> {
        let x0 = xs.first().ok_or_else(|| candle_core::Error::Msg("conv without input".into()))?;
        let (k, s) = (self.weight.dim(2)?, self.stride);
        if self.calib.is_none()
            && self.lay == Lay::Nchw
            && self.groups == 1
            && x0.device().is_cpu()
            && self.weight.dtype() == DType::F32
            && xs.iter().all(|x| x.dtype() == DType::F32)
            && (xs.len() == 1 || (k == 1 && s == 1 && self.padding == 0))
        {
            let y = crate::backend::profile::scope(
                || format!("{} +bias+act (fused)", self.op_name(x0)),
                || {
                    crate::backend::cpu_fused_conv2d(
                        xs,
                        &self.weight,
                        self.packed.as_deref(),
                        &self.bias,
                        s,
                        self.padding,
                        self.act,
                        residual,
                    )
                },
            )?;
            count_macs(&self.weight, &y);
            return Ok(y);
        }
        #[cfg(feature = "cudnn")]
        if xs.len() == 1 {
            if let Some(y) = self.fused(x0, residual, crate::backend::CudnnOut::New)? {
                return Ok(y);
            }
        }
        #[cfg(feature = "cuda")]
        if self.calib.is_none() && x0.device().is_cuda() {
            let x = if xs.len() == 1 {
                (*x0).clone()
            } else {
                crate::backend::profile::scope(|| format!("concat{}", self.lay.shape_tag(x0)), || self.lay.cat_c(xs))?
            };
            let y = self.forward_unbiased(&x)?;
            let what = || {
                let kind = if self.act { "bias+silu" } else { "bias" };
                format!("{kind}{} (fused){}", if residual.is_some() { "+residual" } else { "" }, self.lay.shape_tag(&y))
            };
            return crate::backend::profile::scope(what, || {
                crate::backend::bias_act(&y, &self.bias, self.act, residual, self.lay == Lay::Nhwc)
            });
        }
        let y = if xs.len() == 1 { self.forward_one(x0)? } else { self.forward_one(&self.lay.cat_c(xs)?)? };
        match residual {
            Some(r) => r + y,
            None => Ok(y),
        }
    }

    /// `act(conv(x) + bias) (+ residual)` as one cuDNN kernel, written where `out` says, where
    /// that is on and pays ([`crate::backend::cudnn_conv_bias_act`]); `None`: run unfused.
    #[cfg(feature = "cudnn")]
    fn fused(&self, x: &Tensor, residual: Option<&Tensor>, out: crate::backend::CudnnOut) -> candle_core::Result<Option<Tensor>> {
        if self.calib.is_some() || !x.device().is_cuda() || self.lay != Lay::Nhwc || self.groups != 1 {
            return Ok(None);
        }
        let into = !matches!(out, crate::backend::CudnnOut::New);
        let p = crate::backend::CudnnConvParams {
            weight: &self.weight,
            bias: &self.bias,
            padding: self.padding,
            stride: self.stride,
            act: self.act,
        };
        let y = crate::backend::profile::scope_some(
            || {
                let act = if self.act { "+silu" } else { "" };
                let res = if residual.is_some() { "+residual" } else { "" };
                format!("{} +bias{act}{res}{} (cuDNN fused)", self.op_name(x), if into { " into concat" } else { "" })
            },
            || crate::backend::cudnn_conv_bias_act(x, &p, residual, out).transpose(),
        )?;
        if let Some(y) = &y {
            count_macs(&self.weight, y);
        }
        Ok(y)
    }

    /// The convolution without its bias, which the caller adds (the epilogues here; the CUDA
    /// head's decode, as it reads the branch outputs).
    pub(super) fn forward_unbiased(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        crate::backend::profile::scope(|| self.op_name(x), || self.conv(x))
    }

    /// The bias per output channel, in the model's dtype.
    #[cfg(feature = "cuda")]
    pub(super) fn bias(&self) -> &Tensor {
        &self.bias
    }

    /// candle's ops: the GPU path, f16, grouped convolutions and BatchNorm calibration.
    fn forward_one(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let y = self.forward_unbiased(x)?;
        let Some(c) = &self.calib else {
            let bias = match self.lay {
                Lay::Nchw => self.bias.reshape((1, (), 1, 1))?,
                Lay::Nhwc => self.bias.reshape((1, 1, 1, ()))?,
            };
            return crate::backend::profile::scope(
                || (if self.act { "bias+silu" } else { "bias" }).into(),
                || self.activate(y.broadcast_add(&bias)?),
            );
        };
        // BatchNorm with this batch's statistics, which become the running statistics
        // (biased variance), exactly as `scripts/make_goldens.py` calibrates the reference.
        let mean = y.mean_keepdim(D::Minus1)?.mean_keepdim(D::Minus2)?.mean_keepdim(0)?;
        let centered = y.broadcast_sub(&mean)?;
        let var = centered.sqr()?.mean_keepdim(D::Minus1)?.mean_keepdim(D::Minus2)?.mean_keepdim(0)?;
        c.sink.lock().unwrap().push((c.name.clone(), mean.flatten_all()?, var.flatten_all()?));
        let inv = (var + BN_EPS)?.sqrt()?.recip()?;
        self.activate(
            centered.broadcast_mul(&inv)?.broadcast_mul(&c.gamma.reshape((1, (), 1, 1))?)?.broadcast_add(&c.beta.reshape((
                1,
                (),
                1,
                1,
            ))?)?,
        )
    }

    fn activate(&self, y: Tensor) -> candle_core::Result<Tensor> {
        if self.act {
            y.silu()
        } else {
            Ok(y)
        }
    }
}

/// Concatenations written in place: on CUDA with channels-last activations a block whose
/// convolutions feed one channel concatenation has each of them write its epilogue's output
/// straight into its channels of the concatenation's buffer ([`Conv::forward_wide`],
/// [`Conv::forward_into`]), instead of writing its own tensor that a concatenation then copies.
impl Conv {
    /// Whether [`Conv::forward_wide`] and [`Conv::forward_into`] write in place for input `x`.
    fn writes_in_place(&self, x: &Tensor) -> bool {
        cfg!(feature = "cuda") && self.calib.is_none() && self.lay == Lay::Nhwc && x.device().is_cuda()
    }

    fn out_channels(&self) -> candle_core::Result<usize> {
        Ok(self.weight.dims4()?.0)
    }

    fn in_channels(&self) -> candle_core::Result<usize> {
        let (_, a, _, d) = self.weight.dims4()?;
        // NCHW weights are (K, C/groups, R, S), NHWC ones (K, R, S, C/groups)
        Ok(if self.lay == Lay::Nhwc { d } else { a } * self.groups.max(1))
    }

    /// `act(conv(x) + bias)` as channels `offset..offset + C` of a new channels-last buffer of
    /// `width` channels, the others left for [`Conv::forward_into`] or a copy to fill (CUDA,
    /// [`Conv::writes_in_place`]).
    fn forward_wide(&self, x: &Tensor, width: usize, offset: usize) -> candle_core::Result<Tensor> {
        #[cfg(feature = "cudnn")]
        if let Some(y) = self.fused(x, None, crate::backend::CudnnOut::Wide { width, offset })? {
            return Ok(y);
        }
        #[cfg(feature = "cuda")]
        {
            let y = self.forward_unbiased(x)?;
            crate::backend::profile::scope(
                || format!("{} into concat{}", if self.act { "bias+silu" } else { "bias" }, self.lay.shape_tag(&y)),
                || crate::backend::bias_act_wide(&y, &self.bias, self.act, width, offset),
            )
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (x, width, offset);
            candle_core::bail!("writing into a concatenation needs CUDA")
        }
    }

    /// `act(conv(x) + bias)` written into channels `offset..offset + C` of `buf` (a buffer made
    /// by [`Conv::forward_wide`]).
    fn forward_into(&self, x: &Tensor, buf: &Tensor, offset: usize) -> candle_core::Result<()> {
        #[cfg(feature = "cudnn")]
        if self.fused(x, None, crate::backend::CudnnOut::Into { buf, offset })?.is_some() {
            return Ok(());
        }
        #[cfg(feature = "cuda")]
        {
            let y = self.forward_unbiased(x)?;
            crate::backend::profile::scope(
                || format!("{} into concat{}", if self.act { "bias+silu" } else { "bias" }, self.lay.shape_tag(&y)),
                || crate::backend::bias_act_into(buf, offset, &y, &self.bias, self.act),
            )
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (x, buf, offset);
            candle_core::bail!("writing into a concatenation needs CUDA")
        }
    }
}

/// `src` copied into channels `offset..` of `buf` (channels last).
fn copy_into(buf: &Tensor, src: &Tensor, offset: usize) -> candle_core::Result<()> {
    crate::backend::profile::scope(
        || format!("copy into concat{}", Lay::Nhwc.shape_tag(src)),
        || {
            #[cfg(feature = "cuda")]
            if let Some(r) = crate::backend::nhwc::copy_into(buf, offset, src) {
                return r;
            }
            buf.slice_set(src, 3, offset)
        },
    )
}

impl Module for Conv {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.forward_cat(&[x], None)
    }
}

/// ultralytics `RepConv(c1, c2, 3)` (= WongKinYiu `RepConvN`): 3x3 and 1x1 branches summed, SiLU.
#[derive(Debug, Clone)]
pub enum RepConv {
    Fused(Conv),
    Branches(Conv, Conv),
}

impl RepConv {
    pub fn load(vb: &Vb, c1: usize, c2: usize) -> Result<Self, ModelError> {
        if vb.contains("conv.weight") {
            return Ok(Self::Fused(Conv::load(vb, c1, c2, 3, 1, true)?));
        }
        // the branches are exported only as their merged sum
        let branches = vb.without_export();
        let a = Conv::load(&branches.pp("conv1"), c1, c2, 3, 1, false)?;
        let b = Conv::load(&branches.pp("conv2"), c1, c2, 1, 1, false)?;
        if a.calib.is_some() {
            return Ok(Self::Branches(a, b));
        }
        Ok(Self::Fused(Conv::merge_rep(&a, &b, vb)?))
    }
}

impl Module for RepConv {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Self::Fused(c) => c.forward(x),
            Self::Branches(a, b) => (a.forward(x)? + b.forward(x)?)?.silu(),
        }
    }
}

/// `RepBottleneck(c, c, shortcut=True, e=1.0)`: x + cv2(cv1(x)).
#[derive(Debug, Clone)]
pub struct RepBottleneck {
    cv1: RepConv,
    cv2: Conv,
}

impl Module for RepBottleneck {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.cv2.forward_cat(&[&self.cv1.forward(x)?], Some(x))
    }
}

/// `RepCSP(c1, c2, n)` (a C3 with RepBottlenecks).
#[derive(Debug, Clone)]
pub struct RepCsp {
    cv1: Conv,
    cv2: Conv,
    cv3: Conv,
    m: Vec<RepBottleneck>,
}

impl RepCsp {
    pub fn load(vb: &Vb, c1: usize, c2: usize, n: usize) -> Result<Self, ModelError> {
        let c_ = c2 / 2;
        let m = (0..n)
            .map(|i| {
                let b = vb.pp(format!("m.{i}"));
                Ok(RepBottleneck { cv1: RepConv::load(&b.pp("cv1"), c_, c_)?, cv2: Conv::load(&b.pp("cv2"), c_, c_, 3, 1, true)? })
            })
            .collect::<Result<_, ModelError>>()?;
        Ok(Self {
            cv1: Conv::load(&vb.pp("cv1"), c1, c_, 1, 1, true)?,
            cv2: Conv::load(&vb.pp("cv2"), c1, c_, 1, 1, true)?,
            cv3: Conv::load(&vb.pp("cv3"), 2 * c_, c2, 1, 1, true)?,
            m,
        })
    }
}

impl Module for RepCsp {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mut a = self.cv1.forward(x)?;
        for b in &self.m {
            a = b.forward(&a)?;
        }
        if self.cv2.writes_in_place(x) {
            let ca = a.dim(3)?;
            let buf = self.cv2.forward_wide(x, ca + self.cv2.out_channels()?, ca)?;
            copy_into(&buf, &a, 0)?;
            return self.cv3.forward(&buf);
        }
        self.cv3.forward_cat(&[&a, &self.cv2.forward(x)?], None)
    }
}

/// One of RepNCSPELAN4's two inner branches: `Sequential(RepCSP, Conv 3x3)` or ELAN1's `Conv 3x3`.
// built once at load and never moved in the hot path: boxing the large variant buys nothing
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
enum ElanBranch {
    Csp(RepCsp, Conv),
    Plain(Conv),
}

impl Module for ElanBranch {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Self::Csp(csp, c) => c.forward(&csp.forward(x)?),
            Self::Plain(c) => c.forward(x),
        }
    }
}

impl ElanBranch {
    /// The branch's output written into channels `offset..` of `buf` ([`Conv::forward_into`]).
    fn forward_into(&self, x: &Tensor, buf: &Tensor, offset: usize) -> candle_core::Result<()> {
        match self {
            Self::Csp(csp, c) => c.forward_into(&csp.forward(x)?, buf, offset),
            Self::Plain(c) => c.forward_into(x, buf, offset),
        }
    }
}

/// `RepNCSPELAN4(c1, c2, c3, c4, n)` and its light form `ELAN1(c1, c2, c3, c4)`.
#[derive(Debug, Clone)]
pub struct Elan {
    cv1: Conv,
    cv2: ElanBranch,
    cv3: ElanBranch,
    cv4: Conv,
}

impl Elan {
    pub fn load_repncsp(vb: &Vb, c1: usize, c2: usize, c3: usize, c4: usize, n: usize) -> Result<Self, ModelError> {
        let branch = |name: &str, cin: usize| -> Result<ElanBranch, ModelError> {
            let b = vb.pp(name);
            Ok(ElanBranch::Csp(RepCsp::load(&b.pp("0"), cin, c4, n)?, Conv::load(&b.pp("1"), c4, c4, 3, 1, true)?))
        };
        Ok(Self {
            cv1: Conv::load(&vb.pp("cv1"), c1, c3, 1, 1, true)?,
            cv2: branch("cv2", c3 / 2)?,
            cv3: branch("cv3", c4)?,
            cv4: Conv::load(&vb.pp("cv4"), c3 + 2 * c4, c2, 1, 1, true)?,
        })
    }

    pub fn load_elan1(vb: &Vb, c1: usize, c2: usize, c3: usize, c4: usize) -> Result<Self, ModelError> {
        Ok(Self {
            cv1: Conv::load(&vb.pp("cv1"), c1, c3, 1, 1, true)?,
            cv2: ElanBranch::Plain(Conv::load(&vb.pp("cv2"), c3 / 2, c4, 3, 1, true)?),
            cv3: ElanBranch::Plain(Conv::load(&vb.pp("cv3"), c4, c4, 3, 1, true)?),
            cv4: Conv::load(&vb.pp("cv4"), c3 + 2 * c4, c2, 1, 1, true)?,
        })
    }
}

impl Module for Elan {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let lay = self.cv1.lay();
        if self.cv1.writes_in_place(x) {
            // cv1, cv2 and cv3 write into the channels of the buffer cv4 reads; cv2's output,
            // which cv3 reads too, is copied there
            let (c3, width) = (self.cv1.out_channels()?, self.cv4.in_channels()?);
            let buf = self.cv1.forward_wide(x, width, 0)?;
            let half = c3.div_ceil(2);
            let y1 = crate::backend::profile::scope(
                || format!("split copy{}", lay.shape_tag(&buf)),
                || lay.contiguous_c(&lay.narrow_c(&buf, half, c3 - half)?),
            )?;
            let y2 = self.cv2.forward(&y1)?;
            if c3 + 2 * y2.dim(3)? != width {
                candle_core::bail!("ELAN: cv4 reads {width} channels, not cv1's {c3} and twice the branches' {}", y2.dim(3)?);
            }
            copy_into(&buf, &y2, c3)?;
            self.cv3.forward_into(&y2, &buf, c3 + y2.dim(3)?)?;
            return self.cv4.forward(&buf);
        }
        let y = self.cv1.forward(x)?;
        let c = lay.chw(&y)?.0;
        let half = c.div_ceil(2);
        let y1 = lay.narrow_c(&y, half, c - half)?;
        // channels last, the slice is strided on every pixel: copied once here rather than by
        // each convolution that reads it
        let y1 = if lay == Lay::Nhwc {
            crate::backend::profile::scope(|| format!("split copy{}", lay.shape_tag(&y1)), || lay.contiguous_c(&y1))?
        } else {
            y1
        };
        let y2 = self.cv2.forward(&y1)?;
        let y3 = self.cv3.forward(&y2)?;
        // chunk(2) gives y0, y1 and cat(y0, y1) is y itself
        self.cv4.forward_cat(&[&y, &y2, &y3], None)
    }
}

/// `AConv(c1, c2)`: avg-pool 2x2/1 then Conv 3x3/2.
#[derive(Debug, Clone)]
pub struct AConv {
    cv1: Conv,
}

impl AConv {
    pub fn load(vb: &Vb, c1: usize, c2: usize) -> Result<Self, ModelError> {
        Ok(Self { cv1: Conv::load(&vb.pp("cv1"), c1, c2, 3, 2, true)? })
    }
}

impl Module for AConv {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.cv1.forward(&crate::backend::profile::scope(|| "avgpool".into(), || self.cv1.lay().avg_pool_2x2_s1(x))?)
    }
}

/// `ADown(c1, c2)`: avg-pool, then half the channels through Conv 3x3/2 and half through
/// max-pool 3x3/2 + Conv 1x1.
#[derive(Debug, Clone)]
pub struct ADown {
    cv1: Conv,
    cv2: Conv,
}

impl ADown {
    pub fn load(vb: &Vb, c1: usize, c2: usize) -> Result<Self, ModelError> {
        Ok(Self {
            cv1: Conv::load(&vb.pp("cv1"), c1 / 2, c2 / 2, 3, 2, true)?,
            cv2: Conv::load(&vb.pp("cv2"), c1 / 2, c2 / 2, 1, 1, true)?,
        })
    }
}

impl Module for ADown {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let lay = self.cv1.lay();
        let x = crate::backend::profile::scope(|| "avgpool".into(), || lay.avg_pool_2x2_s1(x))?;
        let c = lay.chw(&x)?.0;
        let half = c.div_ceil(2);
        if self.cv1.writes_in_place(&x) {
            let c1 = self.cv1.out_channels()?;
            let buf = self.cv1.forward_wide(&lay.narrow_c(&x, 0, half)?, c1 + self.cv2.out_channels()?, 0)?;
            let pooled =
                crate::backend::profile::scope(|| "maxpool".into(), || lay.max_pool_padded(&lay.narrow_c(&x, half, c - half)?, 3, 2))?;
            self.cv2.forward_into(&pooled, &buf, c1)?;
            return Ok(buf);
        }
        let x1 = self.cv1.forward(&lay.narrow_c(&x, 0, half)?)?;
        let x2 = self.cv2.forward(&crate::backend::profile::scope(
            || "maxpool".into(),
            || lay.max_pool_padded(&lay.narrow_c(&x, half, c - half)?, 3, 2),
        )?)?;
        crate::backend::profile::scope(|| "concat".into(), || lay.cat_c(&[x1, x2]))
    }
}

/// `SPPELAN(c1, c2, c3, k=5)`.
#[derive(Debug, Clone)]
pub struct Sppelan {
    cv1: Conv,
    cv5: Conv,
}

impl Sppelan {
    pub fn load(vb: &Vb, c1: usize, c2: usize, c3: usize) -> Result<Self, ModelError> {
        Ok(Self { cv1: Conv::load(&vb.pp("cv1"), c1, c3, 1, 1, true)?, cv5: Conv::load(&vb.pp("cv5"), 4 * c3, c2, 1, 1, true)? })
    }
}

impl Module for Sppelan {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mut ys = vec![self.cv1.forward(x)?];
        for _ in 0..3 {
            let y = crate::backend::profile::scope(|| "maxpool".into(), || self.cv1.lay().max_pool_padded(ys.last().unwrap(), 5, 1))?;
            ys.push(y);
        }
        self.cv5.forward_cat(&ys.iter().collect::<Vec<_>>(), None)
    }
}

/// `CBLinear(c1, c2s)`: one 1x1 conv (with bias) whose output is split by channel counts.
#[derive(Debug, Clone)]
pub struct CbLinear {
    conv: Conv,
    c2s: Vec<usize>,
}

impl CbLinear {
    pub fn load(vb: &Vb, c1: usize, c2s: &[usize]) -> Result<Self, ModelError> {
        Ok(Self { conv: Conv::load_plain(&vb.pp("conv"), c1, c2s.iter().sum(), 1)?, c2s: c2s.to_vec() })
    }

    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Vec<Tensor>> {
        let y = self.conv.forward(x)?;
        let lay = self.conv.lay();
        let mut start = 0;
        self.c2s
            .iter()
            .map(|&c| {
                let t = lay.narrow_c(&y, start, c);
                start += c;
                t
            })
            .collect()
    }
}

/// `CBFuse(idx)`: nearest-resize the picked CBLinear outputs to the last input's size and sum.
pub fn cb_fuse(lay: Lay, picked: &[Tensor], last: &Tensor) -> candle_core::Result<Tensor> {
    #[cfg(feature = "cuda")]
    if lay == Lay::Nhwc && last.device().is_cuda() {
        return crate::backend::add_upsampled(last, picked);
    }
    let (_, h, w) = lay.chw(last)?;
    let mut acc = last.clone();
    for t in picked {
        let (_, th, tw) = lay.chw(t)?;
        let up = if (th, tw) == (h, w) { t.clone() } else { lay.upsample(t, h, w)? };
        acc = (acc + up)?;
    }
    Ok(acc)
}
