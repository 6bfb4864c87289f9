//! Data movement on channels-last `(N, H, W, C)` activations on CUDA in 16-byte units
//! (`kernels/nhwc.cu`): a channel slice made contiguous, tensors written into the channels of a
//! wider one (concatenation), nearest-neighbour upsampling, and the NCHW network input laid out
//! channels last. candle moves these one element per thread through its generic strided copy,
//! with index arithmetic per element; in the profile of a yolov9t pass at batch 32 on an H200
//! those copies were a fifth of the device time (BENCHMARKS.md, "Concatenations in place").
//!
//! Each function answers `None` where its kernel does not apply (not CUDA, a dtype other than f16
//! and f32, channels or offsets not in whole 16-byte units, a source that is not one row of
//! channels per pixel); the caller then takes candle's way.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaViewMut, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaStorageSlice, WrapErr};
use candle_core::{CpuStorage, CudaDevice, CudaStorage, CustomOp1, DType, InplaceOp2, Layout, Shape, Tensor};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/nhwc.ptx"));
const MODULE: &str = "yolo_edge_nhwc";

/// Bytes per unit of the 16-byte kernels.
const UNIT: usize = 16;

/// Elements per 16-byte unit of `dtype`, for the dtypes the kernels serve.
fn per_unit(dtype: DType) -> Option<usize> {
    match dtype {
        DType::F16 => Some(UNIT / 2),
        DType::F32 => Some(UNIT / 4),
        _ => None,
    }
}

/// The pixel stride `cs` of an NHWC tensor whose pixels each hold one row of channels at a fixed
/// distance from the last: contiguous, or a channel slice of a wider tensor (strides
/// `[h*w*cs, w*cs, cs, 1]`).
pub(super) fn pixel_stride(l: &Layout) -> Option<usize> {
    let (_, h, w, _) = l.shape().dims4().ok()?;
    let st = l.stride();
    let cs = st[2];
    (st[3] == 1 && st[1] == w * cs && st[0] == h * w * cs).then_some(cs)
}

/// Whether `x`'s rows of channels move in whole, aligned 16-byte units: its channels, its pixel
/// stride and its first element's offset are multiples of a unit.
fn moves_in_units(x: &Tensor) -> bool {
    let (Ok((_, _, _, c)), Some(per)) = (x.dims4(), per_unit(x.dtype())) else { return false };
    x.device().is_cuda()
        && pixel_stride(x.layout()).is_some_and(|cs| cs % per == 0)
        && c % per == 0
        && c > 0
        && x.layout().start_offset().is_multiple_of(per)
}

/// `x` (a channel slice, say) as a contiguous tensor.
pub fn contiguous(x: &Tensor) -> Option<candle_core::Result<Tensor>> {
    if x.is_contiguous() || !moves_in_units(x) {
        return None;
    }
    Some(gather(x.dims(), &[x]))
}

/// The concatenation of NHWC `xs` along the channels (each contiguous or a channel slice, read in
/// place).
pub fn cat_c(xs: &[&Tensor]) -> Option<candle_core::Result<Tensor>> {
    let first = xs.first()?;
    let (n, h, w, _) = first.dims4().ok()?;
    let fits =
        |x: &&Tensor| moves_in_units(x) && x.dims4().is_ok_and(|(xn, xh, xw, _)| (xn, xh, xw) == (n, h, w)) && x.dtype() == first.dtype();
    if !xs.iter().all(fits) {
        return None;
    }
    let width: usize = xs.iter().map(|x| x.dim(3).unwrap_or(0)).sum();
    Some(gather(&[n, h, w, width], xs))
}

