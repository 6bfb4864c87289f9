//! A channels-last f16 convolution with its bias and SiLU as one kernel, through cuDNN's graph
//! API (its runtime-fusion engines), where that runs faster than the convolution alone.
//!
//! The convolutions of [`super::cudnn`] are each followed by one epilogue kernel
//! ([`super::epilogue`]). At small batches a pass is a chain of a few hundred kernels each too
//! small to fill the GPU, so one kernel fewer per convolution is time saved
//! (BENCHMARKS.md, "Convolution with its epilogue in one cuDNN kernel").
//!
//! Off unless `[tuning] cudnn_fusion` is on (`--cudnn-fusion on`): each plan build compiles a
//! kernel (about 0.2 s on an H100), which adds seconds of start-up per input shape and batch size.
//!
//! Each shape is decided once, on its first call, on the call's own tensors: where the unfused
//! convolution's plan takes at most [`FUSE_BELOW_MS`] (the launch-bound regime), the fused
//! graph's first [`MAX_PLANS`] plans by cuDNN's heuristics are built (runtime fusion compiles
//! them: start-up time) and each is timed in a CUDA graph as [`super::cudnn`] times its
//! algorithms; the fastest is kept where it is no slower than the convolution alone. Otherwise
//! the shape is remembered as not fused and [`conv_bias_act`] returns `None`: the caller runs
//! the convolution and the epilogue. Plans live per thread, as in [`super::cudnn`].

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::rc::Rc;
use std::time::Instant;

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use candle_core::{CudaDevice, CudaStorage, DType, Layout, Tensor};
use cudarc::cudnn::sys;
use half::f16;

use super::cudnn::{conv_time, err, handle, time_runs, Key};

use sys::cudnnBackendAttributeName_t as A;
use sys::cudnnBackendAttributeType_t as T;
use sys::cudnnBackendDescriptorType_t as D;

/// Plans of the fused graph built and timed per shape: the heuristics' first ones.
const MAX_PLANS: usize = 3;

/// Engine configs read from cuDNN's heuristics per shape.
const MAX_CONFIGS: usize = 32;

/// Convolutions whose unfused plan takes longer than this (ms) are not tried: there the epilogue
/// is a small share of the time, and the plan builds would only add start-up.
pub const FUSE_BELOW_MS: f32 = 0.05;

/// Tensor ids in the graph and its variant pack.
const UID_X: i64 = 1;
const UID_W: i64 = 2;
const UID_B: i64 = 3;
const UID_Y: i64 = 4;
const UID_CONV: i64 = 5;
const UID_R: i64 = 6;
/// The virtual outputs of the pointwise stages: `UID_STAGES + i`.
const UID_STAGES: i64 = 10;

/// Byte alignment the graph's tensors are declared with (checked on every call's pointers).
const ALIGN: u64 = 16;

/// `act(conv(x, w) + b) (+ residual)` for channels-last f16 `x` `(N, H, W, C)`, `w`
/// `(K, R, S, C)`, `b` `(K)` and `residual` `(N, OH, OW, K)` as one cuDNN kernel, or `None`
/// where fusion is off or this shape is not fused (then the caller runs the convolution and its
/// epilogue; the decision is kept).
pub fn conv_bias_act(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    residual: Option<&Tensor>,
    padding: usize,
    stride: usize,
    act: bool,
) -> Option<candle_core::Result<Tensor>> {
    let f16 = |t: &Tensor| t.dtype() == DType::F16;
    if !crate::backend::tuning::get().cudnn_fusion || !f16(x) || !f16(w) || !f16(b) || !residual.is_none_or(f16) {
        return None;
    }
    let key = FusedKey { conv: Key::new(x, w, padding, stride, 1, true)?, act, residual: residual.is_some() };
    let declined = || matches!(DECIDED.with(|d| d.borrow().get(&key).map(|s| s.is_some())), Some(false));
    if declined() {
        return None;
    }
    match fused(&key, x, w, b, residual) {
        Err(e) if !crate::backend::oom::is_oom(&e) && declined() => {
            tracing::debug!(reason = %e, shape = ?key, "convolution not fused");
            None
        }
        r => Some(r),
    }
}

