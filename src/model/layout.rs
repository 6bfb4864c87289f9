//! Where the channels of the network's activations live: NCHW (the reference's layout, the CPU
//! path) or NHWC (channels last, the CUDA path with cuDNN), and the layout-aware tensor ops the
//! blocks share (channel split and concat, pooling, nearest upsampling).
//!
//! Why NHWC on the GPU: cuDNN's FP16 tensor-core convolutions work on channels-last data. Fed
//! NCHW, every 3x3 convolution first re-lays its input out in a workspace that grows with the
//! batch (time, and on a free card 2x PyTorch's memory per picture; BENCHMARKS.md, "Settled experiments").
//! Channels last, a 1x1 convolution is one plain GEMM over `(N*H*W, C)` and the re-layout is
//! gone. The tensors of an NHWC model are physically `(N, H, W, C)` and contiguous; the model's
//! input and output keep the reference's shapes, so callers never see the difference. On CUDA the
//! NHWC moves (channel slices, concatenation, upsampling, the input's relayout) are the project's
//! 16-byte kernels (`backend::nhwc`), candle's strided copies where those do not apply.

use candle_core::Tensor;

/// The activation layout of a loaded model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lay {
    /// `(N, C, H, W)`.
    #[default]
    Nchw,
    /// `(N, H, W, C)`, CUDA with cuDNN only.
    Nhwc,
}

/// The layout a model on `device` runs in: NHWC on CUDA when cuDNN takes the convolutions (the
/// tensor-core kernels read channels last), NCHW everywhere else and while calibrating.
pub fn choose(device: &candle_core::Device, calibrating: bool) -> Lay {
    if device.is_cuda() && cfg!(feature = "cudnn") && !calibrating {
        Lay::Nhwc
    } else {
        Lay::Nchw
    }
}

impl Lay {
    /// The dimension that holds the channels.
    pub fn cdim(self) -> usize {
        match self {
            Lay::Nchw => 1,
            Lay::Nhwc => 3,
        }
    }

    /// `(C, H, W)` of a 4-D activation.
    pub fn chw(self, x: &Tensor) -> candle_core::Result<(usize, usize, usize)> {
        let (_, a, b, c) = x.dims4()?;
        Ok(match self {
            Lay::Nchw => (a, b, c),
            Lay::Nhwc => (c, a, b),
        })
    }

    /// `" c{C} @{H}x{W}"` of a 4-D activation, for profile entries (empty if it is not 4-D).
    pub fn shape_tag(self, x: &Tensor) -> String {
        self.chw(x).map(|(c, h, w)| format!(" c{c} @{h}x{w}")).unwrap_or_default()
    }

    /// Channels `start..start + len`.
    pub fn narrow_c(self, x: &Tensor, start: usize, len: usize) -> candle_core::Result<Tensor> {
        x.narrow(self.cdim(), start, len)
    }

    /// Concatenation along the channels.
    pub fn cat_c<T: AsRef<Tensor>>(self, xs: &[T]) -> candle_core::Result<Tensor> {
        match self {
            Lay::Nchw => Tensor::cat(xs, 1),
            Lay::Nhwc => {
                #[cfg(feature = "cuda")]
                if let Some(r) = crate::backend::nhwc::cat_c(&xs.iter().map(AsRef::as_ref).collect::<Vec<_>>()) {
                    return r;
                }
                // candle concatenates contiguous tensors on the last dimension with one strided
                // copy each; a channel slice is made contiguous first
                let xs = xs.iter().map(|x| x.as_ref().contiguous()).collect::<candle_core::Result<Vec<_>>>()?;
                Tensor::cat(&xs, 3)
            }
        }
    }

