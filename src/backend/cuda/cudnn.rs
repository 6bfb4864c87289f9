//! Convolutions through cuDNN with one plan per shape: descriptors built and the algorithm
//! chosen once, then reused by every later call of that shape. The candidates are the
//! algorithms `cudnnFindConvolutionForwardAlgorithmEx` runs successfully (as PyTorch's
//! `cudnn.benchmark`), each then timed by launches captured in a CUDA graph (`time_runs`): the
//! search's own timings have a floor of about 60 us on an H200, above what the small
//! convolutions of yolov9t take, so it cannot rank them.
//!
//! candle's own cuDNN path re-plans on every call (about 4 ms of host time each, measured on the
//! on a data-centre GPU) and accumulates FP16 in FP16 (error 3.5e-3 to 7e-3). Here FP16 data is computed with
//! FP32 accumulation (cuDNN's PSEUDO_HALF), tensor cores allowed; FP32 data without TF32, so that
//! the f32 path stays a reference. The algorithms kept for FP16 are the GEMM family (exact FP32
//! accumulation; Winograd and FFT are left out). Grouped convolutions
//! (the head's depthwise 3x3) are one call, not one per group.
//!
//! A plan may run its batch as two halves, each as the half batch's own plan runs it (in halves
//! again where that pays), where the halves time at least
//! [`SPLIT_MARGIN`](crate::backend::conv::SPLIT_MARGIN) faster than the whole: cuDNN's kernels
//! for some shapes are far slower at one batch than at half of it (yolov9t's 24 -> 24 channels at
//! 40x40 took 2.5x longer per picture at batch 32 than at 16 on an H200, which made batch 32
//! slower than 16 as a whole; yolov9s's 48 -> 48 at 40x40 on an H100: 0.047 ms at 64, 0.138 at
//! 128, 0.265 at 256).
//!
//! Plans live per thread (cuDNN handles are not thread-safe; the agent runs one inference thread
//! per device). The workspace of each call comes from candle's pool, so the memory planner sees
//! it; a workspace kept between calls makes peaks grow and planned batches shrink
//! (BENCHMARKS.md, "Settled experiments").

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ffi::c_void;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, SyncOnDrop,
};
use candle_core::cuda_backend::{CudaStorageSlice, DeviceId};
use candle_core::{CpuStorage, CudaDevice, CudaStorage, CustomOp2, DType, Layout, Shape, Tensor};
use cudarc::cudnn::{result, sys};

use crate::backend::oom::OOM_MARKER;

/// Largest workspace offered to the algorithm search for a convolution whose input and output
/// hold `io_bytes`: `cudnn_workspace_scale` x `io_bytes`, at least `cudnn_workspace_min`, at most
/// 8 GiB ([`Tuning`](crate::backend::tuning::Tuning)). The chosen algorithm's own need, at most
/// this, is what later calls allocate (the planner measures it). The fast tensor-core algorithms
/// stage FP16 tensors in another layout inside the workspace, so their need grows with the
/// batch, and explicit-GEMM algorithms need about nine times the input: a fixed cap makes large
/// batches pick slow algorithms (BENCHMARKS.md, "Settled experiments": cuDNN workspace).
fn find_workspace(io_bytes: usize) -> usize {
    let t = crate::backend::tuning::get();
    let floor = t.cudnn_workspace_min.0 as usize;
    floor.max(((io_bytes as f64 * t.cudnn_workspace_scale) as usize).min(8 << 30))
}

/// How much slower than the fastest an algorithm may be and still be chosen for needing less
/// workspace (`cudnn_algo_slack`; the rule: [`crate::backend::conv::choose_algo`]). The search's
/// timings of near-equal algorithms vary from run to run, and a choice by time alone can take
/// one that needs far more scratch memory for no real gain.
fn algo_slack() -> f32 {
    crate::backend::tuning::get().cudnn_algo_slack as f32
}

