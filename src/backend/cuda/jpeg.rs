//! JPEG pictures to the network input on the GPU: nvJPEG decodes them into device buffers and
//! the device letterbox ([`super::letterbox`]) resizes and pads them into the u8 input
//! `(B, H, W, 3)`, so no pixel of theirs is decoded or resized on the host.
//!
//! nvJPEG returns YCbCr pictures (4:4:4, 4:2:2, 4:4:0, 4:2:0: nearly every camera's and photo's)
//! as their Y, Cb and Cr planes (a hardware batch only where all of its pictures are such),
//! which the letterbox turns into RGB as libjpeg-turbo, the reference's decoder, does; nvJPEG's
//! own conversion to RGB (what every other picture gets) differs from libjpeg-turbo's by up to
//! 82 levels on real photos, and costs a pass that writes 6 MB per 1080p picture.
//!
//! nvJPEG is loaded at run time (`libnvjpeg.so.13`, then `libnvjpeg.so`); without it
//! [`GpuJpeg::new`] is an error and the caller keeps the CPU decoder. The hardware decoder
//! (`NVJPEG_BACKEND_HARDWARE`, batched) takes the pictures it supports; the default backend
//! decodes the rest one by one. Pictures nvJPEG must not take (not a JPEG, an EXIF orientation
//! other than 1, over the limits, truncated, a stub header: the host decoder's own checks,
//! [`check_jpeg_header`]) or could not decode come back as a [`Fallback`]: the caller decodes them
//! on the host and writes them into their slot ([`GpuJpeg::write_slot`]).
//!
//! Device memory: the decoded pictures and the input go through cudarc on the device's stream
//! (the decode buffer is kept and grown, never shrunk); nvJPEG's own scratch and pinned staging
//! are allocated by nvJPEG itself (its default `cudaMalloc`/`cudaHostAlloc`), outside cudarc.
//!
//! May use: candle's CUDA backend, cudarc, libloading, `vision::preprocess`.

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use candle_core::cuda_backend::cudarc::driver::{CudaEvent, CudaSlice, DevicePtrMut};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaDevice, Tensor};

use super::letterbox::{Chroma, Letterboxer, Sampling, Source};
use crate::vision::preprocess::{
    check_jpeg_header, jpeg_frame_key, DecodeLimits, Fit, ImageError, JpegFrameKey, LetterboxGeometry, Letterboxed, Orientation,
};

/// The library names tried, in order.
const LIBRARIES: [&str; 2] = ["libnvjpeg.so.13", "libnvjpeg.so"];

/// Decoded bytes one decode-and-letterbox round holds at most (more pictures take more rounds,
/// each one launch); a single larger picture (within the limits) still takes a round of its own.
const ROUND_BYTES: usize = 1 << 30;

/// Alignment of each decoded picture in the decode buffer.
const ALIGN: usize = 256;

// nvjpeg.h (CUDA 13.0): the few declarations used here.
type Status = c_int;
type Handle = *mut c_void;
type State = *mut c_void;
type JpegStream = *mut c_void;
type CudaStream = *mut c_void;
const NVJPEG_BACKEND_DEFAULT: c_int = 0;
const NVJPEG_BACKEND_HARDWARE: c_int = 3;
const NVJPEG_OUTPUT_YUV: c_int = 1;
const NVJPEG_OUTPUT_RGBI: c_int = 5;
const NVJPEG_MAX_COMPONENT: usize = 4;

/// `nvjpegImage_t`: with interleaved output only `channel[0]`/`pitch[0]` are used, with planar
/// output the first three.
#[repr(C)]
struct Image {
    channel: [*mut u8; NVJPEG_MAX_COMPONENT],
    pitch: [usize; NVJPEG_MAX_COMPONENT],
}

type CreateEx = unsafe extern "C" fn(c_int, *mut c_void, *mut c_void, c_uint, *mut Handle) -> Status;
type Destroy = unsafe extern "C" fn(Handle) -> Status;
type StateCreate = unsafe extern "C" fn(Handle, *mut State) -> Status;
type StateDestroy = unsafe extern "C" fn(State) -> Status;
type GetImageInfo = unsafe extern "C" fn(Handle, *const u8, usize, *mut c_int, *mut c_int, *mut c_int, *mut c_int) -> Status;
type Decode = unsafe extern "C" fn(Handle, State, *const u8, usize, c_int, *mut Image, CudaStream) -> Status;
type DecodeBatchedInitialize = unsafe extern "C" fn(Handle, State, c_int, c_int, c_int) -> Status;
type DecodeBatched = unsafe extern "C" fn(Handle, State, *const *const u8, *const usize, *mut Image, CudaStream) -> Status;
type StreamCreate = unsafe extern "C" fn(Handle, *mut JpegStream) -> Status;
type StreamDestroy = unsafe extern "C" fn(JpegStream) -> Status;
type StreamParse = unsafe extern "C" fn(Handle, *const u8, usize, c_int, c_int, JpegStream) -> Status;
type StreamParseHeader = unsafe extern "C" fn(Handle, *const u8, usize, JpegStream) -> Status;
type DecodeBatchedSupported = unsafe extern "C" fn(Handle, JpegStream, *mut c_int) -> Status;

