//! The head's decode on CUDA in one kernel per level (`kernels/head.cu`): the branches' last
//! biases, DFL softmax and expectation, anchor decode to xywh pixels and class sigmoids, straight
//! from the channels-last branch outputs into the reference's raw output, each level into its own
//! anchors of one buffer.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaViewMut, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CpuStorage, CudaStorage, DType, InplaceOp3, Layout, Storage, Tensor};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/head.ptx"));
const MODULE: &str = "yolo_edge_head";

/// Writes one level's anchors `offset..offset + H*W` of the raw output `out` `(B, 4 + nc, A)`
/// from its box branch `(B, H, W, 4 * reg_max)` and class branch `(B, H, W, nc)` (NHWC, CUDA),
/// each without its last bias, and those biases (`4 * reg_max` and `nc` f32), with the DFL
/// weights `proj` (`reg_max` f32) and the level's `stride` in input pixels.
pub fn decode_level(
    out: &Tensor,
    offset: usize,
    (boxes, box_bias): (&Tensor, &Tensor),
    (classes, class_bias): (&Tensor, &Tensor),
    proj: &Tensor,
    stride: f32,
) -> candle_core::Result<()> {
    let op = Decode { proj: proj.contiguous()?, box_bias: box_bias.contiguous()?, class_bias: class_bias.contiguous()?, stride, offset };
    out.inplace_op3(&boxes.contiguous()?, &classes.contiguous()?, &op)
}

struct Decode {
    proj: Tensor,
    box_bias: Tensor,
    class_bias: Tensor,
    stride: f32,
    offset: usize,
}

impl InplaceOp3 for Decode {
    fn name(&self) -> &'static str {
        "dfl-decode"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("dfl-decode: CUDA only")
    }

    fn cuda_fwd(
        &self,
        out: &mut CudaStorage,
        ol: &Layout,
        bx: &CudaStorage,
        bl: &Layout,
        cl: &CudaStorage,
        cll: &Layout,
    ) -> candle_core::Result<()> {
        let (on, rows, total) = ol.shape().dims3()?;
        let (guard, pl) = self.proj.storage_and_layout();
        let Storage::Cuda(pj) = &*guard else { candle_core::bail!("dfl-decode: DFL weights not on the GPU") };
        let dims = check((bx, bl), (cl, cll), (pj, pl), total, self.offset)?;
        let [n, _, _, nc, reg] = dims;
        let (bb_guard, bbl) = self.box_bias.storage_and_layout();
        let (cb_guard, cbl) = self.class_bias.storage_and_layout();
        let (Storage::Cuda(bb), Storage::Cuda(cb)) = (&*bb_guard, &*cb_guard) else {
            candle_core::bail!("dfl-decode: biases not on the GPU")
        };
        let f32_of = |(s, l): Arg, len: u32| s.dtype() == DType::F32 && l.is_contiguous() && l.shape().elem_count() == len as usize;
        if !f32_of((bb, bbl), 4 * reg) || !f32_of((cb, cbl), nc) {
            candle_core::bail!(
                "dfl-decode: biases {:?} and {:?} for {} box and {nc} class channels (f32)",
                bbl.shape(),
                cbl.shape(),
                4 * reg
            );
        }
        let biases = [(bb, bbl), (cb, cbl)];
        if (on, rows) != (n as usize, 4 + nc as usize) || !ol.is_contiguous() || out.dtype() != bx.dtype() {
            candle_core::bail!("dfl-decode: {n} pictures of {} rows into {:?}", 4 + nc, ol.shape());
        }
        let at = (total, self.offset);
        match bx.dtype() {
            DType::F16 => {
                let mut o = out.as_cuda_slice_mut::<half::f16>()?.slice_mut(ol.start_offset()..);
                go::<half::f16>((bx, bl), (cl, cll), (pj, pl), biases, &mut o, "decode_f16", dims, self.stride, at)
            }
            DType::F32 => {
                let mut o = out.as_cuda_slice_mut::<f32>()?.slice_mut(ol.start_offset()..);
                go::<f32>((bx, bl), (cl, cll), (pj, pl), biases, &mut o, "decode_f32", dims, self.stride, at)
            }
            dt => candle_core::bail!("dfl-decode: unsupported dtype {dt:?}"),
        }
    }
}