/// `x.conv2d(w, padding, stride, 1, groups)` through cuDNN, or `None` when cuDNN cannot run this
/// shape (then the caller takes candle's path; the shape is remembered and not tried again).
/// With `nhwc`, `x` is `(N, H, W, C)`, `w` is `(K, R, S, C/groups)` and so is the result
/// `(N, OH, OW, K)`; otherwise all are NCHW.
pub fn conv2d(x: &Tensor, w: &Tensor, padding: usize, stride: usize, groups: usize, nhwc: bool) -> Option<candle_core::Result<Tensor>> {
    let key = Key::new(x, w, padding, stride, groups, nhwc)?;
    if UNSUPPORTED.with(|u| u.borrow().contains(&key)) {
        return None;
    }
    let r = x.contiguous().and_then(|x| w.contiguous().and_then(|w| x.apply_op2_no_bwd(&w, &CudnnConv { key })));
    match r {
        Err(e) if !crate::backend::oom::is_oom(&e) && UNSUPPORTED.with(|u| u.borrow().contains(&key)) => {
            tracing::warn!(error = %e, shape = ?key, "cuDNN cannot run this convolution; using candle's");
            None
        }
        r => Some(r),
    }
}

/// Everything that makes a plan: device, dtype, layout, input and filter dims (in cuDNN's order,
/// N C H W and K C R S, whatever the layout), stride, padding, groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Key {
    dev: DeviceId,
    f16: bool,
    nhwc: bool,
    pub(super) x: [i32; 4],
    pub(super) w: [i32; 4],
    pub(super) stride: i32,
    pub(super) pad: i32,
    groups: i32,
}

impl Key {
    pub(super) fn new(x: &Tensor, w: &Tensor, pad: usize, stride: usize, groups: usize, nhwc: bool) -> Option<Self> {
        let dev = match x.device() {
            candle_core::Device::Cuda(d) => d.id(),
            _ => return None,
        };
        let f16 = match (x.dtype(), w.dtype()) {
            (DType::F16, DType::F16) => true,
            (DType::F32, DType::F32) => false,
            _ => return None,
        };
        let d = |t: &Tensor| -> Option<[i32; 4]> {
            let (a, b, c, e) = t.dims4().ok()?;
            // channels last: (a, h, w, c) is (a, c, h, w) to cuDNN
            let (b, c, e) = if nhwc { (e, b, c) } else { (b, c, e) };
            Some([a.try_into().ok()?, b.try_into().ok()?, c.try_into().ok()?, e.try_into().ok()?])
        };
        Some(Self { dev, f16, nhwc, x: d(x)?, w: d(w)?, stride: stride as i32, pad: pad as i32, groups: groups as i32 })
    }

    /// The same convolution on the first half of the batch (an even batch of at least 2).
    fn half(&self) -> Option<Self> {
        (self.x[0] >= 2 && self.x[0] % 2 == 0).then(|| Self { x: [self.x[0] / 2, self.x[1], self.x[2], self.x[3]], ..*self })
    }

    fn x_elems(&self) -> usize {
        self.x.iter().map(|&d| d.max(0) as usize).product()
    }

    fn y_elems(&self) -> usize {
        self.y_dims().iter().map(|&d| d.max(0) as usize).product()
    }

    /// Bytes of this key's input and output with elements of `elem` bytes: where the second
    /// half starts when this key is a half batch.
    fn bytes(&self, elem: usize) -> (u64, u64) {
        ((self.x_elems() * elem) as u64, (self.y_elems() * elem) as u64)
    }

    pub(super) fn y_dims(&self) -> [i32; 4] {
        let o = |i: i32, k: i32| (i + 2 * self.pad - k) / self.stride + 1;
        [self.x[0], self.w[0], o(self.x[2], self.w[2]), o(self.x[3], self.w[3])]
    }
}

thread_local! {
    static HANDLES: RefCell<HashMap<DeviceId, Handle>> = RefCell::new(HashMap::new());
    static PLANS: RefCell<HashMap<Key, Plan>> = RefCell::new(HashMap::new());
    static UNSUPPORTED: RefCell<HashSet<Key>> = RefCell::new(HashSet::new());
}

/// Owned cuDNN objects, destroyed on drop.
macro_rules! owned {
    ($($name:ident($raw:ty) => $destroy:path;)*) => {$(
        struct $name($raw);
        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: created by the matching cuDNN create call and destroyed only here.
                let _ = unsafe { $destroy(self.0) };
            }
        }
    )*};
}
owned! {
    Handle(sys::cudnnHandle_t) => result::destroy_handle;
    TensorDesc(sys::cudnnTensorDescriptor_t) => result::destroy_tensor_descriptor;
    FilterDesc(sys::cudnnFilterDescriptor_t) => result::destroy_filter_descriptor;
    ConvDesc(sys::cudnnConvolutionDescriptor_t) => result::destroy_convolution_descriptor;
}

