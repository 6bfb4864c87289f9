//! The network input on CUDA in one kernel: uploaded u8 pictures `(B, H, W, 3)` become the
//! normalised input, `(B, 3, H, W)` for an NCHW model or `(B, H, W, 3)` for a channels-last one
//! (`kernels/input.cu`).
//!
//! candle's chain for the same (`to_dtype`, `permute` + `contiguous`, `/ 255`) is three launches
//! and leaves three full-size tensors in the pool per batch, freed in an order that fragments it;
//! this is one launch and one tensor.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};
use candle_core::{CpuStorage, CudaStorage, CustomOp1, DType, Layout, Shape, Tensor};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/input.ptx"));
const MODULE: &str = "yolo_edge_input";

/// `x / 255` as `dtype` (f16 or f32) for NHWC u8 `x` on a CUDA device: NCHW, or NHWC with
/// `channels_last`.
pub fn normalize(x: &Tensor, dtype: DType, channels_last: bool) -> candle_core::Result<Tensor> {
    x.contiguous()?.apply_op1_no_bwd(&Normalize { dtype, channels_last })
}

struct Normalize {
    dtype: DType,
    channels_last: bool,
}

impl CustomOp1 for Normalize {
    fn name(&self) -> &'static str {
        "normalize-input"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("normalize-input: CUDA only")
    }

    fn cuda_fwd(&self, x: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let (b, h, w, c) = l.shape().dims4()?;
        if c != 3 || !l.is_contiguous() {
            candle_core::bail!("normalize-input: expected contiguous (B, H, W, 3) pictures, got {:?}", l.shape());
        }
        let pixels = b * h * w;
        if pixels * 3 > u32::MAX as usize {
            candle_core::bail!("normalize-input: {b} pictures of {h}x{w} is more than one launch indexes");
        }
        let cl = self.channels_last;
        let slice = match self.dtype {
            DType::F16 => CudaStorageSlice::F16(go::<half::f16>(x, l, "f16", cl, pixels, h * w)?),
            DType::F32 => CudaStorageSlice::F32(go::<f32>(x, l, "f32", cl, pixels, h * w)?),
            dt => candle_core::bail!("normalize-input: unsupported dtype {dt:?}"),
        };
        let shape = if cl { Shape::from((b, h, w, 3)) } else { Shape::from((b, 3, h, w)) };
        Ok((CudaStorage { slice, device: x.device().clone() }, shape))
    }
}

fn go<T: DeviceRepr>(
    x: &CudaStorage,
    l: &Layout,
    dtype: &str,
    channels_last: bool,
    pixels: usize,
    hw: usize,
) -> candle_core::Result<candle_core::cuda_backend::cudarc::driver::CudaSlice<T>> {
    let dev = x.device();
    let kernel = if channels_last { format!("normalize_cl_{dtype}") } else { format!("normalize_{dtype}") };
    let func = dev.get_or_load_custom_func(&kernel, MODULE, PTX)?;
    let xv = x.as_cuda_slice::<u8>()?.slice(l.start_offset()..);
    // SAFETY: every element (3 per pixel) is written by the kernel below.
    let out = unsafe { dev.alloc::<T>(pixels * 3)? };
    let mut builder = func.builder();
    builder.arg(&xv);
    // the NCHW kernel takes a thread per pixel, the channels-last one a thread per element
    let (cfg, units, hw) = if channels_last {
        (super::grid(pixels * 3, 256), (pixels * 3) as u32, None)
    } else {
        (super::grid(pixels, 256), pixels as u32, Some(hw as u32))
    };
    builder.arg(&units);
    if let Some(hw) = &hw {
        builder.arg(hw);
    }
    builder.arg(&out);
    // SAFETY: argument list matches `kernels/input.cu`; the input holds 3 bytes per pixel from its
    // offset (contiguous), the output 3 elements per pixel.
    unsafe { builder.launch(cfg) }.w()?;
    Ok(out)
}
