//! Max and average pooling of channels-last `(N, H, W, C)` activations on CUDA
//! (`kernels/pool.cu`): candle pools NCHW only. The input may be a channel slice of a wider
//! activation (ADown pools half of its channels), read in place.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};
use candle_core::{CpuStorage, CudaStorage, CustomOp1, DType, Layout, Shape, Tensor};

use super::nhwc::pixel_stride;

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/pool.ptx"));
const MODULE: &str = "yolo_edge_pool";

/// `k x k` pooling with stride `s` and padding `p` of NHWC `x` (max ignores the padding,
/// average divides by `k * k`).
pub fn pool(x: &Tensor, max: bool, k: usize, s: usize, p: usize) -> candle_core::Result<Tensor> {
    if k == 0 || s == 0 || p >= k {
        candle_core::bail!("pool: kernel {k}, stride {s}, padding {p}");
    }
    let x = if pixel_stride(x.layout()).is_some() { x.clone() } else { x.contiguous()? };
    x.apply_op1_no_bwd(&Pool { max, k, s, p })
}

struct Pool {
    max: bool,
    k: usize,
    s: usize,
    p: usize,
}

impl CustomOp1 for Pool {
    fn name(&self) -> &'static str {
        "pool-nhwc"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("pool-nhwc: CUDA only")
    }

    fn cuda_fwd(&self, x: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let (n, h, w, c) = l.shape().dims4()?;
        let Some(cs) = pixel_stride(l) else {
            candle_core::bail!("pool-nhwc: input must be contiguous or a channel slice");
        };
        if h + 2 * self.p < self.k || w + 2 * self.p < self.k {
            candle_core::bail!("pool-nhwc: {h}x{w} is smaller than the {}x{} window", self.k, self.k);
        }
        let oh = (h + 2 * self.p - self.k) / self.s + 1;
        let ow = (w + 2 * self.p - self.k) / self.s + 1;
        let n_out = n * oh * ow * c;
        if n_out > u32::MAX as usize || n * h * w * cs > u32::MAX as usize {
            candle_core::bail!("pool-nhwc: {:?} is more than one launch indexes", l.shape());
        }
        // 8 channels per thread where the 16-byte loads stay aligned
        let wide = x.dtype() == DType::F16 && c % 8 == 0 && cs % 8 == 0 && l.start_offset().is_multiple_of(8);
        let threads = if wide { n_out / 8 } else { n_out };
        let dims = [threads, h, w, c, cs, oh, ow, self.k, self.s, self.p].map(|v| v as u32);
        let slice = match x.dtype() {
            DType::F16 if wide => CudaStorageSlice::F16(go::<half::f16>(x, l, "pool_nhwc_f16x8", dims, n_out, self.max)?),
            DType::F16 => CudaStorageSlice::F16(go::<half::f16>(x, l, "pool_nhwc_f16", dims, n_out, self.max)?),
            DType::F32 => CudaStorageSlice::F32(go::<f32>(x, l, "pool_nhwc_f32", dims, n_out, self.max)?),
            dt => candle_core::bail!("pool-nhwc: unsupported dtype {dt:?}"),
        };
        Ok((CudaStorage { slice, device: x.device().clone() }, Shape::from((n, oh, ow, c))))
    }
}

fn go<T: DeviceRepr + candle_core::cuda_backend::CudaDType>(
    x: &CudaStorage,
    l: &Layout,
    kernel: &str,
    dims: [u32; 10],
    n_out: usize,
    max: bool,
) -> candle_core::Result<CudaSlice<T>> {
    let dev = x.device();
    let func = dev.get_or_load_custom_func(kernel, MODULE, PTX)?;
    let xv = x.as_cuda_slice::<T>()?.slice(l.start_offset()..);
    let threads = dims[0] as usize;
    // SAFETY: every output element is written by the kernel below.
    let out = unsafe { dev.alloc::<T>(n_out)? };
    let cfg = super::grid(threads, 256);
    let is_max = max as i32;
    let mut builder = func.builder();
    builder.arg(&xv);
    builder.arg(&out);
    for d in &dims {
        builder.arg(d);
    }
    builder.arg(&is_max);
    // SAFETY: argument list matches `kernels/pool.cu`; the input holds (n, h, w) pixels of cs
    // elements from its offset, the output n_out elements (and the wide kernel's alignment was
    // checked by the caller).
    unsafe { builder.launch(cfg) }.w()?;
    Ok(out)
}