/// The raw pointer of an optional scratch buffer (null without one), with its stream guard.
fn scratch_ptr<'a>(ws: &'a mut Option<CudaSlice<u8>>, stream: &'a CudaStream) -> (*mut c_void, Option<SyncOnDrop<'a>>) {
    match ws.as_mut() {
        Some(b) => {
            let (p, g) = b.device_ptr_mut(stream);
            (p as *mut c_void, Some(g))
        }
        None => (std::ptr::null_mut(), None),
    }
}

/// Descriptors and the chosen algorithm for one shape.
struct Plan {
    x: TensorDesc,
    w: FilterDesc,
    conv: ConvDesc,
    y: TensorDesc,
    algo: sys::cudnnConvolutionFwdAlgo_t,
    workspace: usize,
    /// The chosen algorithm's time for the whole batch (ms; `time_runs`, or the search's where
    /// no algorithm could be timed).
    time: f32,
    /// Run as two halves of the batch through the half batch's plan.
    split: bool,
}

pub(super) fn err(what: &str, e: impl std::fmt::Debug) -> candle_core::Error {
    let s = format!("{e:?}");
    if s.contains("ALLOC_FAILED") {
        candle_core::Error::Msg(format!("{OOM_MARKER}: cuDNN {what}: {s}"))
    } else {
        candle_core::Error::Msg(format!("cuDNN {what}: {s}"))
    }
}

pub(super) fn handle(dev: &CudaDevice) -> candle_core::Result<sys::cudnnHandle_t> {
    HANDLES.with(|h| {
        if let Some(h) = h.borrow().get(&dev.id()) {
            return Ok(h.0);
        }
        let stream = dev.cuda_stream();
        stream.context().bind_to_thread().map_err(|e| err("bind context", e))?;
        let raw = result::create_handle().map_err(|e| err("create handle", e))?;
        let handle = Handle(raw);
        // SAFETY: `raw` is the handle just created on this thread, and the stream belongs to the
        // device's context, bound to this thread above; both outlive the handle's use here.
        unsafe { result::set_stream(raw, stream.cu_stream() as *mut _) }.map_err(|e| err("set stream", e))?;
        h.borrow_mut().insert(dev.id(), handle);
        Ok(raw)
    })
}

impl Plan {
    /// Descriptors for `key` (algorithm not chosen yet).
    fn describe(key: &Key) -> candle_core::Result<Self> {
        let dt = if key.f16 { sys::cudnnDataType_t::CUDNN_DATA_HALF } else { sys::cudnnDataType_t::CUDNN_DATA_FLOAT };
        let format = if key.nhwc { sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC } else { sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW };
        let x = TensorDesc(result::create_tensor_descriptor().map_err(|e| err("descriptor", e))?);
        // SAFETY: each descriptor here was just created and is owned by its wrapper, which
        // destroys it on drop; the dimensions are plain values (so for the calls below too).
        unsafe { result::set_tensor4d_descriptor(x.0, format, dt, key.x) }.map_err(|e| err("input descriptor", e))?;
        let y = TensorDesc(result::create_tensor_descriptor().map_err(|e| err("descriptor", e))?);
        // SAFETY: as above, a live descriptor owned by `y`.
        unsafe { result::set_tensor4d_descriptor(y.0, format, dt, key.y_dims()) }.map_err(|e| err("output descriptor", e))?;
        let w = FilterDesc(result::create_filter_descriptor().map_err(|e| err("descriptor", e))?);
        // SAFETY: as above, a live descriptor owned by `w`.
        unsafe { result::set_filter4d_descriptor(w.0, dt, format, key.w) }.map_err(|e| err("filter descriptor", e))?;
        let conv = ConvDesc(result::create_convolution_descriptor().map_err(|e| err("descriptor", e))?);
        // FP32 accumulation for both FP16 and FP32 data
        let (p, s) = (key.pad, key.stride);
        // SAFETY: as above, a live descriptor owned by `conv`.
        unsafe {
            result::set_convolution2d_descriptor(
                conv.0,
                p,
                p,
                s,
                s,
                1,
                1,
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
            )
        }
        .map_err(|e| err("convolution descriptor", e))?;
        if key.groups > 1 {
            // SAFETY: as above, a live descriptor owned by `conv`.
            unsafe { result::set_convolution_group_count(conv.0, key.groups) }.map_err(|e| err("group count", e))?;
        }
        let math = if key.f16 { sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH } else { sys::cudnnMathType_t::CUDNN_FMA_MATH };
        // SAFETY: as above, a live descriptor owned by `conv`.
        unsafe { result::set_convolution_math_type(conv.0, math) }.map_err(|e| err("math type", e))?;
        Ok(Self {
            x,
            w,
            conv,
            y,
            algo: sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
            workspace: 0,
            time: f32::INFINITY,
            split: false,
        })
    }
}