/// The entry points, valid while `_lib` is loaded.
struct Api {
    create_ex: CreateEx,
    destroy: Destroy,
    state_create: StateCreate,
    state_destroy: StateDestroy,
    get_image_info: GetImageInfo,
    decode: Decode,
    batched_initialize: DecodeBatchedInitialize,
    batched: DecodeBatched,
    stream_create: StreamCreate,
    stream_destroy: StreamDestroy,
    stream_parse: StreamParse,
    /// Parses the headers only: what the support check reads, without walking the whole
    /// bitstream (as costly on the host as the decode call itself). Older libraries lack it.
    stream_parse_header: Option<StreamParseHeader>,
    batched_supported: DecodeBatchedSupported,
    _lib: libloading::Library,
}

impl Api {
    fn load() -> Result<Self, JpegError> {
        let mut reasons = Vec::new();
        let mut found = None;
        for name in LIBRARIES {
            // SAFETY: loading NVIDIA's nvJPEG, whose initialisers have no preconditions.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => {
                    found = Some((name, lib));
                    break;
                }
                Err(e) => reasons.push(format!("{name}: {e}")),
            }
        }
        let Some((name, lib)) = found else {
            return Err(JpegError::Missing(reasons.join("; ")));
        };
        macro_rules! sym {
            ($t:ty, $s:literal) => {
                // SAFETY: `$t` is the signature nvjpeg.h (CUDA 13.0) declares for this symbol; the
                // pointer is kept only as long as `lib` (moved into the same `Api`).
                *unsafe { lib.get::<$t>(concat!($s, "\0").as_bytes()) }.map_err(|_| JpegError::Symbol { lib: name, symbol: $s })?
            };
        }
        Ok(Self {
            create_ex: sym!(CreateEx, "nvjpegCreateEx"),
            destroy: sym!(Destroy, "nvjpegDestroy"),
            state_create: sym!(StateCreate, "nvjpegJpegStateCreate"),
            state_destroy: sym!(StateDestroy, "nvjpegJpegStateDestroy"),
            get_image_info: sym!(GetImageInfo, "nvjpegGetImageInfo"),
            decode: sym!(Decode, "nvjpegDecode"),
            batched_initialize: sym!(DecodeBatchedInitialize, "nvjpegDecodeBatchedInitialize"),
            batched: sym!(DecodeBatched, "nvjpegDecodeBatched"),
            stream_create: sym!(StreamCreate, "nvjpegJpegStreamCreate"),
            stream_destroy: sym!(StreamDestroy, "nvjpegJpegStreamDestroy"),
            stream_parse: sym!(StreamParse, "nvjpegJpegStreamParse"),
            // SAFETY: as for `sym!`: the signature nvjpeg.h declares, kept no longer than `lib`.
            stream_parse_header: unsafe { lib.get::<StreamParseHeader>(b"nvjpegJpegStreamParseHeader\0") }.ok().map(|f| *f),
            batched_supported: sym!(DecodeBatchedSupported, "nvjpegDecodeBatchedSupported"),
            _lib: lib,
        })
    }
}

/// An `nvjpegStatus_t` other than success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvjpegStatus(pub i32);

impl std::fmt::Display for NvjpegStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.0 {
            1 => "NOT_INITIALIZED",
            2 => "INVALID_PARAMETER",
            3 => "BAD_JPEG",
            4 => "JPEG_NOT_SUPPORTED",
            5 => "ALLOCATOR_FAILURE",
            6 => "EXECUTION_FAILED",
            7 => "ARCH_MISMATCH",
            8 => "INTERNAL_ERROR",
            9 => "IMPLEMENTATION_NOT_SUPPORTED",
            10 => "INCOMPLETE_BITSTREAM",
            _ => "unknown status",
        };
        write!(f, "NVJPEG_STATUS_{name} ({})", self.0)
    }
}

fn check(call: &'static str, status: Status) -> Result<(), (&'static str, NvjpegStatus)> {
    if status == 0 {
        Ok(())
    } else {
        Err((call, NvjpegStatus(status)))
    }
}

