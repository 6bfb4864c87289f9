//! CBFuse on CUDA for channels-last activations (`kernels/fuse.cu`): the sum of the last input
//! and the nearest-upsampled CBLinear slices in one pass per two slices, reading the slices in
//! place (no upsampled copies at full resolution).

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaStorageSlice, WrapErr};
use candle_core::{CpuStorage, CudaStorage, CustomOp2, CustomOp3, DType, InplaceOp2, InplaceOp3, Layout, Shape, Tensor};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/fuse.ptx"));
const MODULE: &str = "yolo_edge_fuse";

/// Where one source element is: strides of the (possibly sliced) source and the upsampling factor.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Src {
    n: u64,
    h: u64,
    w: u64,
    c: u64,
    f: u32,
}

// SAFETY: plain `#[repr(C)]` data, laid out as `struct Src` in `kernels/fuse.cu`.
unsafe impl DeviceRepr for Src {}

/// `base + up(srcs[0]) + up(srcs[1]) + ...` for NHWC `base` `(N, H, W, C)` and sources
/// `(N, H/f, W/f, C)` (any strides, integer factors `f`), on CUDA.
pub fn add_upsampled(base: &Tensor, srcs: &[Tensor]) -> candle_core::Result<Tensor> {
    let base = base.contiguous()?;
    let mut pairs = srcs.chunks(2);
    let acc = match pairs.next() {
        None => return Ok(base),
        Some([a]) => base.apply_op2_no_bwd(a, &Fuse)?,
        Some([a, b]) => base.apply_op3_no_bwd(a, b, &Fuse)?,
        Some(_) => unreachable!("chunks of two"),
    };
    for p in pairs {
        match p {
            [a] => acc.inplace_op2(a, &Fuse)?,
            [a, b] => acc.inplace_op3(a, b, &Fuse)?,
            _ => unreachable!("chunks of two"),
        }
    }
    Ok(acc)
}

struct Fuse;

fn src(out: &Layout, s: &Layout) -> candle_core::Result<Src> {
    let (n, h, w, c) = out.shape().dims4()?;
    let (sn, sh, sw, sc) = s.shape().dims4()?;
    let f = h.checked_div(sh).unwrap_or(0);
    if sn != n || sc != c || f == 0 || sh * f != h || sw * f != w {
        candle_core::bail!("cbfuse: source {:?} is not {:?} downsampled by an integer factor", s.shape(), out.shape());
    }
    let st = s.stride();
    Ok(Src { n: st[0] as u64, h: st[1] as u64, w: st[2] as u64, c: st[3] as u64, f: f as u32 })
}

type Arg<'a> = (&'a CudaStorage, &'a Layout);

/// Launches the kernel: `out = base + up(s0) (+ up(s1))`, `base` laid out by `bl`; `out` is a
/// new buffer, or `base` itself (in place: each element is read and written by one thread).
fn launch<T: DeviceRepr + CudaDType + candle_core::WithDType>(
    dev: &candle_core::CudaDevice,
    base: &CudaSlice<T>,
    bl: &Layout,
    out: &CudaSlice<T>,
    s0: Arg,
    s1: Option<Arg>,
) -> candle_core::Result<()> {
    if !bl.is_contiguous() {
        candle_core::bail!("cbfuse: the accumulator must be contiguous");
    }
    let kernel = if T::DTYPE == DType::F16 { "fuse_f16" } else { "fuse_f32" };
    let func = dev.get_or_load_custom_func(kernel, MODULE, PTX)?;
    let (_, h, w, c) = bl.shape().dims4()?;
    let total = bl.shape().elem_count();
    let bv = base.slice(bl.start_offset()..);
    let d0 = src(bl, s0.1)?;
    let v0 = s0.0.as_cuda_slice::<T>()?.slice(s0.1.start_offset()..);
    // without a second source the kernel never reads it; the first stands in
    let (d1, v1) = match s1 {
        Some((s, l)) => (src(bl, l)?, s.as_cuda_slice::<T>()?.slice(l.start_offset()..)),
        None => (d0, s0.0.as_cuda_slice::<T>()?.slice(s0.1.start_offset()..)),
    };
    let (two, total64) = (s1.is_some() as i32, total as u64);
    let (h, w, c) = (h as u32, w as u32, c as u32);
    let mut builder = func.builder();
    builder.arg(&bv);
    builder.arg(out);
    builder.arg(&v0);
    builder.arg(&d0);
    builder.arg(&v1);
    builder.arg(&d1);
    builder.arg(&two);
    builder.arg(&total64);
    builder.arg(&h);
    builder.arg(&w);
    builder.arg(&c);
    // SAFETY: argument list matches `kernels/fuse.cu`; `out` holds `total` elements; every
    // source index is inside its slice (checked shapes: the source is the output downsampled by
    // f in H and W).
    unsafe { builder.launch(super::grid(total, 256)) }.w()?;
    Ok(())
}