fn admitted(f16: bool, algo: sys::cudnnConvolutionFwdAlgo_t) -> bool {
    use sys::cudnnConvolutionFwdAlgo_t as A;
    !f16 || matches!(
        algo,
        A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM
            | A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
            | A::CUDNN_CONVOLUTION_FWD_ALGO_GEMM
    )
}

struct CudnnConv {
    key: Key,
}

impl CustomOp2 for CudnnConv {
    fn name(&self) -> &'static str {
        "cudnn-conv2d"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("cudnn-conv2d: CUDA only")
    }

    fn cuda_fwd(&self, x: &CudaStorage, xl: &Layout, w: &CudaStorage, wl: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        if !xl.is_contiguous() || !wl.is_contiguous() {
            candle_core::bail!("cudnn-conv2d: inputs must be contiguous");
        }
        let dev = x.device().clone();
        let slice = match (&x.slice, &w.slice) {
            (CudaStorageSlice::F16(xs), CudaStorageSlice::F16(ws)) => CudaStorageSlice::F16(run(&dev, &self.key, xs, xl, ws, wl)?),
            (CudaStorageSlice::F32(xs), CudaStorageSlice::F32(ws)) => CudaStorageSlice::F32(run(&dev, &self.key, xs, xl, ws, wl)?),
            _ => candle_core::bail!("cudnn-conv2d: f16 or f32 input and filter of one dtype"),
        };
        let [n, c, h, wd] = self.key.y_dims().map(|v| v as usize);
        let shape = if self.key.nhwc { Shape::from((n, h, wd, c)) } else { Shape::from((n, c, h, wd)) };
        Ok((CudaStorage { slice, device: dev }, shape))
    }
}

fn run<T: DeviceRepr>(
    dev: &CudaDevice,
    key: &Key,
    x: &CudaSlice<T>,
    xl: &Layout,
    w: &CudaSlice<T>,
    wl: &Layout,
) -> candle_core::Result<CudaSlice<T>> {
    let handle = handle(dev)?;
    let stream = dev.cuda_stream();
    let [n, c, h, wd] = key.y_dims();
    if n <= 0 || c <= 0 || h <= 0 || wd <= 0 {
        candle_core::bail!("cudnn-conv2d: empty output for {key:?}");
    }
    let len = (n as usize) * (c as usize) * (h as usize) * (wd as usize);
    // SAFETY: fully written by the convolution (beta = 0).
    let mut y = unsafe { dev.alloc::<T>(len)? };
    {
        let xv = x.slice(xl.start_offset()..);
        let wv = w.slice(wl.start_offset()..);
        let mut yv = y.slice_mut(..);
        ensure_plan(handle, dev, key, &xv, &wv, &mut yv)?;
        let (xp, _gx) = xv.device_ptr(&stream);
        let (wp, _gw) = wv.device_ptr(&stream);
        let (yp, _gy) = yv.device_ptr_mut(&stream);
        // SAFETY: `xp`, `wp` and `yp` point to buffers holding `key`'s input, filter and output
        // (`len` elements allocated for the output; the input's layout is contiguous with
        // `key`'s dims), kept alive and ordered on `stream` by the guards until the calls are
        // enqueued.
        unsafe { enqueue(handle, dev, &stream, key, xp, wp, yp, std::mem::size_of::<T>()) }?;
    }
    Ok(y)
}

