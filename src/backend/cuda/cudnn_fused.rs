//! A channels-last f16 convolution with its whole epilogue as one kernel, through cuDNN's graph
//! API (its runtime-fusion engines), where that runs faster than the convolution alone: bias,
//! SiLU, a residual add, and the write into its channels of a concatenation's buffer
//! ([`Out`]); the input may be a channel slice of a wider tensor.
//!
//! The convolutions of [`super::cudnn`] are each followed by one epilogue kernel
//! ([`super::epilogue`]). At small batches a pass is a chain of a few hundred kernels each too
//! small to fill the GPU, so one kernel fewer per convolution is time saved
//! (BENCHMARKS.md, "Every convolution epilogue in the cuDNN kernel").
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
//!
//! With `[tuning] cudnn_fusion_cache`, each decision is also kept in a file
//! ([`crate::backend::fusion_cache`]) and a later process builds only the plan it names, untimed.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::rc::Rc;
use std::time::Instant;

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use candle_core::{CudaDevice, CudaStorage, DType, Layout, Tensor};
use cudarc::cudnn::sys;
use half::f16;

use super::cudnn::{conv_time, err, handle, time_runs, Key};
use crate::backend::fusion_cache::{self, Choice, FusionCache};

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

/// The convolution a fused kernel runs: channels-last f16 weight `(K, R, S, C)` and bias `(K)`.
pub struct ConvParams<'a> {
    pub weight: &'a Tensor,
    pub bias: &'a Tensor,
    pub padding: usize,
    pub stride: usize,
    /// SiLU after the bias.
    pub act: bool,
}

/// Where the fused kernel writes its `(N, OH, OW, K)` output.
#[derive(Clone, Copy)]
pub enum Out<'a> {
    /// A tensor of its own.
    New,
    /// Channels `offset..offset + K` of a new `(N, OH, OW, width)` buffer, the other channels
    /// left for other writers (a concatenation's buffer).
    Wide { width: usize, offset: usize },
    /// Channels `offset..offset + K` of `buf` `(N, OH, OW, width)` (contiguous), in place.
    Into { buf: &'a Tensor, offset: usize },
}