fn fresh_t<T: DeviceRepr + CudaDType + candle_core::WithDType>(base: Arg, s0: Arg, s1: Option<Arg>) -> candle_core::Result<CudaSlice<T>> {
    let dev = base.0.device();
    // SAFETY: every element is written by the kernel.
    let out = unsafe { dev.alloc::<T>(base.1.shape().elem_count())? };
    launch::<T>(dev, base.0.as_cuda_slice()?, base.1, &out, s0, s1)?;
    Ok(out)
}

fn fresh(base: Arg, s0: Arg, s1: Option<Arg>) -> candle_core::Result<(CudaStorage, Shape)> {
    let slice = match base.0.dtype() {
        DType::F16 => CudaStorageSlice::F16(fresh_t::<half::f16>(base, s0, s1)?),
        DType::F32 => CudaStorageSlice::F32(fresh_t::<f32>(base, s0, s1)?),
        dt => candle_core::bail!("cbfuse: unsupported dtype {dt:?}"),
    };
    Ok((CudaStorage { slice, device: base.0.device().clone() }, base.1.shape().clone()))
}

fn in_place(acc: &mut CudaStorage, al: &Layout, s0: Arg, s1: Option<Arg>) -> candle_core::Result<()> {
    if al.start_offset() != 0 {
        candle_core::bail!("cbfuse: the accumulator must start at its buffer's start");
    }
    let dev = acc.device().clone();
    match acc.dtype() {
        DType::F16 => {
            let a = acc.as_cuda_slice::<half::f16>()?;
            launch::<half::f16>(&dev, a, al, a, s0, s1)
        }
        DType::F32 => {
            let a = acc.as_cuda_slice::<f32>()?;
            launch::<f32>(&dev, a, al, a, s0, s1)
        }
        dt => candle_core::bail!("cbfuse: unsupported dtype {dt:?}"),
    }
}

impl CustomOp2 for Fuse {
    fn name(&self) -> &'static str {
        "cbfuse"
    }
    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("cbfuse: CUDA only")
    }
    fn cuda_fwd(&self, b: &CudaStorage, bl: &Layout, s: &CudaStorage, sl: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        fresh((b, bl), (s, sl), None)
    }
}

impl CustomOp3 for Fuse {
    fn name(&self) -> &'static str {
        "cbfuse"
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
        candle_core::bail!("cbfuse: CUDA only")
    }
    fn cuda_fwd(
        &self,
        b: &CudaStorage,
        bl: &Layout,
        s0: &CudaStorage,
        l0: &Layout,
        s1: &CudaStorage,
        l1: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        fresh((b, bl), (s0, l0), Some((s1, l1)))
    }
}

impl InplaceOp2 for Fuse {
    fn name(&self) -> &'static str {
        "cbfuse-in-place"
    }
    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("cbfuse: CUDA only")
    }
    fn cuda_fwd(&self, a: &mut CudaStorage, al: &Layout, s: &CudaStorage, sl: &Layout) -> candle_core::Result<()> {
        in_place(a, al, (s, sl), None)
    }
}

impl InplaceOp3 for Fuse {
    fn name(&self) -> &'static str {
        "cbfuse-in-place"
    }
    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("cbfuse: CUDA only")
    }
    fn cuda_fwd(
        &self,
        a: &mut CudaStorage,
        al: &Layout,
        s0: &CudaStorage,
        l0: &Layout,
        s1: &CudaStorage,
        l1: &Layout,
    ) -> candle_core::Result<()> {
        in_place(a, al, (s0, l0), Some((s1, l1)))
    }
}
