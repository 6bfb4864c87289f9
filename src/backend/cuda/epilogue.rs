//! The convolution epilogue on CUDA as one kernel: `act(y + bias) (+ residual)`.
//!
//! candle spends three kernels and three passes over the activations on it (broadcast add,
//! SiLU, residual add), which a profile measured at 18-24 % of yolov9-t's time at batch 32.
//! Here it is one pass (`kernels/epilogue.cu`, f32 arithmetic, rounded once), as a candle custom
//! op so that it allocates from candle's pool like everything else.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaViewMut, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CpuStorage, CudaStorage, CustomOp2, CustomOp3, DType, InplaceOp3, Layout, Shape, Tensor};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/epilogue.ptx"));
const MODULE: &str = "yolo_edge_epilogue";

/// `act(y + bias[c]) (+ residual)` for `y` on a CUDA device (f16 or f32), NCHW or, with
/// `channels_last`, NHWC.
pub fn bias_act(y: &Tensor, bias: &Tensor, act: bool, residual: Option<&Tensor>, channels_last: bool) -> candle_core::Result<Tensor> {
    let y = y.contiguous()?;
    let bias = bias.contiguous()?;
    match residual {
        None => y.apply_op2_no_bwd(&bias, &BiasAct { act, channels_last }),
        Some(r) => {
            let r = r.contiguous()?;
            if r.dims() != y.dims() || r.dtype() != y.dtype() {
                candle_core::bail!("epilogue: residual {:?} {:?} does not match {:?} {:?}", r.dims(), r.dtype(), y.dims(), y.dtype());
            }
            y.apply_op3_no_bwd(&bias, &r, &BiasAct { act, channels_last })
        }
    }
}

/// `act(y + bias[c])` for NHWC `y` `(N, H, W, C)` as channels `offset..offset + C` of a new
/// `(N, H, W, width)` buffer whose other channels are left for [`bias_act_into`] (or a copy) to
/// fill: one input of a channel concatenation, written where the concatenation needs it.
/// Reading a channel before it is written reads whatever the memory held.
pub fn bias_act_wide(y: &Tensor, bias: &Tensor, act: bool, width: usize, offset: usize) -> candle_core::Result<Tensor> {
    let (n, h, w, c) = y.dims4()?;
    if offset + c > width {
        candle_core::bail!("epilogue: {c} channels at {offset} into a buffer of {width}");
    }
    if !into_kernel_fits(y, c, offset, width) {
        let buf = Tensor::zeros((n, h, w, width), y.dtype(), y.device())?;
        buf.slice_set(&bias_act(y, bias, act, None, true)?, 3, offset)?;
        return Ok(buf);
    }
    y.contiguous()?.apply_op2_no_bwd(&bias.contiguous()?, &Wide { act, width, offset })
}

/// `act(y + bias[c])` for NHWC `y` `(N, H, W, C)` written in place into channels
/// `offset..offset + C` of `buf` `(N, H, W, width)` (contiguous).
pub fn bias_act_into(buf: &Tensor, offset: usize, y: &Tensor, bias: &Tensor, act: bool) -> candle_core::Result<()> {
    let (n, h, w, c) = y.dims4()?;
    let (bn, bh, bw, width) = buf.dims4()?;
    if (bn, bh, bw) != (n, h, w) || offset + c > width || buf.dtype() != y.dtype() || !buf.is_contiguous() {
        candle_core::bail!("epilogue: {:?} into channels {offset}.. of {:?}", y.dims(), buf.dims());
    }
    if !into_kernel_fits(y, c, offset, width) {
        return buf.slice_set(&bias_act(y, bias, act, None, true)?, 3, offset);
    }
    buf.inplace_op3(&y.contiguous()?, &bias.contiguous()?, &Into { act, offset })
}

/// The kernel takes f16 in units of 8 channels on CUDA.
fn into_kernel_fits(y: &Tensor, c: usize, offset: usize, width: usize) -> bool {
    y.device().is_cuda() && y.dtype() == DType::F16 && c.is_multiple_of(8) && offset.is_multiple_of(8) && width.is_multiple_of(8)
}

struct Wide {
    act: bool,
    width: usize,
    offset: usize,
}

impl CustomOp2 for Wide {
    fn name(&self) -> &'static str {
        "bias-act-wide"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("bias-act-wide: CUDA only")
    }

    fn cuda_fwd(&self, y: &CudaStorage, yl: &Layout, b: &CudaStorage, bl: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let (n, h, w, _) = yl.shape().dims4()?;
        let dev = y.device().clone();
        // SAFETY: channels `offset..offset + C` are written below; the caller fills the others
        // before any read (documented on `bias_act_wide`).
        let mut out = unsafe { dev.alloc::<half::f16>(n * h * w * self.width)? };
        launch_into(self.act, (y, yl), (b, bl), &mut out.slice_mut(..), self.offset, self.width)?;
        let slice = candle_core::cuda_backend::CudaStorageSlice::F16(out);
        Ok((CudaStorage { slice, device: dev }, Shape::from((n, h, w, self.width))))
    }
}