/// Plans `key` if it has no plan yet, and then its half batch (recursively), deciding whether it
/// runs as two halves; the searches run on `x`, `w` and `y` (the halves on their first halves).
fn ensure_plan<T: DeviceRepr>(
    handle: sys::cudnnHandle_t,
    dev: &CudaDevice,
    key: &Key,
    x: &CudaView<T>,
    w: &CudaView<T>,
    y: &mut CudaViewMut<T>,
) -> candle_core::Result<()> {
    if PLANS.with(|p| p.borrow().contains_key(key)) {
        return Ok(());
    }
    let plan = match plan(handle, dev, key, x, w, y) {
        Ok(p) => p,
        Err(e) => {
            if !crate::backend::oom::is_oom(&e) {
                UNSUPPORTED.with(|u| u.borrow_mut().insert(*key));
            }
            return Err(e);
        }
    };
    PLANS.with(|p| p.borrow_mut().insert(*key, plan));
    if let Some(half) = key.half() {
        // a half that cannot be planned or timed (out of memory, unsupported) leaves the whole
        // as it is
        let (xh, mut yh) = (x.slice(..half.x_elems()), y.slice_mut(..half.y_elems()));
        if ensure_plan(handle, dev, &half, &xh, w, &mut yh).is_ok() {
            if let Ok((whole, halves)) = time_split(handle, dev, key, x, w, y) {
                if crate::backend::conv::split_pays(whole, halves) {
                    PLANS.with(|p| p.borrow_mut().get_mut(key).map(|plan| plan.split = true));
                }
                tracing::debug!(shape = ?key, whole, halves, "cuDNN batch split timed");
            }
        }
    }
    PLANS.with(|p| {
        if let Some(plan) = p.borrow().get(key) {
            tracing::debug!(shape = ?key, algo = ?plan.algo, workspace = plan.workspace, time = plan.time, split = plan.split, "cuDNN plan");
        }
    });
    Ok(())
}

/// The device time (ms) of `key`'s convolution as [`conv2d`] runs it, planning it first on `x`,
/// `w` and `y` if it has no plan; `None` where it runs as two halves (whose time the plan does
/// not keep) or cannot be planned.
pub(super) fn conv_time<T: DeviceRepr>(
    handle: sys::cudnnHandle_t,
    dev: &CudaDevice,
    key: &Key,
    x: &CudaView<T>,
    w: &CudaView<T>,
    y: &mut CudaViewMut<T>,
) -> candle_core::Result<Option<f32>> {
    if UNSUPPORTED.with(|u| u.borrow().contains(key)) {
        return Ok(None);
    }
    match ensure_plan(handle, dev, key, x, w, y) {
        Ok(()) => {}
        Err(e) if crate::backend::oom::is_oom(&e) => return Err(e),
        Err(_) => return Ok(None),
    }
    Ok(PLANS.with(|p| p.borrow().get(key).filter(|plan| !plan.split).map(|plan| plan.time)))
}

/// Device time of `key`'s whole batch in one call and as two halves, each run as the half plan
/// runs it (in halves again where that plan splits) (ms).
fn time_split<T: DeviceRepr>(
    handle: sys::cudnnHandle_t,
    dev: &CudaDevice,
    key: &Key,
    x: &CudaView<T>,
    w: &CudaView<T>,
    y: &mut CudaViewMut<T>,
) -> candle_core::Result<(f32, f32)> {
    let half = key.half().ok_or_else(|| candle_core::Error::Msg("no half batch".into()))?;
    let stream = dev.cuda_stream();
    let elem = std::mem::size_of::<T>();
    let need = PLANS.with(|p| {
        let p = p.borrow();
        Some(p.get(key)?.workspace.max(workspace_as_planned(&p, &half)?))
    });
    let need = need.ok_or_else(|| candle_core::Error::Msg("cuDNN plan vanished".into()))?;
    // SAFETY: uninitialised scratch space for cuDNN.
    let mut ws = if need > 0 { Some(unsafe { dev.alloc::<u8>(need)? }) } else { None };
    let (xp, _gx) = x.device_ptr(&stream);
    let (wp, _gw) = w.device_ptr(&stream);
    let (yp, _gy) = y.device_ptr_mut(&stream);
    let (wsp, _gws) = scratch_ptr(&mut ws, &stream);
    let (dx, dy) = half.bytes(elem);
    PLANS.with(|p| {
        let plans = p.borrow();
        let Some(whole_plan) = plans.get(key) else { candle_core::bail!("cuDNN plan vanished") };
        // SAFETY: `x`, `w` and `y` hold `key`'s input, filter and output (the search ran on
        // them), their first and second halves `half`'s; the workspace holds `need` bytes, at
        // least the whole plan's need and that of every plan the halves run through; the guards
        // keep them alive and ordered until `time_runs` has waited for the runs.
        let whole = time_runs(&stream, || unsafe { forward(handle, whole_plan, whole_plan.algo, xp, wp, yp, wsp, need) })?;
        // each half as it runs: in halves again where its own plan splits
        // SAFETY: as above.
        let halves = time_runs(&stream, || unsafe {
            forward_as_planned(handle, &plans, &half, (xp, wp, yp), elem, wsp, need)?;
            forward_as_planned(handle, &plans, &half, (xp + dx, wp, yp + dy), elem, wsp, need)
        })?;
        Ok((whole, halves))
    })
}