/// `act(conv(x, w) + b) (+ residual)` for channels-last f16 `x` `(N, H, W, C)` (packed, or a
/// slice of the channels of a wider packed tensor) and `residual` `(N, OH, OW, K)` as one cuDNN
/// kernel, written where `out` says; `None` where fusion is off, the layouts do not fit or this
/// shape is not fused (then the caller runs the convolution and its epilogue; the decision is
/// kept). [`Out::Into`] returns `buf`.
pub fn conv_bias_act(x: &Tensor, p: &ConvParams, residual: Option<&Tensor>, out: Out) -> Option<candle_core::Result<Tensor>> {
    let f16 = |t: &Tensor| t.dtype() == DType::F16;
    if !crate::backend::tuning::get().cudnn_fusion || !f16(x) || !f16(p.weight) || !f16(p.bias) || !residual.is_none_or(f16) {
        return None;
    }
    // any other input layout (not packed, not a channel slice) takes the unfused path
    let key = FusedKey::new(x, p, residual.is_some(), &out)?;
    let declined = || matches!(DECIDED.with(|d| d.borrow().get(&key).map(|s| s.is_some())), Some(false));
    if declined() {
        return None;
    }
    match fused(&key, x, p, residual, &out) {
        Ok(y) => y.map(Ok),
        Err(e) if !crate::backend::oom::is_oom(&e) && declined() => {
            tracing::debug!(reason = %e, shape = ?key, "convolution not fused");
            None
        }
        Err(e) => Some(Err(e)),
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
    /// The input's and the output's channel strides: their channels where packed, more where
    /// the input is a channel slice or the output a concatenation's buffer.
    x_width: i32,
    y_width: i32,
    /// Where the output's channels start in its buffer.
    y_offset: i32,
}

impl FusedKey {
    /// `None` where the layouts do not fit the fused kernel: a strided input or output whose
    /// channels, stride or offset are not whole 16-byte units, or an [`Out`] whose buffer does
    /// not take the output.
    fn new(x: &Tensor, p: &ConvParams, residual: bool, out: &Out) -> Option<Self> {
        let conv = Key::new(x, p.weight, p.padding, p.stride, 1, true)?;
        let [n, k, h, w] = conv.y_dims().map(|v| usize::try_from(v).ok());
        let (n, k, h, w) = (n?, k?, h?, w?);
        let c = x.dim(3).ok()?;
        let x_width = channel_stride(x)?;
        let (y_width, y_offset) = match *out {
            Out::New => (k, 0),
            Out::Wide { width, offset } => (width, offset),
            Out::Into { buf, offset } => {
                let (bn, bh, bw, width) = buf.dims4().ok()?;
                let fits =
                    buf.dtype() == DType::F16 && buf.is_contiguous() && buf.layout().start_offset() % 8 == 0 && (bn, bh, bw) == (n, h, w);
                (fits.then_some(width)?, offset)
            }
        };
        // a slice or a concatenation's channels in whole 16-byte units (8 f16)
        let units = |width: usize, c: usize, offset: usize| {
            width == c || (width.is_multiple_of(8) && c.is_multiple_of(8) && offset.is_multiple_of(8))
        };
        if y_offset + k > y_width || !units(x_width, c, x.layout().start_offset()) || !units(y_width, k, y_offset) {
            return None;
        }
        let i = |v: usize| i32::try_from(v).ok();
        Some(Self { conv, act: p.act, residual, x_width: i(x_width)?, y_width: i(y_width)?, y_offset: i(y_offset)? })
    }

    /// The shape as the fusion cache keeps it (without the process's device id).
    fn cached(&self) -> fusion_cache::Shape {
        let k = &self.conv;
        fusion_cache::Shape {
            x: k.x,
            w: k.w,
            stride: k.stride,
            pad: k.pad,
            act: self.act,
            residual: self.residual,
            x_width: self.x_width,
            y_width: self.y_width,
            y_offset: self.y_offset,
        }
    }
}

/// The channel stride of channels-last `x` `(N, H, W, C)` where it is packed or a slice of the
/// channels of a wider packed tensor; `None` for any other layout.
fn channel_stride(x: &Tensor) -> Option<usize> {
    let (_, h, w, c) = x.dims4().ok()?;
    let s = x.stride();
    let width = s[2];
    (s[3] == 1 && width >= c && s[1] == w * width && s[0] == h * w * width).then_some(width)
}

/// Elements from the first of an `(n, h, w, c)` channels-last tensor of channel stride `width`
/// to its last.
fn span(n: usize, h: usize, w: usize, c: usize, width: usize) -> usize {
    (n * h * w * width).saturating_sub(width - c)
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

/// A tensor of the graph: NCHW-ordered `dims` laid out channels last, `width` apart from one
/// pixel to the next (`None`: packed, `dims`' C).
fn tensor(uid: i64, dims: [i32; 4], width: Option<i32>, data_type: sys::cudnnDataType_t, virtual_: bool) -> candle_core::Result<Desc> {
    let [n, c, h, w] = dims.map(i64::from);
    let cw = width.map_or(c, i64::from);
    Desc::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?
        .data_type(A::CUDNN_ATTR_TENSOR_DATA_TYPE, data_type)?
        .i64s(A::CUDNN_ATTR_TENSOR_DIMENSIONS, &[n, c, h, w])?
        .i64s(A::CUDNN_ATTR_TENSOR_STRIDES, &[h * w * cw, 1, w * cw, cw])?
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
    let x = tensor(UID_X, k.x, Some(key.x_width), F16, false)?;
    let w = tensor(UID_W, k.w, None, F16, false)?;
    let b = tensor(UID_B, [1, k.w[0], 1, 1], None, F16, false)?;
    let y = tensor(UID_Y, y_dims, Some(key.y_width), F16, false)?;
    let conv_out = tensor(UID_CONV, y_dims, None, F32, true)?;
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
    let r = if key.residual { Some(tensor(UID_R, y_dims, None, F16, false)?) } else { None };
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
            tensor(UID_STAGES + i as i64, y_dims, None, F32, true)?
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
    /// Its engine config's place in the heuristics and its engine (what the fusion cache keeps).
    choice: Choice,
    _config: Desc,
    _graph: Rc<Graph>,
}

/// The engine of an engine config the heuristics filled.
fn engine_of(config: &Desc) -> candle_core::Result<Desc> {
    let engine = Desc::new(D::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
    // SAFETY: `config` is an engine config the heuristics filled; the one element is a live
    // engine descriptor for cuDNN to fill.
    unsafe { config.get(A::CUDNN_ATTR_ENGINECFG_ENGINE, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &mut [engine.0]) }?;
    Ok(engine)
}

/// Whether `engine` computes as the unfused path's admitted algorithms do: FP32 accumulation, no
/// FFT or Winograd (cuDNN's numerical notes).
fn exact(engine: &Desc) -> candle_core::Result<bool> {
    use sys::cudnnBackendNumericalNote_t as N;
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

/// Which of the heuristics' engine configs [`build_plans`] builds.
#[derive(Clone, Copy)]
enum Configs {
    /// The first [`MAX_PLANS`] that compute exactly ([`exact`]) and build, from the first
    /// [`MAX_CONFIGS`].
    First,
    /// The one a fusion cache kept, if the heuristics still name the same engine there.
    Kept(Choice),
}

/// The plans of `graph` that `which` names.
fn build_plans(handle: sys::cudnnHandle_t, graph: Graph, which: Configs) -> candle_core::Result<Vec<Fused>> {
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
    for (position, config) in configs.into_iter().take(got).enumerate() {
        if plans.len() == MAX_PLANS {
            break;
        }
        if let Configs::Kept(c) = which {
            if position != c.position as usize {
                continue;
            }
        }
        let engine = match engine_of(&config).and_then(|e| Ok((exact(&e)?, e.get_i64(A::CUDNN_ATTR_ENGINE_GLOBAL_INDEX)?))) {
            Ok((true, engine)) => engine,
            Ok((false, _)) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "fused convolution engine's numerical notes unreadable");
                continue;
            }
        };
        let choice = Choice { position: position as u32, engine };
        if let Configs::Kept(kept) = which {
            if kept != choice {
                tracing::debug!(?kept, now = ?choice, "the heuristics name another engine than the fusion cache kept");
                break;
            }
        }
        let built = Desc::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)
            .and_then(|p| p.handle(A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle))
            .and_then(|p| p.descs(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[&config]))
            .and_then(Desc::finalize)
            .and_then(|plan| {
                let ws = plan.get_i64(A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?;
                Ok(Fused { plan, workspace: ws.max(0) as usize, choice, _config: config, _graph: graph.clone() })
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

/// `len` f16 values of a CUDA tensor from its first element.
fn f16_span<'a>(storage: &'a candle_core::Storage, layout: &Layout, len: usize) -> candle_core::Result<View<'a>> {
    let candle_core::Storage::Cuda(s) = storage else { candle_core::bail!("cudnn-conv-bias-act: a CUDA tensor") };
    let start = layout.start_offset();
    s.as_cuda_slice::<f16>()?
        .try_slice(start..start + len)
        .ok_or_else(|| candle_core::Error::Msg(format!("cudnn-conv-bias-act: {len} values from {start} past the buffer")))
}

type View<'a> = candle_core::cuda_backend::cudarc::driver::CudaView<'a, f16>;

/// Decides `key` on first use, then runs its fused plan into the output `out` names:
/// `Ok(None)` where the shape is not fused or the buffers do not fit it (misaligned, or an
/// [`Out::Into`] buffer that is one of the inputs).
fn fused(key: &FusedKey, x: &Tensor, p: &ConvParams, residual: Option<&Tensor>, out: &Out) -> candle_core::Result<Option<Tensor>> {
    let candle_core::Device::Cuda(dev) = x.device() else { candle_core::bail!("cudnn-conv-bias-act: CUDA only") };
    let [n, k, h, wd] = key.conv.y_dims().map(|v| v.max(0) as usize);
    let c = x.dim(3)?;
    if n * k * h * wd * c == 0 {
        candle_core::bail!("cudnn-conv-bias-act: empty input or output for {key:?}");
    }
    let (w, b) = (p.weight.contiguous()?, p.bias.contiguous()?);
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
    let xv = f16_span(&xs, xl, span(n, x.dim(1)?, x.dim(2)?, c, key.x_width as usize))?;
    let (wv, bv) = (f16_span(&ws, wl, w.elem_count())?, f16_span(&bs, bl, b.elem_count())?);
    let rv = match &rs {
        Some((s, l)) => Some(f16_span(s, l, n * h * wd * k)?),
        None => None,
    };
    let handle = handle(dev)?;
    let stream = dev.cuda_stream();
    let inputs = [Some((UID_X, &xv)), Some((UID_W, &wv)), Some((UID_B, &bv)), rv.as_ref().map(|r| (UID_R, r))];
    let guarded: Vec<_> = inputs.iter().flatten().map(|(uid, v)| (*uid, v.device_ptr(&stream))).collect();
    let ptrs: Vec<(i64, u64)> = guarded.iter().map(|(uid, (p, _))| (*uid, *p)).collect();
    if ptrs.iter().any(|(_, p)| p % ALIGN != 0) {
        return Ok(None);
    }
    let y_len = n * h * wd * key.y_width as usize;
    // the output of `Out::New` and `Out::Wide`, which is also the scratch output of the timing
    // runs where the shape is decided
    let mut y = match out {
        // SAFETY: channels `offset..offset + K` are written by the fused kernel (or by the timing
        // runs, then by it); the others are the caller's to fill (`Out::Wide`) or none (`Out::New`).
        Out::New | Out::Wide { .. } => Some(unsafe { dev.alloc::<f16>(y_len)? }),
        Out::Into { .. } => None,
    };
    if !DECIDED.with(|d| d.borrow().contains_key(key)) {
        let decided = match recall(handle, dev, key) {
            Some(kept) => kept,
            None => {
                let decided = match &mut y {
                    Some(y) => decide(handle, dev, key, x, &ptrs, (&xv, &wv), y)?,
                    // SAFETY: scratch output, written by the timed runs and never read.
                    None => decide(handle, dev, key, x, &ptrs, (&xv, &wv), &mut unsafe { dev.alloc::<f16>(y_len)? })?,
                };
                keep(dev, key, decided.as_ref().map(|f| f.choice));
                decided
            }
        };
        DECIDED.with(|d| d.borrow_mut().insert(*key, decided));
    }
    if !matches!(DECIDED.with(|d| d.borrow().get(key).map(Option::is_some)), Some(true)) {
        return Ok(None);
    }
    let elem = std::mem::size_of::<f16>() as u64;
    match (*out, y) {
        (Out::New | Out::Wide { .. }, Some(mut y)) => {
            let (width, offset) = (key.y_width as usize, key.y_offset as usize);
            {
                let (yp, _gy) = y.device_ptr_mut(&stream);
                run(handle, dev, key, &ptrs, yp + offset as u64 * elem)?;
            }
            let storage = CudaStorage::wrap_cuda_slice(y, dev.clone());
            let shape = (n, h, wd, width);
            Ok(Some(Tensor::from_storage(candle_core::Storage::Cuda(storage), shape, candle_core::op::BackpropOp::none(), false)))
        }
        (Out::New | Out::Wide { .. }, None) => candle_core::bail!("cudnn-conv-bias-act: no output buffer"),
        (Out::Into { buf, offset }, _) => {
            // the in-place op locks `buf`'s storage for writing: an input in that storage (its
            // address inside the storage's allocation) would deadlock on the read locks held above
            let shared = match &*buf.storage_and_layout().0 {
                candle_core::Storage::Cuda(s) => {
                    let all = s.as_cuda_slice::<f16>()?;
                    let (start, _g) = all.device_ptr(&stream);
                    let end = start + all.len() as u64 * elem;
                    ptrs.iter().any(|(_, p)| (start..end).contains(p))
                }
                _ => true,
            };
            if shared {
                return Ok(None);
            }
            buf.inplace_op1(&WriteInto { handle, dev, key, ptrs: &ptrs, offset })?;
            Ok(Some(buf.clone()))
        }
    }
}

/// Runs `key`'s fused plan (decided, fused) on the inputs at `ptrs` (by tensor id) with the
/// output's first channel at device address `y`.
fn run(handle: sys::cudnnHandle_t, dev: &CudaDevice, key: &FusedKey, ptrs: &[(i64, u64)], y: u64) -> candle_core::Result<()> {
    if !y.is_multiple_of(ALIGN) {
        candle_core::bail!("cudnn-conv-bias-act: output not aligned to {ALIGN} bytes");
    }
    let stream = dev.cuda_stream();
    DECIDED.with(|d| {
        let d = d.borrow();
        let Some(Some(fused)) = d.get(key) else { candle_core::bail!("cudnn-conv-bias-act: {key:?} is not fused") };
        // SAFETY: uninitialised scratch space for cuDNN.
        let mut scratch = if fused.workspace > 0 { Some(unsafe { dev.alloc::<u8>(fused.workspace)? }) } else { None };
        let (sp, _gs) = scratch_ptr(&mut scratch, &stream);
        let mut all = ptrs.to_vec();
        all.push((UID_Y, y));
        // SAFETY: the plan was built for `key`, which holds these buffers' shapes, strides and
        // dtype (checked by `FusedKey::new` and `fused`); the inputs are aligned (checked in
        // `fused`), the output too (above); the caller's guards keep them alive and ordered on
        // the stream; the scratch holds the plan's workspace.
        unsafe { execute(handle, &fused.plan, &all, sp) }
    })
}

/// [`Out::Into`]: the fused kernel writing into channels `offset..` of the buffer it is applied to.
struct WriteInto<'a> {
    handle: sys::cudnnHandle_t,
    dev: &'a CudaDevice,
    key: &'a FusedKey,
    ptrs: &'a [(i64, u64)],
    offset: usize,
}

impl candle_core::InplaceOp1 for WriteInto<'_> {
    fn name(&self) -> &'static str {
        "cudnn-conv-bias-act-into"
    }

    fn cpu_fwd(&self, _: &mut candle_core::CpuStorage, _: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("cudnn-conv-bias-act-into: CUDA only")
    }

    fn cuda_fwd(&self, storage: &mut CudaStorage, layout: &Layout) -> candle_core::Result<()> {
        let stream = self.dev.cuda_stream();
        let buf = storage.as_cuda_slice_mut::<f16>()?;
        let (bp, _g) = buf.device_ptr_mut(&stream);
        let elem = std::mem::size_of::<f16>() as u64;
        run(self.handle, self.dev, self.key, self.ptrs, bp + (layout.start_offset() + self.offset) as u64 * elem)
    }
}

/// The raw pointer of an optional scratch buffer (null without one), with its stream guard.
fn scratch_ptr<'a>(
    ws: &'a mut Option<CudaSlice<u8>>,
    stream: &'a CudaStream,
) -> (*mut c_void, Option<candle_core::cuda_backend::cudarc::driver::SyncOnDrop<'a>>) {
    match ws.as_mut() {
        Some(b) => {
            let (p, g) = b.device_ptr_mut(stream);
            (p as *mut c_void, Some(g))
        }
        None => (std::ptr::null_mut(), None),
    }
}