struct Into {
    act: bool,
    offset: usize,
}

impl InplaceOp3 for Into {
    fn name(&self) -> &'static str {
        "bias-act-into"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("bias-act-into: CUDA only")
    }

    fn cuda_fwd(
        &self,
        buf: &mut CudaStorage,
        bufl: &Layout,
        y: &CudaStorage,
        yl: &Layout,
        b: &CudaStorage,
        bl: &Layout,
    ) -> candle_core::Result<()> {
        let width = bufl.shape().dims4()?.3;
        let mut out = buf.as_cuda_slice_mut::<half::f16>()?.slice_mut(bufl.start_offset()..);
        launch_into(self.act, (y, yl), (b, bl), &mut out, self.offset, width)
    }
}

/// `bias_act_cl_f16x8_into`: NHWC f16 `y` (contiguous) into channels `offset..offset + C` of the
/// rows of `width` channels of `out`, in units of 8 channels (16 bytes).
fn launch_into(
    act: bool,
    (y, yl): Arg,
    (b, bl): Arg,
    out: &mut CudaViewMut<half::f16>,
    offset: usize,
    width: usize,
) -> candle_core::Result<()> {
    let (_, _, _, c) = yl.shape().dims4()?;
    let n = yl.shape().elem_count();
    if !yl.is_contiguous() || !bl.is_contiguous() || bl.shape().elem_count() != c {
        candle_core::bail!("bias-act-into: contiguous input and {c} biases needed");
    }
    if [c, offset, width, yl.start_offset(), bl.start_offset()].iter().any(|v| v % 8 != 0) {
        candle_core::bail!("bias-act-into: channels, offset or alignment not in units of 8");
    }
    if n > u32::MAX as usize || (n / c.max(1)).checked_mul(width).is_none_or(|e| e > out.len()) {
        candle_core::bail!("bias-act-into: {n} elements into a buffer of {}", out.len());
    }
    let dev = y.device().clone();
    let func = dev.get_or_load_custom_func("bias_act_cl_f16x8_into", MODULE, PTX)?;
    let yv = y.as_cuda_slice::<half::f16>()?.slice(yl.start_offset()..);
    let bv = b.as_cuda_slice::<half::f16>()?.slice(bl.start_offset()..);
    let units = n / 8;
    let cfg = super::grid(units, 256);
    let (units, c8, stride8, off8, act) = (units as u32, (c / 8) as u32, (width / 8) as u32, (offset / 8) as u32, act as i32);
    let mut builder = func.builder();
    builder.arg(&yv);
    builder.arg(&bv);
    builder.arg(out);
    builder.arg(&units);
    builder.arg(&c8);
    builder.arg(&stride8);
    builder.arg(&off8);
    builder.arg(&act);
    // SAFETY: argument list matches `bias_act_cl_f16x8_into` in `kernels/epilogue.cu`; every
    // write lands in a row of `width` channels of one of the `n / C` pixels of `out`, whose
    // length is checked above.
    unsafe { builder.launch(cfg) }.w()?;
    Ok(())
}

struct BiasAct {
    act: bool,
    channels_last: bool,
}

impl CustomOp2 for BiasAct {
    fn name(&self) -> &'static str {
        "bias-act"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("bias-act: CUDA only")
    }

    fn cuda_fwd(&self, y: &CudaStorage, yl: &Layout, b: &CudaStorage, bl: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        launch(self.act, self.channels_last, (y, yl), (b, bl), None)
    }
}

impl CustomOp3 for BiasAct {
    fn name(&self) -> &'static str {
        "bias-act-residual"
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
        candle_core::bail!("bias-act-residual: CUDA only")
    }

    fn cuda_fwd(
        &self,
        y: &CudaStorage,
        yl: &Layout,
        b: &CudaStorage,
        bl: &Layout,
        r: &CudaStorage,
        rl: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        launch(self.act, self.channels_last, (y, yl), (b, bl), Some((r, rl)))
    }
}

type Arg<'a> = (&'a CudaStorage, &'a Layout);