/// A convolution shape with the epilogue fused into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FusedKey {
    conv: Key,
    /// SiLU after the bias.
    act: bool,
    /// A residual added last.
    residual: bool,
}

thread_local! {
    /// Per shape: its fused plan, or `None` where it is not fused.
    static DECIDED: RefCell<HashMap<FusedKey, Option<Fused>>> = RefCell::new(HashMap::new());
}

/// A cuDNN backend descriptor, destroyed on drop.
struct Desc(sys::cudnnBackendDescriptor_t);

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by `cudnnBackendCreateDescriptor` and destroyed only here.
        let _ = unsafe { sys::cudnnBackendDestroyDescriptor(self.0) };
    }
}

impl Desc {
    fn new(kind: D) -> candle_core::Result<Self> {
        let mut raw: sys::cudnnBackendDescriptor_t = std::ptr::null_mut();
        // SAFETY: `raw` is a local out-pointer.
        unsafe { sys::cudnnBackendCreateDescriptor(kind, &mut raw) }.result().map_err(|e| err(&format!("create {kind:?}"), e))?;
        Ok(Self(raw))
    }

    /// Sets attribute `name` to the elements of `vals`.
    ///
    /// # Safety
    /// `V` must be the C type cuDNN reads for `ty` (the typed setters below pair them).
    unsafe fn set<V>(self, name: A, ty: T, vals: &[V]) -> candle_core::Result<Self> {
        let n = vals.len() as i64;
        // SAFETY: `self.0` is a live descriptor; `vals` holds `n` elements of the C type of `ty`
        // (the caller's contract), read during the call only.
        unsafe { sys::cudnnBackendSetAttribute(self.0, name, ty, n, vals.as_ptr() as *const c_void) }
            .result()
            .map_err(|e| err(&format!("set {name:?}"), e))?;
        Ok(self)
    }

    fn i64s(self, name: A, v: &[i64]) -> candle_core::Result<Self> {
        // SAFETY: CUDNN_TYPE_INT64 is int64_t.
        unsafe { self.set(name, T::CUDNN_TYPE_INT64, v) }
    }

    fn float(self, name: A, v: f32) -> candle_core::Result<Self> {
        // SAFETY: CUDNN_TYPE_FLOAT is float.
        unsafe { self.set(name, T::CUDNN_TYPE_FLOAT, &[v]) }
    }

    fn data_type(self, name: A, v: sys::cudnnDataType_t) -> candle_core::Result<Self> {
        // SAFETY: CUDNN_TYPE_DATA_TYPE is the C enum cudnnDataType_t (an int, as the repr(u32) enum).
        unsafe { self.set(name, T::CUDNN_TYPE_DATA_TYPE, &[v]) }
    }

    fn boolean(self, name: A, v: bool) -> candle_core::Result<Self> {
        // SAFETY: CUDNN_TYPE_BOOLEAN is C's one-byte bool, as Rust's.
        unsafe { self.set(name, T::CUDNN_TYPE_BOOLEAN, &[v]) }
    }

    fn descs(self, name: A, v: &[&Desc]) -> candle_core::Result<Self> {
        let raw: Vec<sys::cudnnBackendDescriptor_t> = v.iter().map(|d| d.0).collect();
        // SAFETY: CUDNN_TYPE_BACKEND_DESCRIPTOR is cudnnBackendDescriptor_t; each is live.
        unsafe { self.set(name, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw) }
    }

    fn handle(self, name: A, v: sys::cudnnHandle_t) -> candle_core::Result<Self> {
        // SAFETY: CUDNN_TYPE_HANDLE is cudnnHandle_t; the handle outlives the descriptors
        // (per-thread handles live as long as the thread's plans).
        unsafe { self.set(name, T::CUDNN_TYPE_HANDLE, &[v]) }
    }

    fn conv_mode(self, name: A, v: sys::cudnnConvolutionMode_t) -> candle_core::Result<Self> {
        // SAFETY: CUDNN_TYPE_CONVOLUTION_MODE is the C enum cudnnConvolutionMode_t.
        unsafe { self.set(name, T::CUDNN_TYPE_CONVOLUTION_MODE, &[v]) }
    }