/// Times the unfused convolution (on a packed copy of `x` where it is a slice) and the fused
/// graph's plans (on the call's inputs at `ptrs`), both into `scratch_y` (room for `key`'s
/// strided output), and returns the fastest fused plan where it is no slower than the
/// convolution alone.
fn decide(
    handle: sys::cudnnHandle_t,
    dev: &CudaDevice,
    key: &FusedKey,
    x: &Tensor,
    ptrs: &[(i64, u64)],
    (xv, wv): (&View, &View),
    scratch_y: &mut CudaSlice<f16>,
) -> candle_core::Result<Option<Fused>> {
    let [n, k, h, wd] = key.conv.y_dims().map(|v| v.max(0) as usize);
    let packed = if key.x_width == key.conv.x[1] { None } else { Some(x.contiguous()?) };
    let packed_guard = packed.as_ref().map(|t| t.storage_and_layout());
    let xpv = match &packed_guard {
        Some((s, l)) => f16_span(s, l, x.elem_count())?,
        None => xv.slice(..),
    };
    if scratch_y.len() < n * h * wd * key.y_width as usize {
        candle_core::bail!("cudnn-conv-bias-act: scratch output too small for {key:?}");
    }
    let Some(unfused) = conv_time(handle, dev, &key.conv, &xpv, wv, &mut scratch_y.slice_mut(..n * k * h * wd))? else {
        return Ok(None);
    };
    if unfused > FUSE_BELOW_MS {
        return Ok(None);
    }
    let t0 = Instant::now();
    let plans = match operation_graph(handle, key).and_then(|g| build_plans(handle, g, Configs::First)) {
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
    let (yp, _gy) = scratch_y.device_ptr_mut(&stream);
    let mut all = ptrs.to_vec();
    all.push((UID_Y, yp));
    let (sp, _gs) = scratch_ptr(&mut scratch, &stream);
    let mut best: Option<(usize, f32)> = None;
    // every plan's time, in the heuristics' order (how often a later plan wins: what building
    // fewer would lose)
    let mut times = vec![None; plans.len()];
    for (i, p) in plans.iter().enumerate() {
        // SAFETY: the plan is `key`'s; the inputs are the call's own (aligned, checked in
        // `fused`) and the output a fresh allocation of `key`'s strided output, kept alive and
        // ordered by the guards until `time_runs` has waited for the runs; the scratch holds the
        // largest plan's workspace.
        match time_runs(&stream, || unsafe { execute(handle, &p.plan, &all, sp) }) {
            Ok(t) => {
                times[i] = Some(t);
                if best.is_none_or(|(_, b)| t < b) {
                    best = Some((i, t));
                }
            }
            Err(e) if crate::backend::oom::is_oom(&e) => return Err(e),
            Err(e) => tracing::debug!(shape = ?key, plan = i, error = %e, "fused convolution plan failed its timed runs"),
        }
    }
    tracing::debug!(
        shape = ?key,
        unfused,
        fused = ?best.map(|b| b.1),
        chosen = ?best.map(|b| b.0),
        plan_ms = ?times,
        plans = plans.len(),
        build_ms = built.as_secs_f64() * 1e3,
        "fused convolution timed"
    );
    Ok(best.filter(|&(_, t)| t <= unfused).and_then(|(i, _)| plans.into_iter().nth(i)))
}

/// The fusion caches this process opened (`[tuning] cudnn_fusion_cache`), one per GPU model and
/// cuDNN version it runs on; `None` after the file could not be read (decisions are then made
/// anew and not kept).
static CACHES: std::sync::Mutex<Vec<(fusion_cache::Target, Option<FusionCache>)>> = std::sync::Mutex::new(Vec::new());

/// `f` of the fusion cache for `dev`'s GPU model and this cuDNN, opened on first use; `None`
/// without a cache file or where it cannot be used.
fn with_cache<R>(dev: &CudaDevice, f: impl FnOnce(&mut FusionCache) -> R) -> Option<R> {
    let path = crate::backend::tuning::get().cudnn_fusion_cache.as_ref()?;
    let device = dev.cuda_stream().context().name().ok()?;
    let target = fusion_cache::Target::this_build(device, cudarc::cudnn::result::get_version() as u64);
    let mut caches = CACHES.lock().ok()?;
    let at = match caches.iter().position(|(t, _)| *t == target) {
        Some(i) => i,
        None => {
            let cache = match FusionCache::open(path, target.clone()) {
                Ok(c) => {
                    tracing::info!(
                        path = %path.display(),
                        device = %target.device,
                        cudnn = target.cudnn,
                        yolo_edge = %target.yolo_edge,
                        decisions = c.len(),
                        damaged_lines = c.damaged,
                        other_targets = c.other_targets,
                        "fusion cache read"
                    );
                    Some(c)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "fusion cache unusable; fused convolutions are decided anew and not kept");
                    None
                }
            };
            caches.push((target, cache));
            caches.len() - 1
        }
    };
    caches[at].1.as_mut().map(f)
}