/// A new `dims` buffer holding `xs` side by side along the channels, which they fill.
fn gather(dims: &[usize], xs: &[&Tensor]) -> candle_core::Result<Tensor> {
    let first = xs.first().ok_or_else(|| candle_core::Error::Msg("nhwc: nothing to gather".into()))?;
    // SAFETY: the copies below write every channel of every pixel (the callers' `xs` are as wide
    // as `dims` together, same pixels) before the buffer is returned; an error drops it unread.
    let buf = unsafe { Tensor::empty(dims, first.dtype(), first.device())? };
    let mut offset = 0;
    for x in xs {
        buf.inplace_op2(x, &Into { offset })?;
        offset += x.dim(3)?;
    }
    Ok(buf)
}

/// `src` written into channels `offset..offset + C` of `buf` `(N, H, W, width)` (contiguous).
pub fn copy_into(buf: &Tensor, offset: usize, src: &Tensor) -> Option<candle_core::Result<()>> {
    let (bn, bh, bw, width) = buf.dims4().ok()?;
    let (n, h, w, c) = src.dims4().ok()?;
    let per = per_unit(buf.dtype())?;
    let fits = (bn, bh, bw) == (n, h, w)
        && offset + c <= width
        && buf.is_contiguous()
        && buf.dtype() == src.dtype()
        && (offset % per, width % per, buf.layout().start_offset() % per) == (0, 0, 0)
        && moves_in_units(src);
    fits.then(|| buf.inplace_op2(src, &Into { offset }))
}

/// Nearest-neighbour upsampling of NHWC `x` by integer factors `fh x fw`.
pub fn upsample(x: &Tensor, fh: usize, fw: usize) -> Option<candle_core::Result<Tensor>> {
    if fh == 0 || fw == 0 || !moves_in_units(x) {
        return None;
    }
    Some(x.apply_op1_no_bwd(&Upsample { fh, fw }))
}

/// The NCHW network input `x` `(N, C, H, W)` laid out as `(N, H, W, C)`.
pub fn from_nchw(x: &Tensor) -> Option<candle_core::Result<Tensor>> {
    if !x.device().is_cuda() || per_unit(x.dtype()).is_none() || x.dims4().is_err() {
        return None;
    }
    Some(x.contiguous().and_then(|x| x.apply_op1_no_bwd(&ToNhwc)))
}

/// The source written into channels `offset..` of the destination buffer, in place.
struct Into {
    offset: usize,
}

impl InplaceOp2 for Into {
    fn name(&self) -> &'static str {
        "nhwc-copy-into"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("nhwc-copy-into: CUDA only")
    }

    fn cuda_fwd(&self, buf: &mut CudaStorage, bl: &Layout, x: &CudaStorage, l: &Layout) -> candle_core::Result<()> {
        let (_, _, _, width) = bl.shape().dims4()?;
        let aligned = per_unit(buf.dtype()).is_some_and(|per| bl.start_offset().is_multiple_of(per));
        if !bl.is_contiguous() || !aligned || l.shape().dims()[..3] != bl.shape().dims()[..3] {
            candle_core::bail!("nhwc-copy-into: {:?} into {:?} (contiguous, 16-byte aligned)", l.shape(), bl.shape());
        }
        let dev = x.device().clone();
        match (buf.dtype(), x.dtype()) {
            (DType::F16, DType::F16) => {
                let mut out = buf.as_cuda_slice_mut::<half::f16>()?.slice_mut(bl.start_offset()..);
                copy_rows::<half::f16>(&dev, (x, l), &mut out, self.offset, width)
            }
            (DType::F32, DType::F32) => {
                let mut out = buf.as_cuda_slice_mut::<f32>()?.slice_mut(bl.start_offset()..);
                copy_rows::<f32>(&dev, (x, l), &mut out, self.offset, width)
            }
            (b, s) => candle_core::bail!("nhwc-copy-into: {s:?} into {b:?}"),
        }
    }
}

type Arg<'a> = (&'a CudaStorage, &'a Layout);