/// The workspace `key`'s convolution needs as its plan runs it: its algorithm's, or where it
/// splits, that of the half plan as it runs (recursively); `None` where a plan on the way is
/// missing.
fn workspace_as_planned(plans: &HashMap<Key, Plan>, key: &Key) -> Option<usize> {
    let plan = plans.get(key)?;
    match (plan.split, key.half()) {
        (true, Some(half)) => workspace_as_planned(plans, &half),
        _ => Some(plan.workspace),
    }
}

/// `key`'s convolution as its plan runs it: one call, or the two halves of the batch through the
/// half plan (recursively) where it splits, all with the workspace at `wsp`.
///
/// # Safety
/// `xp`, `wp` and `yp` are device pointers to `key`'s input, filter and output with elements of
/// `elem` bytes, and `wsp` to `ws` bytes, at least [`workspace_as_planned`]; all valid until the
/// work enqueued here has run.
unsafe fn forward_as_planned(
    handle: sys::cudnnHandle_t,
    plans: &HashMap<Key, Plan>,
    key: &Key,
    (xp, wp, yp): (u64, u64, u64),
    elem: usize,
    wsp: *mut c_void,
    ws: usize,
) -> candle_core::Result<()> {
    let plan = plans.get(key).ok_or_else(|| candle_core::Error::Msg("cuDNN plan vanished".into()))?;
    match (plan.split, key.half()) {
        (true, Some(half)) => {
            let (dx, dy) = half.bytes(elem);
            // SAFETY: the halves of the caller's buffers, which hold twice `half`'s elements.
            unsafe {
                forward_as_planned(handle, plans, &half, (xp, wp, yp), elem, wsp, ws)?;
                forward_as_planned(handle, plans, &half, (xp + dx, wp, yp + dy), elem, wsp, ws)
            }
        }
        // SAFETY: the caller's pointers, as this function's contract requires.
        _ => unsafe { forward(handle, plan, plan.algo, xp, wp, yp, wsp, ws) },
    }
}

/// Enqueues `key`'s convolution on `stream` as its plan runs it ([`forward_as_planned`]), with
/// one workspace from the pool for all its calls.
///
/// # Safety
/// `xp`, `wp` and `yp` must be device pointers to `key`'s input, filter and output, with elements
/// of `elem` bytes, valid until the work enqueued here has run; `key` must be planned.
#[allow(clippy::too_many_arguments)]
unsafe fn enqueue(
    handle: sys::cudnnHandle_t,
    dev: &CudaDevice,
    stream: &CudaStream,
    key: &Key,
    xp: u64,
    wp: u64,
    yp: u64,
    elem: usize,
) -> candle_core::Result<()> {
    PLANS.with(|p| -> candle_core::Result<()> {
        let plans = p.borrow();
        let need = workspace_as_planned(&plans, key).ok_or_else(|| candle_core::Error::Msg("cuDNN plan vanished".into()))?;
        // SAFETY: uninitialised scratch space for cuDNN.
        let mut ws = if need > 0 { Some(unsafe { dev.alloc::<u8>(need)? }) } else { None };
        let (wsp, _gws) = scratch_ptr(&mut ws, stream);
        // SAFETY: the plans' descriptors describe exactly these buffers and their halves (the
        // keys hold their shapes and dtype, checked when the plans were made; the caller vouches
        // for the pointers); the workspace is `need` bytes and stays alive and ordered on
        // `stream` through `_gws`.
        unsafe { forward_as_planned(handle, &plans, key, (xp, wp, yp), elem, wsp, need) }
    })
}