/// Why GPU decoding is not available; the CPU decoder is used instead.
#[derive(Debug, thiserror::Error)]
pub enum JpegError {
    #[error("nvJPEG library not found ({0}); pictures are decoded on the CPU")]
    Missing(String),
    #[error("{lib} has no `{symbol}`; pictures are decoded on the CPU")]
    Symbol { lib: &'static str, symbol: &'static str },
    #[error("{call} failed: {status}; pictures are decoded on the CPU")]
    Nvjpeg { call: &'static str, status: NvjpegStatus },
    #[error("CUDA: {0}; pictures are decoded on the CPU")]
    Cuda(String),
}

/// Why one picture was not decoded on the GPU: the caller decodes it on the host and writes it
/// into its slot with [`GpuJpeg::write_slot`] (until then the slot holds the pad value).
#[derive(Debug, Clone, thiserror::Error)]
pub enum Fallback {
    #[error("not a JPEG")]
    NotJpeg,
    /// The host decoder's checks refused it (size, dimensions, truncated, stub header, corrupt);
    /// the host decode will say the same.
    #[error("{0}")]
    Refused(String),
    #[error("EXIF orientation {0:?}, which nvJPEG does not apply")]
    Orientation(Orientation),
    #[error("nvJPEG cannot take it: {0}")]
    Unsupported(String),
    #[error("{call}: {status}")]
    Nvjpeg { call: &'static str, status: NvjpegStatus },
}

impl From<(&'static str, NvjpegStatus)> for Fallback {
    fn from((call, status): (&'static str, NvjpegStatus)) -> Self {
        Fallback::Nvjpeg { call, status }
    }
}

/// One nvJPEG handle with its decoding state.
struct Decoder {
    handle: Handle,
    state: State,
}

/// The hardware decoder, with the parsed stream its support check reads and the checks' answers
/// per frame header.
struct Hardware {
    dec: Decoder,
    stream: JpegStream,
    /// Whether the hardware decoder takes a file, per [`JpegFrameKey`]: a camera's or a folder's
    /// pictures share one, so the check (parsing the headers in nvJPEG, ~0.05 ms a picture on the
    /// one thread that feeds the GPU) runs once per kind of file. A wrong answer costs time only:
    /// a batch the hardware refuses is decoded one by one on the default backend.
    supported: HashMap<JpegFrameKey, bool>,
}

/// Frame headers whose support answer is kept; past this many the answers are dropped and
/// checked again (a source of ever-new frame headers costs the check, not memory).
const SUPPORT_KEYS: usize = 64;

struct Inner {
    /// The default backend: every picture the hardware decoder does not take.
    default: Decoder,
    hardware: Option<Hardware>,
    /// Decoded pictures of the current round (grown, never shrunk).
    buf: Option<CudaSlice<u8>>,
    /// Recorded after the last letterbox launch that reads `buf`: nvJPEG writes `buf` only after it.
    read: Option<CudaEvent>,
    letterbox: Letterboxer,
}

/// Host time the decoding calls took, summed over calls ([`GpuJpeg::take_profile`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct JpegProfile {
    /// Pictures the calls were given.
    pub pictures: usize,
    /// Reading each header (nvJPEG's own reading, and the host checks where not done before).
    pub plan: Duration,
    /// The hardware decoder's support check of each picture (parsing its headers), or looking up
    /// the answer kept for its frame header.
    pub parse: Duration,
    /// The decode calls themselves (they queue the work and return).
    pub decode: Duration,
    /// Waiting for the device to finish decoding (and letterboxing, queued behind the decode);
    /// near zero where [`GpuJpeg::decode_letterbox_then`]'s work waited for it already.
    pub wait: Duration,
    /// Queueing the letterbox.
    pub letterbox: Duration,
}

impl std::ops::AddAssign for JpegProfile {
    fn add_assign(&mut self, o: Self) {
        self.pictures += o.pictures;
        self.plan += o.plan;
        self.parse += o.parse;
        self.decode += o.decode;
        self.wait += o.wait;
        self.letterbox += o.letterbox;
    }
}

impl std::fmt::Display for JpegProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let per = |d: Duration| d.as_secs_f64() * 1e3 / self.pictures.max(1) as f64;
        write!(
            f,
            "{} pictures; ms per picture: headers {:.3}, support check {:.3}, decode calls {:.3}, waiting for the device {:.3}, letterbox {:.3}",
            self.pictures,
            per(self.plan),
            per(self.parse),
            per(self.decode),
            per(self.wait),
            per(self.letterbox)
        )
    }
}

/// nvJPEG decoding and the device letterbox for one CUDA device: `lanes` decoders, each used by
/// one thread at a time on that thread's stream, so that as many threads decode at once.
pub struct GpuJpeg {
    lanes: Vec<Mutex<Inner>>,
    /// Whether the hardware decoder returns planes (Y, Cb, Cr) for the letterbox to convert,
    /// where every picture of its batch is YCbCr in a sampling the letterbox takes; else RGB.
    planar: bool,
    profile: Mutex<JpegProfile>,
    dev: CudaDevice,
    backend: &'static str,
    api: Api,
}

// SAFETY: the nvJPEG handles and states of a lane are used only under that lane's lock, one thread
// at a time, as nvJPEG requires of a state; the handles themselves may be used from any thread.
unsafe impl Send for GpuJpeg {}
// SAFETY: as for Send: every use of the raw handles goes through the lock.
unsafe impl Sync for GpuJpeg {}

/// A decoded, letterboxed batch `(B, H, W, 3)` u8 on the device, with per picture its geometry
/// or why it was not decoded there.
pub type Decoded = (Tensor, Vec<Result<LetterboxGeometry, Fallback>>);

/// `rgb`'s room (`w * 3` bytes by `h` rows) as planes: Y (`w` by `h`), then Cb and Cr.
fn planes(rgb: &Source, sampling: Sampling) -> Source {
    let (w, h) = (rgb.w as usize, rgb.h as usize);
    let (cw, ch) = sampling.size(rgb.w, rgb.h);
    let cb = rgb.offset + w * h;
    let cr = cb + cw as usize * ch as usize;
    Source { offset: rgb.offset, pitch: w, w: rgb.w, h: rgb.h, chroma: Some(Chroma { cb, cr, pitch: cw as usize, sampling }) }
}