/// The decision a fusion cache kept for `key`: not fused, or the kept plan built again;
/// `None` where there is none, or the kept plan no longer builds (then it is decided anew).
fn recall(handle: sys::cudnnHandle_t, dev: &CudaDevice, key: &FusedKey) -> Option<Option<Fused>> {
    match with_cache(dev, |c| c.get(&key.cached()))?? {
        None => Some(None),
        Some(choice) => {
            let t0 = Instant::now();
            match operation_graph(handle, key).and_then(|g| build_plans(handle, g, Configs::Kept(choice))) {
                Ok(mut plans) if plans.len() == 1 => {
                    tracing::debug!(shape = ?key, ?choice, build_ms = t0.elapsed().as_secs_f64() * 1e3, "fused convolution from the fusion cache");
                    plans.pop().map(Some)
                }
                Ok(_) => None,
                Err(e) => {
                    tracing::debug!(shape = ?key, ?choice, error = %e, "the fusion cache's plan did not build; deciding anew");
                    None
                }
            }
        }
    }
}

/// Keeps the decision for `key` in the fusion cache, where there is one.
fn keep(dev: &CudaDevice, key: &FusedKey, fused: Option<Choice>) {
    match with_cache(dev, |c| c.record(key.cached(), fused)) {
        Some(Ok(true)) | None => {}
        Some(Ok(false)) => {
            tracing::debug!(shape = ?key, "fusion cache full ({} bytes); decision kept in memory only", fusion_cache::MAX_BYTES)
        }
        Some(Err(e)) => tracing::warn!(error = %e, "fusion cache not written"),
    }
}