    /// `avg_pool2d(x, 2, 1, 0, ceil_mode=False, count_include_pad=True)`.
    pub fn avg_pool_2x2_s1(self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Lay::Nchw if crate::backend::is_cpu_f32(x) => {
                let (b, c, h, w) = x.dims4()?;
                let y = crate::backend::with_cpu_f32(&[x], |v| crate::backend::cpu_avg_pool_2x2_s1(v[0], b * c, h, w))?;
                Tensor::from_vec(y, (b, c, h.saturating_sub(1), w.saturating_sub(1)), x.device())
            }
            Lay::Nchw => x.avg_pool2d_with_stride((2, 2), (1, 1)),
            Lay::Nhwc => pool_nhwc(x, Pool::Avg, 2, 1, 0),
        }
    }

    /// Max-pool `k x k`, stride `s`, padding `k / 2` (PyTorch pads a max with -inf).
    pub fn max_pool_padded(self, x: &Tensor, k: usize, s: usize) -> candle_core::Result<Tensor> {
        let p = k / 2;
        match self {
            Lay::Nchw if crate::backend::is_cpu_f32(x) => {
                let (b, c, h, w) = x.dims4()?;
                let (y, oh, ow) = crate::backend::with_cpu_f32(&[x], |v| crate::backend::cpu_max_pool_padded(v[0], b * c, h, w, k, s))?;
                Tensor::from_vec(y, (b, c, oh, ow), x.device())
            }
            // replicating the edge equals -inf padding for a max
            Lay::Nchw => x.pad_with_same(2, p, p)?.pad_with_same(3, p, p)?.max_pool2d_with_stride((k, k), (s, s)),
            Lay::Nhwc => pool_nhwc(x, Pool::Max, k, s, p),
        }
    }

    /// Nearest-neighbour upsampling to `h x w` (an integer multiple of the input's size on NHWC).
    pub fn upsample(self, x: &Tensor, h: usize, w: usize) -> candle_core::Result<Tensor> {
        match self {
            Lay::Nchw => x.upsample_nearest2d(h, w),
            Lay::Nhwc => {
                let (n, ih, iw, c) = x.dims4()?;
                if ih == 0 || iw == 0 || !h.is_multiple_of(ih) || !w.is_multiple_of(iw) {
                    candle_core::bail!("NHWC upsample from {ih}x{iw} to {h}x{w}: not an integer factor");
                }
                let (fh, fw) = (h / ih, w / iw);
                let x = &self.contiguous_c(x)?;
                #[cfg(feature = "cuda")]
                if let Some(r) = crate::backend::nhwc::upsample(x, fh, fw) {
                    return r;
                }
                // one strided copy: every input pixel broadcast over an fh x fw block
                x.reshape((n, ih, 1, iw, 1, c))?.broadcast_as((n, ih, fh, iw, fw, c))?.contiguous()?.reshape((n, h, w, c))
            }
        }
    }

    /// The model's input `(N, 3, H, W)` in this layout.
    pub fn from_nchw(self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Lay::Nchw => Ok(x.clone()),
            Lay::Nhwc => {
                #[cfg(feature = "cuda")]
                if let Some(r) = crate::backend::nhwc::from_nchw(x) {
                    return r;
                }
                x.permute((0, 2, 3, 1))?.contiguous()
            }
        }
    }

    /// A channel slice ([`Lay::narrow_c`]) as a contiguous tensor of its own.
    pub fn contiguous_c(self, x: &Tensor) -> candle_core::Result<Tensor> {
        #[cfg(feature = "cuda")]
        if self == Lay::Nhwc {
            if let Some(r) = crate::backend::nhwc::contiguous(x) {
                return r;
            }
        }
        x.contiguous()
    }

    /// An activation of this layout as NCHW (the head's small outputs).
    pub fn to_nchw(self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Lay::Nchw => Ok(x.clone()),
            Lay::Nhwc => x.permute((0, 3, 1, 2))?.contiguous(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Pool {
    Max,
    Avg,
}

#[cfg(feature = "cuda")]
fn pool_nhwc(x: &Tensor, kind: Pool, k: usize, s: usize, p: usize) -> candle_core::Result<Tensor> {
    if x.device().is_cuda() {
        return crate::backend::pool_nhwc(x, matches!(kind, Pool::Max), k, s, p);
    }
    pool_nhwc_candle(x, kind, k, s, p)
}

#[cfg(not(feature = "cuda"))]
fn pool_nhwc(x: &Tensor, kind: Pool, k: usize, s: usize, p: usize) -> candle_core::Result<Tensor> {
    pool_nhwc_candle(x, kind, k, s, p)
}

/// The same pooling through candle's NCHW ops (the reference for the CUDA kernel's tests).
fn pool_nhwc_candle(x: &Tensor, kind: Pool, k: usize, s: usize, p: usize) -> candle_core::Result<Tensor> {
    let nchw = x.permute((0, 3, 1, 2))?.contiguous()?;
    let y = match kind {
        Pool::Max => nchw.pad_with_same(2, p, p)?.pad_with_same(3, p, p)?.max_pool2d_with_stride((k, k), (s, s))?,
        Pool::Avg => nchw.pad_with_zeros(2, p, p)?.pad_with_zeros(3, p, p)?.avg_pool2d_with_stride((k, k), (s, s))?,
    };
    y.permute((0, 2, 3, 1))?.contiguous()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, D};

    fn nhwc(x: &Tensor) -> Tensor {
        x.permute((0, 2, 3, 1)).unwrap().contiguous().unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(D::Minus1).unwrap().to_scalar::<f32>().unwrap()
    }

    /// Every layout-aware op on NHWC equals the NCHW op, re-laid out.
    #[test]
    fn nhwc_ops_equal_nchw_ops() {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1f32, (2, 6, 7, 5), &dev).unwrap();
        let (a, b) = (Lay::Nchw, Lay::Nhwc);
        let xh = b.from_nchw(&x).unwrap();
        assert_eq!(b.chw(&xh).unwrap(), a.chw(&x).unwrap());
        assert_eq!(max_diff(&b.to_nchw(&xh).unwrap(), &x), 0.0);
        assert_eq!(max_diff(&b.narrow_c(&xh, 2, 3).unwrap(), &nhwc(&a.narrow_c(&x, 2, 3).unwrap())), 0.0);
        let parts = [a.narrow_c(&x, 0, 2).unwrap(), x.clone()];
        let parts_h = [b.narrow_c(&xh, 0, 2).unwrap(), xh.clone()];
        assert_eq!(max_diff(&b.cat_c(&parts_h).unwrap(), &nhwc(&a.cat_c(&parts).unwrap())), 0.0);
        assert!(max_diff(&b.avg_pool_2x2_s1(&xh).unwrap(), &nhwc(&a.avg_pool_2x2_s1(&x).unwrap())) < 1e-6);
        for (k, s) in [(3, 2), (5, 1)] {
            assert_eq!(max_diff(&b.max_pool_padded(&xh, k, s).unwrap(), &nhwc(&a.max_pool_padded(&x, k, s).unwrap())), 0.0, "k{k} s{s}");
        }
        assert_eq!(max_diff(&b.upsample(&xh, 14, 10).unwrap(), &nhwc(&a.upsample(&x, 14, 10).unwrap())), 0.0);
        assert!(b.upsample(&xh, 15, 10).is_err());
    }
}