/// What is done with one picture.
enum Plan {
    Decode {
        w: u32,
        h: u32,
        g: LetterboxGeometry,
        /// The chroma planes' sampling, where there are three components in one the device
        /// letterbox upsamples.
        sampling: Option<Sampling>,
    },
    /// `shape`: the input this picture needs, where its header says it.
    Fallback { why: Fallback, shape: Option<(u32, u32)> },
}

impl GpuJpeg {
    /// Loads nvJPEG and makes `lanes` (at least 1) sets of its decoders for `dev`: the hardware
    /// one where the GPU has it, and always the default one.
    pub fn new(dev: &CudaDevice, lanes: usize) -> Result<Self, JpegError> {
        let api = Api::load()?;
        let stream = dev.cuda_stream();
        stream.context().bind_to_thread().map_err(|e| JpegError::Cuda(e.to_string()))?;
        let mut made: Vec<Mutex<Inner>> = Vec::with_capacity(lanes.max(1));
        let mut backend = "default";
        for _ in 0..lanes.max(1) {
            match Self::lane(&api) {
                Ok((inner, b)) => {
                    backend = b;
                    made.push(Mutex::new(inner));
                }
                Err(e) => {
                    for l in &mut made {
                        Self::destroy_lane(&api, l.get_mut().unwrap_or_else(|p| p.into_inner()));
                    }
                    return Err(e);
                }
            }
        }
        Ok(Self { lanes: made, planar: true, profile: Mutex::default(), dev: dev.clone(), backend, api })
    }

    /// With `planar` off the hardware decoder always returns RGB, converted by nvJPEG (the
    /// self-check compares both ways).
    pub(crate) fn with_planar(mut self, planar: bool) -> Self {
        self.planar = planar;
        self
    }

