//! The head's decode on CUDA in one kernel per level (`kernels/head.cu`): DFL softmax and
//! expectation, anchor decode to xywh pixels and class sigmoids, straight from the channels-last
//! branch outputs to the reference's raw output layout.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};
use candle_core::{CpuStorage, CudaStorage, CustomOp3, DType, Layout, Shape, Tensor};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/head.ptx"));
const MODULE: &str = "yolo_edge_head";

/// Raw output `(B, 4 + nc, H*W)` of one level from its box branch `(B, H, W, 4 * reg_max)` and
/// class branch `(B, H, W, nc)` (NHWC, CUDA), with the DFL weights `proj` (`reg_max` f32) and
/// the level's `stride` in input pixels.
pub fn decode_level(boxes: &Tensor, classes: &Tensor, proj: &Tensor, stride: f32) -> candle_core::Result<Tensor> {
    boxes.contiguous()?.apply_op3_no_bwd(&classes.contiguous()?, &proj.contiguous()?, &Decode { stride })
}

struct Decode {
    stride: f32,
}

impl CustomOp3 for Decode {
    fn name(&self) -> &'static str {
        "dfl-decode"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("dfl-decode: CUDA only")
    }

    fn cuda_fwd(
        &self,
        bx: &CudaStorage,
        bl: &Layout,
        cl: &CudaStorage,
        cll: &Layout,
        pj: &CudaStorage,
        pl: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let (n, h, w, r4) = bl.shape().dims4()?;
        let (cn, ch, cw, nc) = cll.shape().dims4()?;
        let reg = pl.shape().elem_count();
        if (cn, ch, cw) != (n, h, w) || r4 != 4 * reg || reg == 0 || nc == 0 {
            candle_core::bail!("dfl-decode: boxes {:?}, classes {:?} and {reg} DFL weights do not fit", bl.shape(), cll.shape());
        }
        if !bl.is_contiguous() || !cll.is_contiguous() || !pl.is_contiguous() || pj.dtype() != DType::F32 || bx.dtype() != cl.dtype() {
            candle_core::bail!("dfl-decode: contiguous boxes and classes of one dtype and f32 DFL weights expected");
        }
        if n * h * w * (4 + nc).max(r4) > u32::MAX as usize {
            candle_core::bail!("dfl-decode: {n} pictures of {h}x{w} is more than one launch indexes");
        }
        let dims = [n, h, w, nc, reg].map(|v| v as u32);
        let slice = match bx.dtype() {
            DType::F16 => CudaStorageSlice::F16(go::<half::f16>((bx, bl), (cl, cll), (pj, pl), "decode_f16", dims, self.stride)?),
            DType::F32 => CudaStorageSlice::F32(go::<f32>((bx, bl), (cl, cll), (pj, pl), "decode_f32", dims, self.stride)?),
            dt => candle_core::bail!("dfl-decode: unsupported dtype {dt:?}"),
        };
        Ok((CudaStorage { slice, device: bx.device().clone() }, Shape::from((n, 4 + nc, h * w))))
    }
}

type Arg<'a> = (&'a CudaStorage, &'a Layout);

fn go<T: DeviceRepr + candle_core::cuda_backend::CudaDType>(
    (bx, bl): Arg,
    (cl, cll): Arg,
    (pj, pl): Arg,
    kernel: &str,
    dims: [u32; 5],
    stride: f32,
) -> candle_core::Result<CudaSlice<T>> {
    let dev = bx.device();
    let func = dev.get_or_load_custom_func(kernel, MODULE, PTX)?;
    let bv = bx.as_cuda_slice::<T>()?.slice(bl.start_offset()..);
    let cv = cl.as_cuda_slice::<T>()?.slice(cll.start_offset()..);
    let pv = pj.as_cuda_slice::<f32>()?.slice(pl.start_offset()..);
    let [n, h, w, nc, _] = dims;
    let anchors = (n * h * w) as usize;
    // SAFETY: every element (4 + nc per anchor) is written by the kernel below.
    let out = unsafe { dev.alloc::<T>(anchors * (4 + nc as usize))? };
    let cfg = super::grid(anchors, 128);
    let mut builder = func.builder();
    builder.arg(&bv);
    builder.arg(&cv);
    builder.arg(&pv);
    builder.arg(&out);
    for d in &dims {
        builder.arg(d);
    }
    builder.arg(&stride);
    // SAFETY: argument list matches `kernels/head.cu`; shapes checked by the caller.
    unsafe { builder.launch(cfg) }.w()?;
    Ok(out)
}