/// `[n, h, w, nc, reg]` of one level's branches, checked against each other, the DFL weights and
/// the anchors `offset..offset + h*w` of an output of `total` anchors.
fn check((bx, bl): Arg, (cl, cll): Arg, (pj, pl): Arg, total: usize, offset: usize) -> candle_core::Result<[u32; 5]> {
    let (n, h, w, r4) = bl.shape().dims4()?;
    let (cn, ch, cw, nc) = cll.shape().dims4()?;
    let reg = pl.shape().elem_count();
    if (cn, ch, cw) != (n, h, w) || r4 != 4 * reg || reg == 0 || nc == 0 {
        candle_core::bail!("dfl-decode: boxes {:?}, classes {:?} and {reg} DFL weights do not fit", bl.shape(), cll.shape());
    }
    if !bl.is_contiguous() || !cll.is_contiguous() || !pl.is_contiguous() || pj.dtype() != DType::F32 || bx.dtype() != cl.dtype() {
        candle_core::bail!("dfl-decode: contiguous boxes and classes of one dtype and f32 DFL weights expected");
    }
    if offset + h * w > total {
        candle_core::bail!("dfl-decode: {} anchors at {offset} of {total}", h * w);
    }
    if n * h * w * (4 + nc).max(r4) > u32::MAX as usize || n * (4 + nc) * total > u32::MAX as usize {
        candle_core::bail!("dfl-decode: {n} pictures of {h}x{w} is more than one launch indexes");
    }
    Ok([n, h, w, nc, reg].map(|v| v as u32))
}

type Arg<'a> = (&'a CudaStorage, &'a Layout);

#[allow(clippy::too_many_arguments)]
fn go<T: DeviceRepr + candle_core::cuda_backend::CudaDType>(
    (bx, bl): Arg,
    (cl, cll): Arg,
    (pj, pl): Arg,
    [(bb, bbl), (cb, cbl)]: [Arg; 2],
    out: &mut CudaViewMut<T>,
    kernel: &str,
    dims: [u32; 5],
    stride: f32,
    (total, offset): (usize, usize),
) -> candle_core::Result<()> {
    let dev = bx.device();
    let func = dev.get_or_load_custom_func(kernel, MODULE, PTX)?;
    let bv = bx.as_cuda_slice::<T>()?.slice(bl.start_offset()..);
    let cv = cl.as_cuda_slice::<T>()?.slice(cll.start_offset()..);
    let pv = pj.as_cuda_slice::<f32>()?.slice(pl.start_offset()..);
    let bbv = bb.as_cuda_slice::<f32>()?.slice(bbl.start_offset()..);
    let cbv = cb.as_cuda_slice::<f32>()?.slice(cbl.start_offset()..);
    let [n, h, w, _, _] = dims;
    let anchors = (n * h * w) as usize;
    let cfg = super::grid(anchors, 128);
    let (total, offset) = (total as u32, offset as u32);
    let mut builder = func.builder();
    builder.arg(&bv);
    builder.arg(&cv);
    builder.arg(&pv);
    builder.arg(&bbv);
    builder.arg(&cbv);
    builder.arg(out);
    for d in &dims {
        builder.arg(d);
    }
    builder.arg(&stride);
    builder.arg(&total);
    builder.arg(&offset);
    // SAFETY: argument list matches `kernels/head.cu`; shapes checked by `check` and the biases'
    // lengths (4 * reg, nc) by `Decode::cuda_fwd`: the kernel writes anchors `offset..offset + h*w` of
    // each of the `n` pictures' `4 + nc` rows of `total`.
    unsafe { builder.launch(cfg) }.w()?;
    Ok(())
}