/// `copy_rows_x16`: every pixel's channels of `x` (NHWC, one row per pixel) into channels
/// `offset..offset + C` of the rows of `width` channels of `out`.
fn copy_rows<T: DeviceRepr + CudaDType>(
    dev: &CudaDevice,
    (x, l): Arg,
    out: &mut CudaViewMut<T>,
    offset: usize,
    width: usize,
) -> candle_core::Result<()> {
    let (n, h, w, c) = l.shape().dims4()?;
    let per = UNIT / std::mem::size_of::<T>();
    let Some(cs) = pixel_stride(l) else { candle_core::bail!("nhwc copy: source {:?} is not one row per pixel", l.shape()) };
    if [c, cs, l.start_offset(), offset, width].iter().any(|v| v % per != 0) {
        candle_core::bail!("nhwc copy: channels, strides or offsets not in 16-byte units");
    }
    let rows = n * h * w;
    let units = c / per;
    if rows.checked_mul(units).is_none_or(|t| t > u32::MAX as usize) || (rows * cs / per) > u32::MAX as usize {
        candle_core::bail!("nhwc copy: {:?} is more than one launch indexes", l.shape());
    }
    let needed_src = if rows == 0 { 0 } else { (rows - 1) * cs + c };
    let needed_dst = if rows == 0 { 0 } else { (rows - 1) * width + offset + c };
    let src = x.as_cuda_slice::<T>()?.slice(l.start_offset()..);
    if src.len() < needed_src || out.len() < needed_dst {
        candle_core::bail!("nhwc copy: {rows} rows of {c} do not fit the buffers");
    }
    if rows == 0 || units == 0 {
        return Ok(());
    }
    let func = dev.get_or_load_custom_func("copy_rows_x16", MODULE, PTX)?;
    let mut dst = out.slice_mut(offset..);
    let cfg = super::grid(rows * units, 256);
    let (rows32, units32, src_stride, dst_stride) = (rows as u32, units as u32, (cs / per) as u32, (width / per) as u32);
    let mut builder = func.builder();
    builder.arg(&src);
    builder.arg(&mut dst);
    builder.arg(&rows32);
    builder.arg(&units32);
    builder.arg(&src_stride);
    builder.arg(&dst_stride);
    // SAFETY: argument list matches `copy_rows_x16` in `kernels/nhwc.cu`. Both views start
    // 16-byte aligned (their allocations are, and their offsets are whole units, checked above);
    // the kernel reads `units` units at `p * src_stride` and writes them at `p * dst_stride`
    // for `p < rows`, inside the lengths checked above.
    unsafe { builder.launch(cfg) }.w()?;
    Ok(())
}

struct Upsample {
    fh: usize,
    fw: usize,
}

impl CustomOp1 for Upsample {
    fn name(&self) -> &'static str {
        "nhwc-upsample"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("nhwc-upsample: CUDA only")
    }

    fn cuda_fwd(&self, x: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let (n, h, w, c) = l.shape().dims4()?;
        if !l.is_contiguous() {
            // a channel slice is made contiguous by the caller's `contiguous` first
            candle_core::bail!("nhwc-upsample: contiguous input expected");
        }
        let (oh, ow) = (h * self.fh, w * self.fw);
        let dev = x.device().clone();
        let slice = match x.dtype() {
            DType::F16 => CudaStorageSlice::F16(upsample_go::<half::f16>(&dev, (x, l), (n, h, w, c), (self.fh, self.fw))?),
            DType::F32 => CudaStorageSlice::F32(upsample_go::<f32>(&dev, (x, l), (n, h, w, c), (self.fh, self.fw))?),
            dt => candle_core::bail!("nhwc-upsample: unsupported dtype {dt:?}"),
        };
        Ok((CudaStorage { slice, device: dev }, Shape::from((n, oh, ow, c))))
    }
}