fn launch(act: bool, channels_last: bool, (y, yl): Arg, (b, bl): Arg, res: Option<Arg>) -> candle_core::Result<(CudaStorage, Shape)> {
    let (_, d1, d2, d3) = yl.shape().dims4()?;
    // elements per channel run (h*w for NCHW, 1 for NHWC) and channels
    let (hw, c) = if channels_last { (1, d3) } else { (d2 * d3, d1) };
    let n = yl.shape().elem_count();
    if !yl.is_contiguous() || !bl.is_contiguous() || res.is_some_and(|(_, l)| !l.is_contiguous()) {
        candle_core::bail!("bias-act: inputs must be contiguous");
    }
    if bl.shape().elem_count() != c {
        candle_core::bail!("bias-act: {} biases for {c} channels", bl.shape().elem_count());
    }
    if n > u32::MAX as usize {
        candle_core::bail!("bias-act: {n} elements is more than one launch indexes");
    }
    let dev = y.device().clone();
    let slice = match y.dtype() {
        DType::F16 => {
            let offsets = [Some(yl.start_offset()), Some(bl.start_offset()), res.map(|(_, l)| l.start_offset())];
            let aligned = offsets.iter().flatten().all(|o| o % 2 == 0) && bl.start_offset() == 0;
            let aligned8 = offsets.iter().flatten().all(|o| o % 8 == 0) && bl.start_offset() == 0;
            let s = if channels_last && c % 8 == 0 && aligned8 {
                go::<half::f16>(&dev, "bias_act_cl_f16x8", Pairs::Eight, act, (y, yl), (b, bl), res, (n, hw, c))?
            } else if channels_last && c % 2 == 0 && aligned {
                go::<half::f16>(&dev, "bias_act_cl_f16x2", Pairs::ChannelsLast, act, (y, yl), (b, bl), res, (n, hw, c))?
            } else if !channels_last && hw % 2 == 0 && aligned {
                go::<half::f16>(&dev, "bias_act_f16x2", Pairs::Plane, act, (y, yl), (b, bl), res, (n, hw, c))?
            } else {
                go::<half::f16>(&dev, "bias_act_f16", Pairs::No, act, (y, yl), (b, bl), res, (n, hw, c))?
            };
            candle_core::cuda_backend::CudaStorageSlice::F16(s)
        }
        DType::F32 => candle_core::cuda_backend::CudaStorageSlice::F32(go::<f32>(
            &dev,
            "bias_act_f32",
            Pairs::No,
            act,
            (y, yl),
            (b, bl),
            res,
            (n, hw, c),
        )?),
        dt => candle_core::bail!("bias-act: unsupported dtype {dt:?}"),
    };
    Ok((CudaStorage { slice, device: dev }, yl.shape().clone()))
}

/// How the f16 kernels take two halves per thread.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pairs {
    /// One element per thread.
    No,
    /// Two elements of one channel plane (NCHW, H*W even).
    Plane,
    /// Two neighbouring channels of one pixel (NHWC, C even).
    ChannelsLast,
    /// Eight neighbouring channels of one pixel, one 16-byte access (NHWC, C a multiple of 8,
    /// offsets 16-byte aligned).
    Eight,
}

#[allow(clippy::too_many_arguments)]
fn go<T: DeviceRepr + candle_core::cuda_backend::CudaDType + candle_core::WithDType>(
    dev: &candle_core::CudaDevice,
    kernel: &str,
    pairs: Pairs,
    act: bool,
    (y, yl): Arg,
    (b, bl): Arg,
    res: Option<Arg>,
    (n, hw, c): (usize, usize, usize),
) -> candle_core::Result<CudaSlice<T>> {
    let func = dev.get_or_load_custom_func(kernel, MODULE, PTX)?;
    let yv = y.as_cuda_slice::<T>()?.slice(yl.start_offset()..);
    let bv = b.as_cuda_slice::<T>()?.slice(bl.start_offset()..);
    // without a residual the kernel never reads it; any valid pointer will do
    let rv = match res {
        Some((r, rl)) => r.as_cuda_slice::<T>()?.slice(rl.start_offset()..),
        None => y.as_cuda_slice::<T>()?.slice(yl.start_offset()..),
    };
    // SAFETY: every element is written by the kernel below.
    let out = unsafe { dev.alloc::<T>(n)? };
    let units = match pairs {
        Pairs::No => n,
        Pairs::Plane | Pairs::ChannelsLast => n / 2,
        Pairs::Eight => n / 8,
    };
    let cfg = super::grid(units, 256);
    let (act, has_res) = (act as i32, res.is_some() as i32);
    let units = units as u32;
    let (hw_units, c) = match pairs {
        Pairs::No => (hw as u32, c as u32),
        Pairs::Plane => ((hw / 2) as u32, c as u32),
        Pairs::ChannelsLast => (0, (c / 2) as u32),
        Pairs::Eight => (0, (c / 8) as u32),
    };
    let mut builder = func.builder();
    builder.arg(&yv);
    builder.arg(&bv);
    builder.arg(&rv);
    builder.arg(&out);
    builder.arg(&units);
    if !matches!(pairs, Pairs::ChannelsLast | Pairs::Eight) {
        builder.arg(&hw_units);
    }
    builder.arg(&c);
    builder.arg(&act);
    builder.arg(&has_res);
    // SAFETY: argument list matches `kernels/epilogue.cu`; sizes checked by the caller.
    unsafe { builder.launch(cfg) }.w()?;
    Ok(out)
}