/// `cudnnConvolutionForward` with `plan`'s descriptors and algorithm `algo`.
///
/// # Safety
/// `xp`, `wp`, `yp` as for [`enqueue`]; `wsp` a device buffer of `ws` bytes (or null with 0),
/// at least `algo`'s need, valid until the call has run.
#[allow(clippy::too_many_arguments)]
unsafe fn forward(
    handle: sys::cudnnHandle_t,
    plan: &Plan,
    algo: sys::cudnnConvolutionFwdAlgo_t,
    xp: u64,
    wp: u64,
    yp: u64,
    wsp: *mut c_void,
    ws: usize,
) -> candle_core::Result<()> {
    let (alpha, beta) = (1f32, 0f32);
    // SAFETY: the caller's contract; alpha and beta outlive the call.
    unsafe {
        result::convolution_forward(
            handle,
            (&alpha) as *const f32 as *const c_void,
            plan.x.0,
            xp as *const c_void,
            plan.w.0,
            wp as *const c_void,
            plan.conv.0,
            algo,
            wsp,
            ws,
            (&beta) as *const f32 as *const c_void,
            plan.y.0,
            yp as *mut c_void,
        )
    }
    .map_err(|e| err("convolution", e))
}

/// Runs of one convolution per timing.
const TIMED_LAUNCHES: usize = 10;