fn upsample_go<T: DeviceRepr + CudaDType>(
    dev: &CudaDevice,
    (x, l): Arg,
    (n, h, w, c): (usize, usize, usize, usize),
    (fh, fw): (usize, usize),
) -> candle_core::Result<CudaSlice<T>> {
    let per = UNIT / std::mem::size_of::<T>();
    if c % per != 0 || l.start_offset() % per != 0 {
        candle_core::bail!("nhwc-upsample: channels or offset not in 16-byte units");
    }
    let units = c / per;
    let out_elems = n * h * fh * w * fw * c;
    if (out_elems / per) > u32::MAX as usize {
        candle_core::bail!("nhwc-upsample: {:?} by {fh}x{fw} is more than one launch indexes", l.shape());
    }
    let src = x.as_cuda_slice::<T>()?.slice(l.start_offset()..);
    if src.len() < n * h * w * c {
        candle_core::bail!("nhwc-upsample: the input holds fewer elements than {:?}", l.shape());
    }
    // SAFETY: every element is written by the kernel below.
    let out = unsafe { dev.alloc::<T>(out_elems)? };
    if out_elems == 0 {
        return Ok(out);
    }
    let func = dev.get_or_load_custom_func("upsample_x16", MODULE, PTX)?;
    let cfg = super::grid(out_elems / per, 256);
    let dims = [n, h, w, fh, fw, units].map(|v| v as u32);
    let mut builder = func.builder();
    builder.arg(&src);
    builder.arg(&out);
    for d in &dims {
        builder.arg(d);
    }
    // SAFETY: argument list matches `upsample_x16` in `kernels/nhwc.cu`; the input holds
    // `n*h*w` pixels of `units` 16-byte units from an aligned start (checked above), the output
    // `n*h*fh*w*fw` of them.
    unsafe { builder.launch(cfg) }.w()?;
    Ok(out)
}

struct ToNhwc;

impl CustomOp1 for ToNhwc {
    fn name(&self) -> &'static str {
        "nchw-to-nhwc"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("nchw-to-nhwc: CUDA only")
    }

    fn cuda_fwd(&self, x: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let (n, c, h, w) = l.shape().dims4()?;
        if !l.is_contiguous() {
            candle_core::bail!("nchw-to-nhwc: contiguous input expected");
        }
        if n * c * h * w > u32::MAX as usize {
            candle_core::bail!("nchw-to-nhwc: {:?} is more than one launch indexes", l.shape());
        }
        let dev = x.device().clone();
        let slice = match x.dtype() {
            DType::F16 => CudaStorageSlice::F16(to_nhwc_go::<half::f16>(&dev, (x, l), "to_nhwc_f16")?),
            DType::F32 => CudaStorageSlice::F32(to_nhwc_go::<f32>(&dev, (x, l), "to_nhwc_f32")?),
            dt => candle_core::bail!("nchw-to-nhwc: unsupported dtype {dt:?}"),
        };
        Ok((CudaStorage { slice, device: dev }, Shape::from((n, h, w, c))))
    }
}

fn to_nhwc_go<T: DeviceRepr + CudaDType>(dev: &CudaDevice, (x, l): Arg, kernel: &str) -> candle_core::Result<CudaSlice<T>> {
    let (n, c, h, w) = l.shape().dims4()?;
    let elems = n * c * h * w;
    let src = x.as_cuda_slice::<T>()?.slice(l.start_offset()..);
    if src.len() < elems {
        candle_core::bail!("nchw-to-nhwc: the input holds fewer elements than {:?}", l.shape());
    }
    // SAFETY: every element (C per pixel) is written by the kernel below.
    let out = unsafe { dev.alloc::<T>(elems)? };
    if elems == 0 {
        return Ok(out);
    }
    let func = dev.get_or_load_custom_func(kernel, MODULE, PTX)?;
    let pixels = n * h * w;
    let cfg = super::grid(pixels, 256);
    let (pixels, hw, c) = (pixels as u32, (h * w) as u32, c as u32);
    let mut builder = func.builder();
    builder.arg(&src);
    builder.arg(&out);
    builder.arg(&pixels);
    builder.arg(&hw);
    builder.arg(&c);
    // SAFETY: argument list matches `to_nhwc_*` in `kernels/nhwc.cu`; input and output hold
    // `n*c*h*w` elements (checked above).
    unsafe { builder.launch(cfg) }.w()?;
    Ok(out)
}