    fn pointwise_mode(self, name: A, v: sys::cudnnPointwiseMode_t) -> candle_core::Result<Self> {
        // SAFETY: CUDNN_TYPE_POINTWISE_MODE is the C enum cudnnPointwiseMode_t.
        unsafe { self.set(name, T::CUDNN_TYPE_POINTWISE_MODE, &[v]) }
    }

    fn heur_mode(self, name: A, v: sys::cudnnBackendHeurMode_t) -> candle_core::Result<Self> {
        // SAFETY: CUDNN_TYPE_HEUR_MODE is the C enum cudnnBackendHeurMode_t.
        unsafe { self.set(name, T::CUDNN_TYPE_HEUR_MODE, &[v]) }
    }

    fn finalize(self) -> candle_core::Result<Self> {
        // SAFETY: a live descriptor whose required attributes were set above.
        unsafe { sys::cudnnBackendFinalize(self.0) }.result().map_err(|e| err("finalize", e))?;
        Ok(self)
    }

    /// Reads attribute `name` into `out` (elements of cuDNN type `ty`); the count cuDNN has.
    ///
    /// # Safety
    /// `V` must be the C type cuDNN writes for `ty`; for descriptor types, each element of `out`
    /// a live descriptor of the kind cuDNN fills.
    unsafe fn get<V>(&self, name: A, ty: T, out: &mut [V]) -> candle_core::Result<usize> {
        let mut n = 0i64;
        // an empty `out` asks for the count only
        let ptr = if out.is_empty() { std::ptr::null_mut() } else { out.as_mut_ptr() as *mut c_void };
        // SAFETY: `self.0` is a live descriptor; `ptr` has room for `out.len()` elements of the
        // C type of `ty` (the caller's contract), or is null for none; the count goes to a local.
        unsafe { sys::cudnnBackendGetAttribute(self.0, name, ty, out.len() as i64, &mut n, ptr) }
            .result()
            .map_err(|e| err(&format!("get {name:?}"), e))?;
        Ok(n.max(0) as usize)
    }

    /// One INT64 attribute of a finalized descriptor.
    fn get_i64(&self, name: A) -> candle_core::Result<i64> {
        let mut v = [0i64];
        // SAFETY: CUDNN_TYPE_INT64 is int64_t.
        unsafe { self.get(name, T::CUDNN_TYPE_INT64, &mut v) }?;
        Ok(v[0])
    }
}

/// A tensor of the graph: NCHW-ordered `dims` laid out channels last.
fn tensor(uid: i64, dims: [i32; 4], data_type: sys::cudnnDataType_t, virtual_: bool) -> candle_core::Result<Desc> {
    let [n, c, h, w] = dims.map(i64::from);
    Desc::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?
        .data_type(A::CUDNN_ATTR_TENSOR_DATA_TYPE, data_type)?
        .i64s(A::CUDNN_ATTR_TENSOR_DIMENSIONS, &[n, c, h, w])?
        .i64s(A::CUDNN_ATTR_TENSOR_STRIDES, &[h * w * c, 1, w * c, c])?
        .i64s(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[uid])?
        .i64s(A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[ALIGN as i64])?
        .boolean(A::CUDNN_ATTR_TENSOR_IS_VIRTUAL, virtual_)?
        .finalize()
}