/// The device time of one run of `f` (ms): [`TIMED_LAUNCHES`] runs captured into one CUDA graph
/// and replayed between two events, after one untimed run and one untimed replay. cuDNN's own
/// search times each algorithm with a floor of about 60 us on an H200, and launches back to back
/// wait for the host (about 30 us per call), both above what the small convolutions of yolov9t
/// take; a graph replays them as the model's own graphs do. `f` must not allocate.
pub(super) fn time_runs(stream: &std::sync::Arc<CudaStream>, mut f: impl FnMut() -> candle_core::Result<()>) -> candle_core::Result<f32> {
    use candle_core::cuda_backend::cudarc::driver::sys as cu;
    let ev = |e| err("timing", e);
    f()?;
    stream.synchronize().map_err(ev)?;
    stream.begin_capture(cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(ev)?;
    // the capture must be ended whatever happens inside it
    let captured = (0..TIMED_LAUNCHES).try_for_each(|_| f());
    let graph = stream.end_capture(cu::CUgraphInstantiate_flags(0));
    captured?;
    let graph = graph.map_err(ev)?.ok_or_else(|| candle_core::Error::Msg("cuDNN timing: empty capture".into()))?;
    let ctx = stream.context();
    let a = ctx.new_event(Some(cu::CUevent_flags::CU_EVENT_DEFAULT)).map_err(ev)?;
    let b = ctx.new_event(Some(cu::CUevent_flags::CU_EVENT_DEFAULT)).map_err(ev)?;
    graph.launch().map_err(ev)?;
    a.record(stream).map_err(ev)?;
    graph.launch().map_err(ev)?;
    b.record(stream).map_err(ev)?;
    b.synchronize().map_err(ev)?;
    Ok(a.elapsed_ms(&b).map_err(ev)? / TIMED_LAUNCHES as f32)
}

/// Builds the descriptors and benchmarks the admitted algorithms on the real tensors (the output
/// buffer doubles as the search's scratch output).
fn plan<T: DeviceRepr>(
    handle: sys::cudnnHandle_t,
    dev: &CudaDevice,
    key: &Key,
    x: &impl DevicePtr<T>,
    w: &impl DevicePtr<T>,
    y: &mut CudaViewMut<T>,
) -> candle_core::Result<Plan> {
    let mut plan = Plan::describe(key)?;
    let stream = dev.cuda_stream();
    // the largest scratch space the pool gives now, up to find_workspace()
    let mut ws: Option<CudaSlice<u8>> = None;
    let elem = std::mem::size_of::<T>();
    let mut size = find_workspace((key.x_elems() + y.len()) * elem);
    while size >= (1 << 20) {
        // SAFETY: scratch space.
        if let Ok(b) = unsafe { dev.alloc::<u8>(size) } {
            ws = Some(b);
            break;
        }
        size /= 4;
    }
    let ws_size = ws.as_ref().map_or(0, |_| size);
    const N: usize = sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_COUNT as usize;
    // SAFETY: a plain C struct of integers, floats and enums whose zero value is valid
    // (CUDNN_STATUS_SUCCESS, algorithm 0); cuDNN overwrites the entries it returns.
    let mut perf: [sys::cudnnConvolutionFwdAlgoPerf_t; N] = unsafe { std::mem::zeroed() };
    let mut returned: i32 = 0;
    let (xp, gx) = x.device_ptr(&stream);
    let (wp, gw) = w.device_ptr(&stream);
    let (yp, gy) = y.device_ptr_mut(&stream);
    let (wsp, gws) = scratch_ptr(&mut ws, &stream);
    // SAFETY: as for the forward call: descriptors match the buffers, whose pointers stay valid
    // while the guards live; `perf` holds N entries and `returned` is written before it is
    // read; the workspace holds `ws_size` bytes.
    let status = unsafe {
        sys::cudnnFindConvolutionForwardAlgorithmEx(
            handle,
            plan.x.0,
            xp as *const c_void,
            plan.w.0,
            wp as *const c_void,
            plan.conv.0,
            plan.y.0,
            yp as *mut c_void,
            N as i32,
            &mut returned,
            perf.as_mut_ptr(),
            wsp,
            ws_size,
        )
    };
    status.result().map_err(|e| err("algorithm search", e))?;
    let found: Vec<sys::cudnnConvolutionFwdAlgoPerf_t> = perf[..returned.clamp(0, N as i32) as usize]
        .iter()
        .filter(|p| p.status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS && p.memory <= ws_size && admitted(key.f16, p.algo))
        .copied()
        .collect();
    // each one the search ran, timed again in a graph (`time_runs`)
    let mut usable: Vec<sys::cudnnConvolutionFwdAlgoPerf_t> = Vec::with_capacity(found.len());
    for p in &found {
        // SAFETY: a live descriptor owned by the plan; the math type is one cuDNN returned.
        unsafe { result::set_convolution_math_type(plan.conv.0, p.mathType) }.map_err(|e| err("math type", e))?;
        // SAFETY: as for the search: the descriptors match the buffers, kept alive and ordered by
        // the guards until `time_runs` has waited for the runs; the workspace holds `ws_size`
        // bytes, at least this algorithm's need.
        match time_runs(&stream, || unsafe { forward(handle, &plan, p.algo, xp, wp, yp, wsp, ws_size) }) {
            Ok(t) => usable.push(sys::cudnnConvolutionFwdAlgoPerf_t { time: t, ..*p }),
            Err(e) if crate::backend::oom::is_oom(&e) => return Err(e),
            Err(e) => tracing::debug!(shape = ?key, algo = ?p.algo, error = %e, "cuDNN algorithm failed its timed runs"),
        }
    }
    drop((gx, gw, gy, gws));
    drop(ws);
    if usable.is_empty() {
        // none could be timed (a capture refused): the search's own timings
        usable = found;
    }
    let timings: Vec<crate::backend::conv::TimedAlgo> = usable
        .iter()
        .map(|p| crate::backend::conv::TimedAlgo {
            plain_implicit_gemm: p.algo == sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
            time: p.time,
            workspace: p.memory,
        })
        .collect();
    let best = crate::backend::conv::choose_algo(&timings, algo_slack())
        .map(|i| &usable[i])
        .ok_or_else(|| candle_core::Error::Msg(format!("cuDNN: no admitted algorithm for {key:?} ({returned} tried)")))?;
    tracing::debug!(
        shape = ?key,
        timed = ?usable.iter().map(|p| (p.algo, p.mathType, p.time, p.memory)).collect::<Vec<_>>(),
        "cuDNN search"
    );
    // SAFETY: a live descriptor owned by the plan; the math type is one cuDNN returned.
    unsafe { result::set_convolution_math_type(plan.conv.0, best.mathType) }.map_err(|e| err("math type", e))?;
    plan.algo = best.algo;
    plan.workspace = best.memory;
    plan.time = best.time;
    Ok(plan)
}