    /// Decoders that may run at once ([`GpuJpeg::new`]).
    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// The host time spent in decoding calls since the last take.
    pub fn take_profile(&self) -> JpegProfile {
        std::mem::take(&mut *self.profile.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// One set of decoders and its backend's name.
    fn lane(api: &Api) -> Result<(Inner, &'static str), JpegError> {
        let default = Self::decoder(api, NVJPEG_BACKEND_DEFAULT).map_err(|(call, status)| JpegError::Nvjpeg { call, status })?;
        let hardware = match Self::decoder(api, NVJPEG_BACKEND_HARDWARE) {
            Ok(dec) => {
                let mut js: JpegStream = std::ptr::null_mut();
                // SAFETY: a valid handle and an out-pointer to a local.
                match check("nvjpegJpegStreamCreate", unsafe { (api.stream_create)(dec.handle, &mut js) }) {
                    Ok(()) => Some(Hardware { dec, stream: js, supported: HashMap::new() }),
                    Err((call, status)) => {
                        tracing::debug!("nvJPEG hardware decoder off: {call}: {status}");
                        Self::destroy(api, &dec);
                        None
                    }
                }
            }
            Err((call, status)) => {
                tracing::debug!("nvJPEG hardware decoder not available: {call}: {status}");
                None
            }
        };
        let backend = if hardware.is_some() { "hardware" } else { "default" };
        Ok((Inner { default, hardware, buf: None, read: None, letterbox: Letterboxer::default() }, backend))
    }

    fn destroy_lane(api: &Api, inner: &mut Inner) {
        if let Some(hw) = &inner.hardware {
            // SAFETY: the parsed stream was created on this handle and is not used after.
            unsafe { (api.stream_destroy)(hw.stream) };
            Self::destroy(api, &hw.dec);
        }
        Self::destroy(api, &inner.default);
    }

    fn decoder(api: &Api, backend: c_int) -> Result<Decoder, (&'static str, NvjpegStatus)> {
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: null allocators select nvJPEG's defaults; flags 0; `handle` is a local out-pointer.
        check("nvjpegCreateEx", unsafe { (api.create_ex)(backend, std::ptr::null_mut(), std::ptr::null_mut(), 0, &mut handle) })?;
        let mut state: State = std::ptr::null_mut();
        // SAFETY: `handle` was just created; `state` is a local out-pointer.
        if let Err(e) = check("nvjpegJpegStateCreate", unsafe { (api.state_create)(handle, &mut state) }) {
            // SAFETY: destroying the handle created above, used by nothing else.
            unsafe { (api.destroy)(handle) };
            return Err(e);
        }
        Ok(Decoder { handle, state })
    }

    fn destroy(api: &Api, d: &Decoder) {
        // SAFETY: the state and handle were created together by `decoder` and are not used after.
        unsafe {
            (api.state_destroy)(d.state);
            (api.destroy)(d.handle);
        }
    }

    /// `"hardware"` when nvJPEG's hardware decoder takes the pictures it supports, else `"default"`.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// Decodes `pictures` and letterboxes them for `size` and `fit` into one u8 tensor
    /// `(B, H, W, 3)` on the device, with per picture its geometry or why it was not decoded here
    /// (its slot then holds the pad value 114 until [`Self::write_slot`]). Every picture of one call
    /// must need the same input `H x W` (always so for [`Fit::Square`]; the caller groups
    /// [`Fit::Rect`] pictures by shape): an error otherwise. When no picture's header is readable
    /// the input is `size x size`.
    ///
    /// Returns once nvJPEG is done with `pictures`, when the device's stream has run the decode
    /// and the letterbox behind it.
    pub fn decode_letterbox(&self, pictures: &[&[u8]], size: u32, fit: Fit, limits: &DecodeLimits) -> candle_core::Result<Decoded> {
        self.decode_letterbox_inner(pictures, None, size, fit, limits, Ok)
    }

    /// [`Self::decode_letterbox`] of JPEGs whose headers the caller has already checked with
    /// [`check_jpeg_header`] (with no EXIF orientation to apply): `sizes` holds the width and
    /// height it read for each, and only nvJPEG's own reading of the header is compared with it.
    /// A feed checks headers on all cores ahead of the model; checking them again here, on the
    /// one thread that feeds the GPU, would cost that thread as much as the decode.
    ///
    /// `then` runs on the decoded input as soon as the decode and the letterbox are queued,
    /// before the wait for nvJPEG: work `then` queues on the device's stream (a pass) is launched
    /// while the decode runs. Returns `then`'s result once nvJPEG is done with `pictures`; the
    /// decoder's lane stays taken until then.
    pub fn decode_letterbox_then<R>(
        &self,
        pictures: &[&[u8]],
        sizes: &[(u32, u32)],
        size: u32,
        fit: Fit,
        limits: &DecodeLimits,
        then: impl FnOnce(Decoded) -> candle_core::Result<R>,
    ) -> candle_core::Result<R> {
        if sizes.len() != pictures.len() {
            candle_core::bail!("decode_letterbox: {} pictures with {} sizes", pictures.len(), sizes.len());
        }
        self.decode_letterbox_inner(pictures, Some(sizes), size, fit, limits, then)
    }

    fn decode_letterbox_inner<R>(
        &self,
        pictures: &[&[u8]],
        checked: Option<&[(u32, u32)]>,
        size: u32,
        fit: Fit,
        limits: &DecodeLimits,
        then: impl FnOnce(Decoded) -> candle_core::Result<R>,
    ) -> candle_core::Result<R> {
        if size == 0 || pictures.is_empty() {
            candle_core::bail!("decode_letterbox: {} pictures at size {size}", pictures.len());
        }
        // a free lane, else the first
        let mut inner = match self.lanes.iter().find_map(|l| l.try_lock().ok()) {
            Some(g) => g,
            None => self.lanes[0].lock().unwrap_or_else(|p| p.into_inner()),
        };
        let mut prof = JpegProfile { pictures: pictures.len(), ..JpegProfile::default() };
        let stream = self.dev.cuda_stream();
        stream.context().bind_to_thread().w()?;
        let t = Instant::now();
        let plans: Vec<Plan> =
            pictures.iter().enumerate().map(|(k, p)| self.plan(&inner.default, p, checked.map(|c| c[k]), size, fit, limits)).collect();
        prof.plan = t.elapsed();
        let shapes = plans.iter().filter_map(|p| match p {
            Plan::Decode { g, .. } => Some((g.in_w, g.in_h)),
            Plan::Fallback { shape, .. } => *shape,
        });
        let mut in_shape = None;
        for s in shapes {
            match in_shape {
                None => in_shape = Some(s),
                Some(first) if first != s => candle_core::bail!(
                    "decode_letterbox: the pictures of one call need one input shape, got {}x{} and {}x{}",
                    first.0,
                    first.1,
                    s.0,
                    s.1
                ),
                Some(_) => {}
            }
        }
        let (in_w, in_h) = in_shape.unwrap_or((size, size));
        let b = pictures.len();
        let Some(total) = b.checked_mul(in_w as usize).and_then(|v| v.checked_mul(in_h as usize)?.checked_mul(3)) else {
            candle_core::bail!("decode_letterbox: {b} pictures of {in_w}x{in_h} is too large");
        };
        // SAFETY: every slot (all `total` bytes) is written by one of the launches below.
        let mut out = unsafe { self.dev.alloc::<u8>(total)? };
        let mut results: Vec<Result<LetterboxGeometry, Fallback>> = Vec::with_capacity(b);
        let queued = self.queue_rounds(&mut inner, pictures, &plans, (in_w, in_h), &mut out, &mut results, &mut prof);
        let r = queued.and_then(|()| {
            let storage = candle_core::CudaStorage::wrap_cuda_slice(out, self.dev.clone());
            let shape = candle_core::Shape::from((b, in_h as usize, in_w as usize, 3));
            let x = Tensor::from_storage(candle_core::Storage::Cuda(storage), shape, candle_core::op::BackpropOp::none(), false);
            then((x, results))
        });
        // nvJPEG may read the host bitstreams until its work on the stream is done: waited for on
        // every path, after the letterbox (and `then`'s work) is queued behind the decode
        let t = Instant::now();
        let waited = stream.synchronize().w();
        prof.wait += t.elapsed();
        drop(inner);
        *self.profile.lock().unwrap_or_else(|p| p.into_inner()) += prof;
        let r = r?;
        waited?;
        Ok(r)
    }

    /// Queues the decode and the letterbox of `pictures` into `out`, in rounds of at most
    /// [`ROUND_BYTES`] decoded, with per picture its geometry or why it was not decoded here
    /// into `results`. The caller waits for the stream before the bitstreams go.
    #[allow(clippy::too_many_arguments)]
    fn queue_rounds(
        &self,
        inner: &mut Inner,
        pictures: &[&[u8]],
        plans: &[Plan],
        (in_w, in_h): (u32, u32),
        out: &mut CudaSlice<u8>,
        results: &mut Vec<Result<LetterboxGeometry, Fallback>>,
        prof: &mut JpegProfile,
    ) -> candle_core::Result<()> {
        let b = pictures.len();
        let stream = self.dev.cuda_stream();
        let mut start = 0;
        while start < b {
            // one round: consecutive pictures whose decoded bytes fit ROUND_BYTES (at least one)
            let mut sources: Vec<Option<Source>> = Vec::new();
            let mut bytes = 0usize;
            while start + sources.len() < b {
                let src = match &plans[start + sources.len()] {
                    Plan::Decode { w, h, .. } => {
                        // room for RGB, and so for planes
                        let pitch = *w as usize * 3;
                        let need = pitch.checked_mul(*h as usize).and_then(|v| v.checked_next_multiple_of(ALIGN));
                        let Some(need) = need else { candle_core::bail!("decode_letterbox: a {w}x{h} picture is too large") };
                        if !sources.is_empty() && bytes.saturating_add(need) > ROUND_BYTES {
                            break;
                        }
                        let s = Source { offset: bytes, pitch, w: *w, h: *h, chroma: None };
                        bytes += need;
                        Some(s)
                    }
                    Plan::Fallback { .. } => None,
                };
                sources.push(src);
            }
            let round = start..start + sources.len();
            let Inner { default, hardware, buf, read, letterbox } = &mut *inner;
            if let Some(e) = read.take() {
                e.synchronize().w()?; // the last launch has read the buffer
            }
            if buf.as_ref().is_none_or(|s| s.len() < bytes.max(1)) {
                *buf = None; // freed in stream order before the larger one is taken
                             // SAFETY: only the regions nvJPEG wrote are read (slots whose decode succeeded).
                *buf = Some(unsafe { self.dev.alloc::<u8>(bytes.max(1))? });
            }
            let buf = buf.as_mut().expect("decode buffer allocated above");
            let t = Instant::now();
            let samplings: Vec<Option<Sampling>> = plans[round.clone()]
                .iter()
                .map(|p| match p {
                    Plan::Decode { sampling, .. } => *sampling,
                    Plan::Fallback { .. } => None,
                })
                .collect();
            let (decoded, parse) =
                self.decode_round(default, hardware.as_mut(), &pictures[round.clone()], &mut sources, &samplings, buf)?;
            prof.parse += parse;
            prof.decode += t.elapsed().saturating_sub(parse);
            let mut slots = Vec::with_capacity(sources.len());
            for ((plan, src), dec) in plans[round.clone()].iter().zip(&sources).zip(decoded) {
                let r = match (plan, src, dec) {
                    (Plan::Decode { g, .. }, Some(src), None) => {
                        slots.push(Some((*src, *g)));
                        Ok(*g)
                    }
                    (_, _, Some(why)) => Err(why),
                    (Plan::Fallback { why, .. }, _, None) => Err(why.clone()),
                    (Plan::Decode { .. }, None, None) => candle_core::bail!("decode_letterbox: a picture to decode without a source"),
                };
                if r.is_err() {
                    slots.push(None);
                }
                results.push(r);
            }
            let t = Instant::now();
            letterbox.run(&self.dev, buf, &slots, round.start, (in_w, in_h), out)?;
            *read = Some(stream.record_event(None).w()?);
            prof.letterbox += t.elapsed();
            start = round.end;
        }
        Ok(())
    }

    /// Whether nvJPEG is to decode `bytes`, after the host decoder's own checks and nvJPEG's
    /// reading of the header.
    /// `checked`: the stored size the caller's [`check_jpeg_header`] read (no orientation to apply).
    fn plan(&self, dec: &Decoder, bytes: &[u8], checked: Option<(u32, u32)>, size: u32, fit: Fit, limits: &DecodeLimits) -> Plan {
        let header = match checked {
            Some((w, h)) => Ok((w, h, Orientation::NoTransforms)),
            None => check_jpeg_header(bytes, limits),
        };
        let (w, h, orientation) = match header {
            Ok(v) => v,
            Err(ImageError::NotJpeg | ImageError::UnknownFormat) => return Plan::Fallback { why: Fallback::NotJpeg, shape: None },
            Err(e) => return Plan::Fallback { why: Fallback::Refused(e.to_string()), shape: None },
        };
        if orientation != Orientation::NoTransforms {
            use Orientation::*;
            let (ow, oh) = if matches!(orientation, Rotate90 | Rotate270 | Rotate90FlipH | Rotate270FlipH) { (h, w) } else { (w, h) };
            let g = LetterboxGeometry::fit(ow, oh, size, fit);
            return Plan::Fallback { why: Fallback::Orientation(orientation), shape: Some((g.in_w, g.in_h)) };
        }
        let g = LetterboxGeometry::fit(w, h, size, fit);
        let fallback = |why: Fallback| Plan::Fallback { why, shape: Some((g.in_w, g.in_h)) };
        let (mut components, mut subsampling) = (0 as c_int, 0 as c_int);
        let (mut widths, mut heights) = ([0 as c_int; NVJPEG_MAX_COMPONENT], [0 as c_int; NVJPEG_MAX_COMPONENT]);
        // SAFETY: `bytes` is valid for its length; the out-pointers are locals, the width and
        // height arrays NVJPEG_MAX_COMPONENT long as nvjpeg.h asks; the function is thread safe.
        let status = unsafe {
            (self.api.get_image_info)(
                dec.handle,
                bytes.as_ptr(),
                bytes.len(),
                &mut components,
                &mut subsampling,
                widths.as_mut_ptr(),
                heights.as_mut_ptr(),
            )
        };
        if let Err(e) = check("nvjpegGetImageInfo", status) {
            return fallback(e.into());
        }
        if components != 1 && components != 3 {
            return fallback(Fallback::Unsupported(format!("{components} components")));
        }
        if (widths[0], heights[0]) != (w as c_int, h as c_int) {
            return fallback(Fallback::Unsupported(format!("nvJPEG reads {}x{}, the header check {w}x{h}", widths[0], heights[0])));
        }
        let chroma = (widths[1], heights[1]);
        let sampling = match (u32::try_from(chroma.0), u32::try_from(chroma.1)) {
            (Ok(cw), Ok(ch)) if components == 3 && chroma == (widths[2], heights[2]) => Sampling::of(w, h, (cw, ch)),
            _ => None,
        };
        Plan::Decode { w, h, g, sampling }
    }

    /// Decodes the pictures that have a source into `buf`: the hardware decoder's batch first,
    /// then the rest one by one on the default backend. Per picture: `None` when decoded (or not
    /// to be decoded), else why not; and the time the support checks took. The sources come in
    /// as RGB, each with room for it, and turn planar where nvJPEG is to return planes (with
    /// [`GpuJpeg::planar`]): the hardware batch's where every one of its pictures is YCbCr with
    /// a chroma sampling in `samplings`, and each such picture the default backend decodes.
    fn decode_round(
        &self,
        default: &Decoder,
        hardware: Option<&mut Hardware>,
        pictures: &[&[u8]],
        sources: &mut [Option<Source>],
        samplings: &[Option<Sampling>],
        buf: &mut CudaSlice<u8>,
    ) -> candle_core::Result<(Vec<Option<Fallback>>, Duration)> {
        let api = &self.api;
        let mut parse = Duration::ZERO;
        let stream = self.dev.cuda_stream();
        let cu_stream = stream.cu_stream() as CudaStream;
        let (base, _written) = buf.device_ptr_mut(&stream);
        let at = |offset: usize| (base + offset as u64) as *mut u8;
        let image = |s: &Source| match s.chroma {
            None => Image {
                channel: [at(s.offset), std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut()],
                pitch: [s.pitch, 0, 0, 0],
            },
            Some(c) => Image { channel: [at(s.offset), at(c.cb), at(c.cr), std::ptr::null_mut()], pitch: [s.pitch, c.pitch, c.pitch, 0] },
        };
        let mut fallbacks: Vec<Option<Fallback>> = vec![None; pictures.len()];
        let mut todo: Vec<usize> = (0..pictures.len()).filter(|&k| sources[k].is_some()).collect();
        if let Some(hw) = hardware {
            let mut batch = Vec::new();
            // the frame key of each picture in `batch`
            let mut batch_keys = Vec::new();
            let t = Instant::now();
            for &k in &todo {
                let p = pictures[k];
                let key = jpeg_frame_key(p);
                if let Some(&known) = key.as_ref().and_then(|key| hw.supported.get(key)) {
                    if known {
                        batch.push(k);
                        batch_keys.push(key);
                    }
                    continue;
                }
                let mut unsupported: c_int = 1;
                // SAFETY: `p` is valid for its length; the parsed stream belongs to the hardware
                // handle and is used under the lock; `unsupported` is a local out-pointer.
                let ok = unsafe {
                    let parsed = match api.stream_parse_header {
                        Some(parse_header) => {
                            check("nvjpegJpegStreamParseHeader", parse_header(hw.dec.handle, p.as_ptr(), p.len(), hw.stream))
                        }
                        None => check("nvjpegJpegStreamParse", (api.stream_parse)(hw.dec.handle, p.as_ptr(), p.len(), 0, 0, hw.stream)),
                    };
                    parsed.and_then(|()| {
                        check("nvjpegDecodeBatchedSupported", (api.batched_supported)(hw.dec.handle, hw.stream, &mut unsupported))
                    })
                };
                // nvjpeg.h: `is_supported` is 0 when the decoder can take the stream
                let takes = ok.is_ok() && unsupported == 0;
                if takes {
                    batch.push(k);
                    batch_keys.push(key);
                }
                // a header nvJPEG could not parse is not an answer about the frame
                if let (Some(key), true) = (key, ok.is_ok()) {
                    if hw.supported.len() >= SUPPORT_KEYS {
                        hw.supported.clear();
                    }
                    hw.supported.insert(key, takes);
                }
            }
            parse = t.elapsed();
            let planar =
                self.planar && batch.iter().zip(&batch_keys).all(|(&k, key)| samplings[k].is_some() && key.is_some_and(|key| key.ycbcr()));
            let rgb: Vec<Option<Source>> = batch.iter().map(|&k| sources[k]).collect();
            if planar {
                for &k in &batch {
                    if let (Some(src), Some(sampling)) = (sources[k].as_mut(), samplings[k]) {
                        *src = planes(src, sampling);
                    }
                }
            }
            let format = if planar { NVJPEG_OUTPUT_YUV } else { NVJPEG_OUTPUT_RGBI };
            if !batch.is_empty() {
                let data: Vec<*const u8> = batch.iter().map(|&k| pictures[k].as_ptr()).collect();
                let lengths: Vec<usize> = batch.iter().map(|&k| pictures[k].len()).collect();
                let mut images: Vec<Image> = batch.iter().map(|&k| image(sources[k].as_ref().expect("filtered on a source"))).collect();
                let n = c_int::try_from(batch.len()).unwrap_or(c_int::MAX);
                // SAFETY: the handle and state belong together and are used under the lock; the
                // three arrays hold `n` entries each; every destination is a distinct region of
                // `buf` of `w * 3 * h` bytes (laid out by the caller inside `buf`), device memory
                // of this context, holding the picture's RGB or its three planes (`planes`) as
                // nvJPEG read their sizes (`plan`); `pictures` outlive the work (the caller
                // synchronizes the stream before returning).
                let done = n == batch.len() as c_int
                    && unsafe {
                        check("nvjpegDecodeBatchedInitialize", (api.batched_initialize)(hw.dec.handle, hw.dec.state, n, 1, format))
                            .and_then(|()| {
                                check(
                                    "nvjpegDecodeBatched",
                                    (api.batched)(
                                        hw.dec.handle,
                                        hw.dec.state,
                                        data.as_ptr(),
                                        lengths.as_ptr(),
                                        images.as_mut_ptr(),
                                        cu_stream,
                                    ),
                                )
                            })
                    }
                    .inspect_err(|(call, status)| {
                        tracing::debug!("nvJPEG hardware batch of {n} failed ({call}: {status}); decoding one by one")
                    })
                    .is_ok();
                if done {
                    todo.retain(|k| !batch.contains(k));
                } else {
                    // decoded one by one, as RGB
                    for (&k, src) in batch.iter().zip(rgb) {
                        sources[k] = src;
                    }
                    // checked again next time rather than trusted
                    for key in batch_keys.iter().flatten() {
                        hw.supported.remove(key);
                    }
                }
            }
        }
        for k in todo {
            let p = pictures[k];
            let Some(src) = sources[k].as_mut() else { continue };
            let planar = match samplings[k] {
                Some(sampling) if self.planar && jpeg_frame_key(p).is_some_and(|key| key.ycbcr()) => {
                    *src = planes(src, sampling);
                    true
                }
                _ => false,
            };
            let mut img = image(src);
            let format = if planar { NVJPEG_OUTPUT_YUV } else { NVJPEG_OUTPUT_RGBI };
            // SAFETY: the default handle and state belong together and are used under the lock;
            // `p` is valid for its length; the destination is a region of `buf` of `w * 3 * h`
            // bytes, enough for interleaved RGB or the three planes (`planes`) of the sizes
            // nvJPEG read (`plan`).
            let status = unsafe { (api.decode)(default.handle, default.state, p.as_ptr(), p.len(), format, &mut img, cu_stream) };
            if let Err(e) = check("nvjpegDecode", status) {
                fallbacks[k] = Some(e.into());
            }
        }
        Ok((fallbacks, parse))
    }

    /// Writes a picture letterboxed on the host (a [`Fallback`]'s) into slot `i` of `x`, the
    /// input [`Self::decode_letterbox`] returned.
    pub fn write_slot(&self, x: &Tensor, i: usize, lb: &Letterboxed) -> candle_core::Result<()> {
        let (b, h, w, c) = x.dims4()?;
        let g = &lb.geometry;
        if c != 3 || x.dtype() != candle_core::DType::U8 || i >= b {
            candle_core::bail!("write_slot: slot {i} of a {:?} {:?} input", x.dtype(), x.shape());
        }
        if (g.in_w as usize, g.in_h as usize) != (w, h) || lb.pixels.len() != h * w * 3 {
            candle_core::bail!("write_slot: a {}x{} picture ({} bytes) into a {w}x{h} input", g.in_w, g.in_h, lb.pixels.len());
        }
        let src = Tensor::from_slice(&lb.pixels, (1, h, w, 3), x.device())?;
        x.slice_set(&src, 0, i)
    }
}

impl Drop for GpuJpeg {
    fn drop(&mut self) {
        // nvJPEG's buffers may still be in use by work on the stream, and it frees them in the
        // context current on this thread
        let stream = self.dev.cuda_stream();
        let _ = stream.synchronize();
        let _ = stream.context().bind_to_thread();
        for lane in &mut self.lanes {
            Self::destroy_lane(&self.api, lane.get_mut().unwrap_or_else(|p| p.into_inner()));
        }
    }
}