/// A pointwise operation of `mode` (FP32 arithmetic) on `x` (and `b`) into `y`, and the
/// descriptor of its arithmetic.
fn pointwise(mode: sys::cudnnPointwiseMode_t, x: &Desc, b: Option<&Desc>, y: &Desc) -> candle_core::Result<(Desc, Option<Desc>)> {
    let pw = Desc::new(D::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?
        .pointwise_mode(A::CUDNN_ATTR_POINTWISE_MODE, mode)?
        .data_type(A::CUDNN_ATTR_POINTWISE_MATH_PREC, sys::cudnnDataType_t::CUDNN_DATA_FLOAT)?
        .finalize()?;
    let op = Desc::new(D::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?
        .descs(A::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[&pw])?
        .descs(A::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &[x])?;
    let op = match b {
        Some(b) => op.descs(A::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, &[b])?,
        None => op,
    };
    Ok((op.descs(A::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &[y])?.finalize()?, Some(pw)))
}

/// An operation graph and every descriptor it was made of, kept alive as long as a plan of it
/// (as cuDNN's own frontend keeps them).
struct Graph {
    graph: Desc,
    _parts: Vec<Desc>,
}

/// The operation graph of `key`: convolution (FP32 accumulation) -> + bias -> SiLU, with FP32
/// intermediates and f16 input, filter, bias and output.
fn operation_graph(handle: sys::cudnnHandle_t, key: &FusedKey) -> candle_core::Result<Graph> {
    use sys::cudnnDataType_t::{CUDNN_DATA_FLOAT as F32, CUDNN_DATA_HALF as F16};
    let k = &key.conv;
    let y_dims = k.y_dims();
    let x = tensor(UID_X, k.x, F16, false)?;
    let w = tensor(UID_W, k.w, F16, false)?;
    let b = tensor(UID_B, [1, k.w[0], 1, 1], F16, false)?;
    let y = tensor(UID_Y, y_dims, F16, false)?;
    let conv_out = tensor(UID_CONV, y_dims, F32, true)?;
    let (p, s) = (i64::from(k.pad), i64::from(k.stride));
    let conv = Desc::new(D::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?
        .data_type(A::CUDNN_ATTR_CONVOLUTION_COMP_TYPE, F32)?
        .conv_mode(A::CUDNN_ATTR_CONVOLUTION_CONV_MODE, sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION)?
        .i64s(A::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, &[2])?
        .i64s(A::CUDNN_ATTR_CONVOLUTION_DILATIONS, &[1, 1])?
        .i64s(A::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, &[s, s])?
        .i64s(A::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, &[p, p])?
        .i64s(A::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, &[p, p])?
        .finalize()?;
    let conv_op = Desc::new(D::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR)?
        .descs(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, &[&x])?
        .descs(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, &[&w])?
        .descs(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, &[&conv_out])?
        .descs(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, &[&conv])?
        .float(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, 1.0)?
        .float(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, 0.0)?
        .finalize()
        .map(|op| (op, None))?;
    use sys::cudnnPointwiseMode_t::{CUDNN_POINTWISE_ADD, CUDNN_POINTWISE_SWISH_FWD};
    let r = if key.residual { Some(tensor(UID_R, y_dims, F16, false)?) } else { None };
    // + bias, SiLU, + residual: each stage's output FP32 and virtual but the last's, `y`
    let mut stages = vec![(CUDNN_POINTWISE_ADD, Some(&b))];
    if key.act {
        stages.push((CUDNN_POINTWISE_SWISH_FWD, None));
    }
    if let Some(r) = &r {
        stages.push((CUDNN_POINTWISE_ADD, Some(r)));
    }
    let mut ops = vec![conv_op];
    let mut parts = vec![x, w, conv];
    let (mut input, mut y) = (conv_out, Some(y));
    for (i, &(mode, other)) in stages.iter().enumerate() {
        let out = if i + 1 == stages.len() {
            y.take().ok_or_else(|| candle_core::Error::Msg("fused convolution: output taken twice".into()))?
        } else {
            tensor(UID_STAGES + i as i64, y_dims, F32, true)?
        };
        ops.push(pointwise(mode, &input, other, &out)?);
        parts.push(std::mem::replace(&mut input, out));
    }
    parts.push(input);
    let refs: Vec<&Desc> = ops.iter().map(|(op, _)| op).collect();
    let graph = Desc::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?
        .handle(A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE, handle)?
        .descs(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, &refs)?
        .finalize()?;
    parts.push(b);
    parts.extend(r);
    for (op, pw) in ops {
        parts.push(op);
        parts.extend(pw);
    }
    Ok(Graph { graph, _parts: parts })
}

/// An execution plan of the fused graph, the workspace it needs, and what it was made from
/// (dropped after it, in field order).
struct Fused {
    plan: Desc,
    workspace: usize,
    _config: Desc,
    _graph: Rc<Graph>,
}

/// Whether the engine of `config` computes as the unfused path's admitted algorithms do: FP32
/// accumulation, no FFT or Winograd (cuDNN's numerical notes).
fn exact(config: &Desc) -> candle_core::Result<bool> {
    use sys::cudnnBackendNumericalNote_t as N;
    let engine = Desc::new(D::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
    // SAFETY: `config` is an engine config the heuristics filled; the one element is a live
    // engine descriptor for cuDNN to fill.
    unsafe { config.get(A::CUDNN_ATTR_ENGINECFG_ENGINE, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &mut [engine.0]) }?;
    // read as plain C ints: a note this build's bindings do not list is not a valid Rust enum
    let mut notes = [u32::MAX; 32];
    // SAFETY: CUDNN_TYPE_NUMERICAL_NOTE is a C enum (an int).
    let n = unsafe { engine.get(A::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, T::CUDNN_TYPE_NUMERICAL_NOTE, &mut notes) }?;
    let inexact = [
        N::CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION,
        N::CUDNN_NUMERICAL_NOTE_FFT,
        N::CUDNN_NUMERICAL_NOTE_WINOGRAD,
        N::CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4,
        N::CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6,
        N::CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13,
    ]
    .map(|v| v as u32);
    Ok(notes[..n.min(notes.len())].iter().all(|v| !inexact.contains(v)))
}

/// The heuristics' first [`MAX_PLANS`] plans of `graph` that compute exactly ([`exact`]) and
/// build, from its first [`MAX_CONFIGS`] engine configs.
fn build_plans(handle: sys::cudnnHandle_t, graph: Graph) -> candle_core::Result<Vec<Fused>> {
    let graph = Rc::new(graph);
    let heur = Desc::new(D::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?
        .descs(A::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[&graph.graph])?
        .heur_mode(A::CUDNN_ATTR_ENGINEHEUR_MODE, sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A)?
        .finalize()?;
    // SAFETY: an empty `out` asks for the count only.
    let available =
        unsafe { heur.get::<sys::cudnnBackendDescriptor_t>(A::CUDNN_ATTR_ENGINEHEUR_RESULTS, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &mut []) }?;
    let configs = (0..available.min(MAX_CONFIGS))
        .map(|_| Desc::new(D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
        .collect::<candle_core::Result<Vec<_>>>()?;
    let mut raw: Vec<sys::cudnnBackendDescriptor_t> = configs.iter().map(|c| c.0).collect();
    // SAFETY: `raw` holds live engine-config descriptors for cuDNN to fill.
    let got = unsafe { heur.get(A::CUDNN_ATTR_ENGINEHEUR_RESULTS, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &mut raw) }?;
    let mut plans = Vec::new();
    for config in configs.into_iter().take(got) {
        if plans.len() == MAX_PLANS {
            break;
        }
        match exact(&config) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "fused convolution engine's numerical notes unreadable");
                continue;
            }
        }
        let built = Desc::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)
            .and_then(|p| p.handle(A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle))
            .and_then(|p| p.descs(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[&config]))
            .and_then(Desc::finalize)
            .and_then(|plan| {
                let ws = plan.get_i64(A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?;
                Ok(Fused { plan, workspace: ws.max(0) as usize, _config: config, _graph: graph.clone() })
            });
        match built {
            Ok(f) => plans.push(f),
            Err(e) => tracing::debug!(error = %e, "fused convolution plan did not build"),
        }
    }
    Ok(plans)
}

/// Runs `plan` on the buffers at `ptrs` (by tensor id) with `ws` as scratch.
///
/// # Safety
/// The pointers are device buffers of the plan's key (input, filter, bias, output, and the
/// residual where the key has one), aligned to [`ALIGN`] bytes; `ws` holds at least the plan's
/// workspace (or is null for none); all stay valid until the work enqueued here has run on the
/// handle's stream.
unsafe fn execute(handle: sys::cudnnHandle_t, plan: &Desc, ptrs: &[(i64, u64)], ws: *mut c_void) -> candle_core::Result<()> {
    let ids: Vec<i64> = ptrs.iter().map(|p| p.0).collect();
    let data: Vec<*mut c_void> = ptrs.iter().map(|p| p.1 as *mut c_void).collect();
    // SAFETY: CUDNN_TYPE_VOID_PTR is void*; the pointers are the caller's.
    let pack = unsafe {
        Desc::new(D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?
            .i64s(A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, &ids)?
            .set(A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, T::CUDNN_TYPE_VOID_PTR, &data)?
            .set(A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE, T::CUDNN_TYPE_VOID_PTR, &[ws])?
            .finalize()?
    };
    // SAFETY: a finalized plan and variant pack whose buffers the caller vouches for.
    unsafe { sys::cudnnBackendExecute(handle, plan.0, pack.0) }.result().map_err(|e| err("fused convolution", e))
}

/// The f16 values of a contiguous CUDA tensor, from its first element.
fn f16_view<'a>(
    storage: &'a candle_core::Storage,
    layout: &Layout,
) -> candle_core::Result<candle_core::cuda_backend::cudarc::driver::CudaView<'a, f16>> {
    match storage {
        candle_core::Storage::Cuda(s) if layout.is_contiguous() => Ok(s.as_cuda_slice::<f16>()?.slice(layout.start_offset()..)),
        _ => candle_core::bail!("cudnn-conv-bias-act: a contiguous f16 CUDA tensor"),
    }
}

/// Decides `key` on first use, then runs its fused plan into a new tensor (an error where the
/// shape is not fused).
fn fused(key: &FusedKey, x: &Tensor, w: &Tensor, b: &Tensor, residual: Option<&Tensor>) -> candle_core::Result<Tensor> {
    let candle_core::Device::Cuda(dev) = x.device() else { candle_core::bail!("cudnn-conv-bias-act: CUDA only") };
    let [n, k, h, wd] = key.conv.y_dims().map(|v| v.max(0) as usize);
    if n * k * h * wd == 0 {
        candle_core::bail!("cudnn-conv-bias-act: empty output for {key:?}");
    }
    let (x, w, b) = (x.contiguous()?, w.contiguous()?, b.contiguous()?);
    let residual = match residual {
        Some(r) if r.dims() != [n, h, wd, k] => {
            candle_core::bail!("cudnn-conv-bias-act: residual {:?} for an output of {:?}", r.dims(), [n, h, wd, k])
        }
        Some(r) => Some(r.contiguous()?),
        None => None,
    };
    let (xs, xl) = x.storage_and_layout();
    let (ws, wl) = w.storage_and_layout();
    let (bs, bl) = b.storage_and_layout();
    let rs = residual.as_ref().map(|r| r.storage_and_layout());
    let (xv, wv, bv) = (f16_view(&xs, xl)?, f16_view(&ws, wl)?, f16_view(&bs, bl)?);
    let rv = match &rs {
        Some((s, l)) => Some(f16_view(s, l)?),
        None => None,
    };
    // SAFETY: fully written by the fused kernel (or by the timing runs, then by it).
    let mut y = unsafe { dev.alloc::<f16>(n * k * h * wd)? };
    let handle = handle(dev)?;
    let stream = dev.cuda_stream();
    {
        let mut yv = y.slice_mut(..);
        if !DECIDED.with(|d| d.borrow().contains_key(key)) {
            let decided = decide(handle, dev, key, (&xv, &wv, &bv, rv.as_ref()), &mut yv)?;
            DECIDED.with(|d| d.borrow_mut().insert(*key, decided));
        }
        let (xp, _gx) = xv.device_ptr(&stream);
        let (wp, _gw) = wv.device_ptr(&stream);
        let (bp, _gb) = bv.device_ptr(&stream);
        let (yp, _gy) = yv.device_ptr_mut(&stream);
        let r = rv.as_ref().map(|r| r.device_ptr(&stream));
        let mut ptrs = vec![(UID_X, xp), (UID_W, wp), (UID_B, bp), (UID_Y, yp)];
        ptrs.extend(r.as_ref().map(|(rp, _)| (UID_R, *rp)));
        if ptrs.iter().any(|(_, p)| p % ALIGN != 0) {
            candle_core::bail!("cudnn-conv-bias-act: a buffer not aligned to {ALIGN} bytes");
        }
        DECIDED.with(|d| {
            let d = d.borrow();
            let Some(Some(fused)) = d.get(key) else { candle_core::bail!("cudnn-conv-bias-act: {key:?} is not fused") };
            // SAFETY: uninitialised scratch space for cuDNN.
            let mut scratch = if fused.workspace > 0 { Some(unsafe { dev.alloc::<u8>(fused.workspace)? }) } else { None };
            let (sp, _gs) = scratch_ptr(&mut scratch, &stream);
            // SAFETY: the plan was built for `key`, which holds these buffers' shapes and dtype
            // (the residual's checked above); the pointers are aligned (checked above) and kept
            // alive and ordered on the stream by the guards; the scratch holds the plan's
            // workspace.
            unsafe { execute(handle, &fused.plan, &ptrs, sp) }
        })?;
    }
    let storage = CudaStorage::wrap_cuda_slice(y, dev.clone());
    Ok(Tensor::from_storage(candle_core::Storage::Cuda(storage), (n, h, wd, k), candle_core::op::BackpropOp::none(), false))
}

/// The raw pointer of an optional scratch buffer (null without one), with its stream guard.
fn scratch_ptr<'a>(
    ws: &'a mut Option<CudaSlice<u8>>,
    stream: &'a candle_core::cuda_backend::cudarc::driver::CudaStream,
) -> (*mut c_void, Option<candle_core::cuda_backend::cudarc::driver::SyncOnDrop<'a>>) {
    match ws.as_mut() {
        Some(b) => {
            let (p, g) = b.device_ptr_mut(stream);
            (p as *mut c_void, Some(g))
        }
        None => (std::ptr::null_mut(), None),
    }
}

type View<'a> = candle_core::cuda_backend::cudarc::driver::CudaView<'a, f16>;

/// Times the unfused convolution and the fused graph's plans on the call's own buffers and
/// returns the fastest fused plan where it is no slower than the convolution alone.
fn decide(
    handle: sys::cudnnHandle_t,
    dev: &CudaDevice,
    key: &FusedKey,
    (x, w, b, r): (&View, &View, &View, Option<&View>),
    y: &mut candle_core::cuda_backend::cudarc::driver::CudaViewMut<f16>,
) -> candle_core::Result<Option<Fused>> {
    let Some(unfused) = conv_time(handle, dev, &key.conv, x, w, y)? else {
        return Ok(None);
    };
    if unfused > FUSE_BELOW_MS {
        return Ok(None);
    }
    let t0 = Instant::now();
    let plans = match operation_graph(handle, key).and_then(|g| build_plans(handle, g)) {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!(shape = ?key, error = %e, "no fused convolution graph");
            return Ok(None);
        }
    };
    let built = t0.elapsed();
    let stream = dev.cuda_stream();
    let need = plans.iter().map(|p| p.workspace).max().unwrap_or(0);
    // SAFETY: scratch space for cuDNN.
    let mut scratch = if need > 0 { Some(unsafe { dev.alloc::<u8>(need)? }) } else { None };
    let (xp, _gx) = x.device_ptr(&stream);
    let (wp, _gw) = w.device_ptr(&stream);
    let (bp, _gb) = b.device_ptr(&stream);
    let (yp, _gy) = y.device_ptr_mut(&stream);
    let r = r.map(|r| r.device_ptr(&stream));
    let mut ptrs = vec![(UID_X, xp), (UID_W, wp), (UID_B, bp), (UID_Y, yp)];
    ptrs.extend(r.as_ref().map(|(rp, _)| (UID_R, *rp)));
    if ptrs.iter().any(|(_, p)| p % ALIGN != 0) {
        return Ok(None);
    }
    let (sp, _gs) = scratch_ptr(&mut scratch, &stream);
    let mut best: Option<(usize, f32)> = None;
    for (i, p) in plans.iter().enumerate() {
        // SAFETY: as in `fused`: the plan is `key`'s, the buffers the call's own (aligned,
        // checked above), kept alive and ordered by the guards until `time_runs` has waited for
        // the runs; the scratch holds the largest plan's workspace.
        match time_runs(&stream, || unsafe { execute(handle, &p.plan, &ptrs, sp) }) {
            Ok(t) if best.is_none_or(|(_, b)| t < b) => best = Some((i, t)),
            Ok(_) => {}
            Err(e) if crate::backend::oom::is_oom(&e) => return Err(e),
            Err(e) => tracing::debug!(shape = ?key, plan = i, error = %e, "fused convolution plan failed its timed runs"),
        }
    }
    tracing::debug!(
        shape = ?key,
        unfused,
        fused = ?best.map(|b| b.1),
        chosen = ?best.map(|b| b.0),
        plans = plans.len(),
        build_ms = built.as_secs_f64() * 1e3,
        "fused convolution timed"
    );
    Ok(best.filter(|&(_, t)| t <= unfused).and_then(|(i, _)| plans.into_iter().nth(i)))
}
