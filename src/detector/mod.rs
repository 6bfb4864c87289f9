//! The detector: a loaded model plus its batched pre/post-processing. Letterboxed u8 pixels
//! are uploaded as they are and normalised on the device; only per-anchor best scores, classes
//! and boxes come back to the host for NMS.

mod ahead;
pub mod warmup;

use std::path::Path;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};

use crate::backend::Uploader;
use crate::model::{BuildOptions, ModelError, ModelInfo, YoloV9};
use crate::vision::feed::{Picture, Pixels};
use crate::vision::postprocess::{self, Candidate, Detection, Thresholds};
use crate::vision::preprocess::{self, DecodeLimits, ImageError, LetterboxGeometry, Letterboxed};
use crate::weights::Checkpoint;

/// A JPEG of a [`detect_pictures`](Detector::detect_pictures) batch left encoded by the feed: its
/// position in the batch, its bytes, and where it will sit in the input.
struct Encoded<'a> {
    at: usize,
    bytes: &'a [u8],
    /// Read by the device decoder (the host decoder letterboxes from the decoded picture).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    geometry: &'a LetterboxGeometry,
    fit: preprocess::Fit,
}

/// The pictures of a batch letterboxed on the host (with their positions) and the JPEGs left
/// encoded, in batch order.
fn split_encoded<'a>(batch: &[&'a Picture]) -> (Vec<(usize, &'a Letterboxed)>, Vec<Encoded<'a>>) {
    let mut host = Vec::new();
    let mut jpegs = Vec::new();
    for (at, p) in batch.iter().enumerate() {
        match &p.pixels {
            Pixels::Letterboxed(lb) => host.push((at, lb)),
            Pixels::Jpeg { bytes, geometry, fit } => jpegs.push(Encoded { at, bytes, geometry, fit: *fit }),
        }
    }
    (host, jpegs)
}

/// The JPEGs of one batch decoded and letterboxed on the device ahead of its pass
/// ([`Detector::decode_jpegs`]), for [`Detector::detect_pictures_decoded`].
pub struct DecodedJpegs {
    /// Pictures in the batch it was made for.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    len: usize,
    #[cfg(feature = "cuda")]
    groups: Vec<DecodedGroup>,
}

/// One input shape's JPEGs on the device.
#[cfg(feature = "cuda")]
struct DecodedGroup {
    /// (position in the batch, address of the JPEG's bytes) per slot of `x`.
    pictures: Vec<(usize, usize)>,
    /// u8 `(B, H, W, 3)`.
    x: Tensor,
    decoded: Vec<Result<LetterboxGeometry, crate::backend::Fallback>>,
}

#[cfg(feature = "cuda")]
impl DecodedJpegs {
    /// Whether this decode was made from exactly these JPEGs (same positions, same bytes) of a
    /// batch of `len` pictures.
    fn made_for(&self, jpegs: &[Encoded<'_>], len: usize) -> bool {
        let mut n = 0;
        let same = self.groups.iter().flat_map(|g| &g.pictures).all(|&(at, addr)| {
            n += 1;
            jpegs.binary_search_by_key(&at, |j| j.at).is_ok_and(|i| jpegs[i].bytes.as_ptr() as usize == addr)
        });
        let made_for = self.len == len && same && n == jpegs.len();
        if !made_for {
            tracing::debug!("pictures decoded ahead for another batch; decoding this one now");
        }
        made_for
    }
}

impl Encoded<'_> {
    /// The picture decoded and letterboxed on the host.
    fn on_host(&self, imgsz: u32, limits: &DecodeLimits) -> Result<Letterboxed, ImageError> {
        preprocess::decode_image(self.bytes, limits).map(|img| preprocess::letterbox_fit(&img, imgsz, self.fit))
    }
}

/// The largest network input side taken, from the command line, the config or a checkpoint's
/// stored training size: 8192 (one f32 picture of 768 MiB; ultralytics trains at 640 or 1280).
pub const MAX_IMGSZ: usize = 8192;

/// `imgsz` as the detector takes it: a positive multiple of 32, at most [`MAX_IMGSZ`].
pub fn check_imgsz(imgsz: usize) -> Result<usize, String> {
    if imgsz == 0 || !imgsz.is_multiple_of(32) || imgsz > MAX_IMGSZ {
        return Err(format!("imgsz {imgsz} is not a positive multiple of 32 up to {MAX_IMGSZ}"));
    }
    Ok(imgsz)
}

/// After a capture or launch runs out of memory, passes run eagerly for this long before a
/// graph is tried again (memory pressure from other tenants is usually temporary).
#[cfg(feature = "cuda")]
const GRAPH_RETRY_AFTER_OOM: std::time::Duration = std::time::Duration::from_secs(60);

/// Most CUDA graphs a detector keeps: a ladder of powers of two up to batch 512 and a few other
/// shapes. All of them replay over one shared memory region (`crate::backend::arena`), so the
/// bound is on capture time and host memory, not device memory.
#[cfg(feature = "cuda")]
const MAX_GRAPHS: usize = 12;

/// Who decodes JPEG pictures (`detect --jpeg-decoder`, the agent's `[device] jpeg_decoder`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JpegDecoder {
    /// The host's decoder (the reference's pixels, bit for bit).
    #[default]
    Cpu,
    /// nvJPEG on the detector's GPU, with the letterbox on the device; an error where it cannot
    /// run.
    Nvjpeg,
    /// nvJPEG where the detector is on a GPU and the library loads, the host's decoder otherwise.
    Auto,
}

impl std::str::FromStr for JpegDecoder {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "nvjpeg" => Ok(Self::Nvjpeg),
            "auto" => Ok(Self::Auto),
            _ => Err(format!("`{s}` is not a JPEG decoder (cpu, nvjpeg or auto)")),
        }
    }
}

/// What [`Detector::set_jpeg_decoder`] set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JpegSetup {
    /// The host decodes (as asked).
    Host,
    /// nvJPEG decodes, with this backend (`hardware` or `default`).
    Device { backend: &'static str },
    /// The host decodes: `auto` found no nvJPEG, for this reason.
    HostInstead { why: String },
}

/// The batch a graph is captured for to run `b` pictures: with a ladder up to `top`, the next
/// power of two, at most `top` (a partial batch is padded up: partial batches come when frames
/// arrive slower than the batch fills, so the padding costs latency the stream has to spare,
/// never throughput); `b` itself above the ladder or without one.
pub fn graph_rung(b: usize, top: usize) -> usize {
    if top == 0 || b > top {
        b
    } else {
        b.next_power_of_two().min(top)
    }
}

/// A detector's captured CUDA graphs (most recently used last), whether it gave up on graphs
/// (any failure other than running out of memory), and when it may try again after running out
/// of memory.
#[cfg(feature = "cuda")]
#[derive(Default)]
struct Graphs {
    kept: Vec<crate::backend::GraphedForward>,
    failed: bool,
    retry_at: Option<std::time::Instant>,
}

#[cfg(feature = "cuda")]
impl Graphs {
    /// Drops every graph (and its memory) after `e`: for a while when it ran out of memory, for
    /// good otherwise.
    fn give_up(&mut self, what: &str, e: &candle_core::Error) {
        self.kept.clear();
        if crate::backend::oom::is_oom(e) {
            self.retry_at = Some(std::time::Instant::now() + GRAPH_RETRY_AFTER_OOM);
            tracing::warn!(error = %e, retry_s = GRAPH_RETRY_AFTER_OOM.as_secs(), "CUDA graph {what} ran out of memory; passes run eagerly until the retry");
        } else {
            self.failed = true;
            tracing::warn!(error = %e, "CUDA graph {what} failed; passes run eagerly from now on");
        }
    }
}

pub struct Detector {
    model: YoloV9,
    imgsz: usize,
    uploader: Uploader,
    /// Passes on CUDA replay captured graphs ([`Detector::use_graphs`]).
    graphs: std::sync::atomic::AtomicBool,
    /// Top of the ladder of graph batch sizes ([`Detector::set_graph_ladder`]); 0: none.
    ladder: std::sync::atomic::AtomicUsize,
    #[cfg(feature = "cuda")]
    graph: std::sync::Mutex<Graphs>,
    /// nvJPEG for the JPEGs a feed leaves encoded ([`Detector::use_gpu_jpeg`]).
    #[cfg(feature = "cuda")]
    jpeg: std::sync::OnceLock<crate::backend::GpuJpeg>,
    /// Whether the device's NMS gave the host's answers on this device ([`Detector::device_nms_ok`]).
    #[cfg(feature = "cuda")]
    device_nms: std::sync::OnceLock<bool>,
    /// Where the detection step's time went ([`Detector::take_step_profile`]).
    step: std::sync::Mutex<StepProfile>,
}

/// Host time of the detection step's parts, from the input to the detections, summed over the
/// passes since the last [`Detector::take_step_profile`] (a batch runs one pass per input shape).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct StepProfile {
    pub passes: usize,
    pub pictures: usize,
    /// The input on the device and the pass queued (a graph launch, or an eager pass's kernels;
    /// on the CPU the whole pass).
    pub queue: Duration,
    /// Waiting for the pass and the score filter, and the anchors that passed copied back (on
    /// CUDA where the device runs NMS: waiting for it too, and the kept boxes copied back; on
    /// the CPU: boxes, best score and class of every anchor gathered).
    pub candidates: Duration,
    /// Per-picture candidate lists: from the rows the device filter appended (CUDA without the
    /// device's NMS), or the score threshold applied here (CPU).
    pub lists: Duration,
    /// NMS (unless the device ran it) and the boxes mapped back to each picture.
    pub nms: Duration,
}

impl std::ops::AddAssign for StepProfile {
    fn add_assign(&mut self, o: Self) {
        self.passes += o.passes;
        self.pictures += o.pictures;
        self.queue += o.queue;
        self.candidates += o.candidates;
        self.lists += o.lists;
        self.nms += o.nms;
    }
}

impl std::fmt::Display for StepProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let per = |d: Duration| d.as_secs_f64() * 1e3 / self.passes.max(1) as f64;
        write!(
            f,
            "ms a pass ({} passes, {} pictures): input and pass queued {:.3}, waiting for the pass and candidates copied back {:.3}, per-picture lists {:.3}, NMS and boxes {:.3}",
            self.passes,
            self.pictures,
            per(self.queue),
            per(self.candidates),
            per(self.lists),
            per(self.nms)
        )
    }
}

/// What the detection step takes from a pass, per picture.
enum Picked {
    /// The candidates above the threshold, in anchor order: NMS runs on the host.
    Candidates(Vec<Vec<Candidate>>),
    /// The boxes the device's NMS kept, best first.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Kept(Vec<Vec<Candidate>>),
}

/// A [`StepProfile`] of one pass being timed: each lap adds the time since the last to a part.
struct StepClock {
    last: Instant,
    p: StepProfile,
}

impl StepClock {
    fn start(pictures: usize) -> Self {
        Self { last: Instant::now(), p: StepProfile { passes: 1, pictures, ..StepProfile::default() } }
    }

    fn lap(&mut self, part: fn(&mut StepProfile) -> &mut Duration) {
        let now = Instant::now();
        *part(&mut self.p) += now - self.last;
        self.last = now;
    }
}

impl Detector {
    /// Loads a checkpoint (`.pt` or `.safetensors`) onto `device` in `dtype`, for pictures of
    /// `imgsz` (`None`: the training size the checkpoint stores, else 640).
    pub fn load(path: &Path, device: &Device, dtype: DType, imgsz: Option<usize>) -> Result<Self, ModelError> {
        let ck = Checkpoint::load(path)?;
        let model = YoloV9::from_checkpoint(&ck, &BuildOptions::new(device.clone(), dtype))?;
        let imgsz = match imgsz {
            Some(s) => check_imgsz(s).map_err(ModelError::Architecture)?,
            None => check_imgsz(model.info().imgsz)
                .map_err(|e| ModelError::Architecture(format!("{}: the stored training size: {e}", path.display())))?,
        };
        Ok(Self::from_model(model, imgsz))
    }

    pub fn from_model(model: YoloV9, imgsz: usize) -> Self {
        Self {
            model,
            imgsz,
            uploader: Uploader::default(),
            graphs: false.into(),
            ladder: 0.into(),
            #[cfg(feature = "cuda")]
            graph: std::sync::Mutex::new(Graphs::default()),
            #[cfg(feature = "cuda")]
            jpeg: std::sync::OnceLock::new(),
            #[cfg(feature = "cuda")]
            device_nms: std::sync::OnceLock::new(),
            step: std::sync::Mutex::new(StepProfile::default()),
        }
    }

    /// The detection step's host time since the last take ([`StepProfile`]).
    pub fn take_step_profile(&self) -> StepProfile {
        std::mem::take(&mut *self.step.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Lets passes on CUDA replay captured CUDA graphs when `[tuning] cuda_graphs` is on (off
    /// until called, so that the planner measures the eager passes): one graph per input shape
    /// and batch ([`graph_rung`]), captured on first use, at most 12 kept (the least
    /// recently used goes first). A capture or launch that fails is logged and the detector goes
    /// on eagerly: for good, or for a minute after running out of memory. No effect on the CPU.
    pub fn use_graphs(&self, on: bool) {
        self.graphs.store(on, std::sync::atomic::Ordering::Relaxed);
        if !on {
            self.drop_graphs();
        }
    }

    /// Whether passes may replay CUDA graphs ([`Detector::use_graphs`]).
    pub fn graphs_enabled(&self) -> bool {
        self.graphs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Runs batches of up to `top` pictures on a ladder of graphs (powers of two, and `top`),
    /// padding a partial batch up to the next rung, instead of one graph per batch size; 0 turns
    /// the ladder off. A new top drops the graphs captured so far (a lower one frees their
    /// memory: the agent lowers its batch under memory pressure).
    pub fn set_graph_ladder(&self, top: usize) {
        if self.ladder.swap(top, std::sync::atomic::Ordering::Relaxed) != top {
            self.drop_graphs();
        }
    }

    /// How many pictures a pass over `b` pictures runs, padding included: the ladder's rung
    /// where passes replay graphs on a ladder ([`Detector::set_graph_ladder`]), `b` otherwise.
    pub fn runs_as(&self, b: usize) -> usize {
        if self.replays_graphs() {
            graph_rung(b, self.ladder.load(std::sync::atomic::Ordering::Relaxed))
        } else {
            b
        }
    }

    /// Drops every captured graph; the memory they replayed over goes back at the next trim.
    pub fn drop_graphs(&self) {
        #[cfg(feature = "cuda")]
        if let Ok(mut g) = self.graph.lock() {
            g.kept.clear();
        }
    }

    pub fn info(&self) -> &ModelInfo {
        self.model.info()
    }
    pub fn model(&self) -> &YoloV9 {
        &self.model
    }
    pub fn imgsz(&self) -> usize {
        self.imgsz
    }
    pub fn device(&self) -> &Device {
        self.model.device()
    }
    pub fn dtype(&self) -> DType {
        self.model.dtype()
    }

    /// Stacks letterboxed pictures, all of one input shape, into the normalised network input
    /// `(B, 3, H, W)` on the device.
    pub fn input(&self, batch: &[&Letterboxed]) -> candle_core::Result<Tensor> {
        let _arena = crate::backend::serve_arena(self.device());
        let x = self.upload(batch)?;
        // u8 -> dtype and /255 on the device, NHWC -> NCHW: on CUDA one kernel
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            return crate::backend::normalize_input(&x, self.dtype(), false);
        }
        x.to_dtype(self.dtype())?.permute((0, 3, 1, 2))?.contiguous()? / 255.0
    }

    /// The pictures of a batch (all of one input shape) on the device as they are: `(B, H, W, 3)`
    /// u8.
    fn upload(&self, batch: &[&Letterboxed]) -> candle_core::Result<Tensor> {
        let Some(first) = batch.first() else { candle_core::bail!("empty batch") };
        let (w, h) = (first.geometry.in_w as usize, first.geometry.in_h as usize);
        let mut parts = Vec::with_capacity(batch.len());
        for lb in batch {
            let (lw, lh) = (lb.geometry.in_w as usize, lb.geometry.in_h as usize);
            if (lw, lh) != (w, h) || lb.pixels.len() != w * h * 3 || w.max(h) > self.imgsz || w % 32 != 0 || h % 32 != 0 {
                candle_core::bail!(
                    "picture letterboxed to {lw}x{lh} ({} bytes) in a batch of {w}x{h}; the model runs at multiples of 32 up to {}",
                    lb.pixels.len(),
                    self.imgsz
                );
            }
            parts.push(lb.pixels.as_slice());
        }
        self.uploader.upload(&parts, (batch.len(), h, w, 3), self.device())
    }

    /// The reference's raw output `(B, 4 + nc, anchors)` for a batch.
    pub fn raw(&self, batch: &[&Letterboxed]) -> candle_core::Result<Tensor> {
        #[cfg(feature = "cuda")]
        if let Some(r) = self.graphed_pictures(batch, |y| y.copy()) {
            return r;
        }
        self.forward(&self.input(batch)?)
    }

    /// The network on a normalised input `(B, 3, H, W)`: on CUDA with graphs on
    /// ([`Detector::use_graphs`]), one graph launch; otherwise the model's eager pass.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let _arena = crate::backend::serve_arena(self.device());
        #[cfg(feature = "cuda")]
        if let Some(y) = self.graphed(x, &|t, out| self.model.forward_into(t, out), |y| y.copy()) {
            return y;
        }
        self.model.forward(x)
    }

    /// `f` of the raw output of `x` as [`Detector::forward`] computes it, read in place: from a
    /// graph's own output buffer (no copy out of it) where graphs run. `bench` times the model
    /// this way, as PyTorch's `model(x)` is timed.
    pub fn forward_with<R>(&self, x: &Tensor, mut f: impl FnMut(&Tensor) -> candle_core::Result<R>) -> candle_core::Result<R> {
        let _arena = crate::backend::serve_arena(self.device());
        #[cfg(feature = "cuda")]
        if let Some(r) = self.graphed(x, &|t, out| self.model.forward_into(t, out), |y| f(y)) {
            return r;
        }
        f(&self.model.forward(x)?)
    }

    /// Whether passes on this detector's device replay graphs now.
    pub fn replays_graphs(&self) -> bool {
        #[cfg(feature = "cuda")]
        return self.graphs_on();
        #[cfg(not(feature = "cuda"))]
        false
    }

    #[cfg(feature = "cuda")]
    fn graphs_on(&self) -> bool {
        self.graphs.load(std::sync::atomic::Ordering::Relaxed) && self.device().is_cuda() && crate::backend::tuning::get().cuda_graphs
    }

    /// `f` of the raw output of a batch of pictures by one graph whose pass starts from the
    /// uploaded u8 pictures (normalisation included), so that neither the normalised input nor
    /// the output is copied: `f` reads the graph's own output rows. `None` where graphs are off
    /// or failed (the caller runs the pass eagerly).
    #[cfg(feature = "cuda")]
    fn graphed_pictures<R>(
        &self,
        batch: &[&Letterboxed],
        f: impl FnOnce(&Tensor) -> candle_core::Result<R>,
    ) -> Option<candle_core::Result<R>> {
        if !self.graphs_on() {
            return None;
        }
        let _arena = crate::backend::serve_arena(self.device());
        let x = match self.upload(batch) {
            Ok(x) => x,
            Err(e) => return Some(Err(e)),
        };
        self.graphed(&x, &|t, out| self.pictures_pass(t, out), f)
    }

    /// The pass from uploaded u8 pictures `(B, H, W, 3)`, normalised straight into the model's
    /// own layout (channels last on CUDA with cuDNN: no relayout); `out` as for
    /// [`YoloV9::forward_into`].
    #[cfg(feature = "cuda")]
    fn pictures_pass(&self, t: &Tensor, out: Option<&Tensor>) -> candle_core::Result<Tensor> {
        let channels_last = self.model.lay() == crate::model::layout::Lay::Nhwc;
        crate::backend::normalize_input(t, self.dtype(), channels_last).and_then(|n| self.model.forward_laid(&n, out))
    }

    /// `f` of the output of `pass` on `x` by one graph launch (captured on first use for this
    /// shape and rung); `None` where graphs are off, or the capture or launch failed (then the
    /// detector goes on eagerly). `f` gets the graph's own output rows, valid until the next
    /// launch: it must copy anything it keeps.
    #[cfg(feature = "cuda")]
    fn graphed<R>(
        &self,
        x: &Tensor,
        pass: &dyn Fn(&Tensor, Option<&Tensor>) -> candle_core::Result<Tensor>,
        f: impl FnOnce(&Tensor) -> candle_core::Result<R>,
    ) -> Option<candle_core::Result<R>> {
        use crate::backend::GraphedForward;
        use std::sync::atomic::Ordering::Relaxed;
        let b = x.dim(0).ok()?;
        if !self.graphs_on() {
            return None;
        }
        let mut g = self.graph.lock().ok()?;
        if g.failed || g.retry_at.is_some_and(|t| std::time::Instant::now() < t) {
            return None;
        }
        g.retry_at = None;
        let rung = graph_rung(b, self.ladder.load(Relaxed));
        let found = g.kept.iter().position(|gf| gf.batch() == rung && gf.fits(x));
        let at = match found {
            Some(i) => {
                let gf = g.kept.remove(i);
                g.kept.push(gf);
                g.kept.len() - 1
            }
            None => {
                if g.kept.len() >= MAX_GRAPHS {
                    g.kept.remove(0);
                }
                match GraphedForward::capture(pass, x, rung) {
                    Ok(gf) => {
                        tracing::info!(
                            batch = gf.batch(),
                            picture = ?x.dims().get(1..),
                            graphs = g.kept.len() + 1,
                            arena_mib = crate::backend::arena::stats(x.device()).map_or(0, |s| s.mapped >> 20),
                            graph_pool_mib = crate::backend::devmem::graph_pool_reserved(x.device()) >> 20,
                            "pass captured as a CUDA graph"
                        );
                        g.kept.push(gf);
                        g.kept.len() - 1
                    }
                    Err(e) => {
                        g.give_up("capture", &e);
                        // what the failed capture mapped goes back before the eager pass
                        let _ = crate::backend::devmem::PeakMeter::new(x.device()).trim();
                        return None;
                    }
                }
            }
        };
        match g.kept[at].launch(x) {
            // the lock is held while `f` reads the output: no other launch can overwrite it
            Ok(y) => Some(f(&y)),
            Err(e) => {
                g.give_up("launch", &e);
                None
            }
        }
    }

    /// Candidates above `conf` for every picture of a raw output, in anchor order. On CUDA the
    /// best class and the threshold run on the device and only the survivors come back;
    /// elsewhere one copy of boxes, best score and class per anchor, filtered here.
    pub fn candidates(&self, raw: &Tensor, conf: f32) -> candle_core::Result<Vec<Vec<Candidate>>> {
        self.candidates_timed(raw, conf, &mut StepClock::start(0))
    }

    /// [`Detector::candidates`], its parts timed from the output of a queued pass.
    fn candidates_timed(&self, raw: &Tensor, conf: f32, clock: &mut StepClock) -> candle_core::Result<Vec<Vec<Candidate>>> {
        clock.lap(|p| &mut p.queue);
        let _arena = crate::backend::serve_arena(raw.device());
        #[cfg(feature = "cuda")]
        if let Some(r) = crate::backend::device_candidate_rows(raw, conf) {
            let rows = r?;
            clock.lap(|p| &mut p.candidates);
            let (b, _, a) = raw.dims3()?;
            let lists = postprocess::candidates_from_rows(rows.rows(), b, a);
            clock.lap(|p| &mut p.lists);
            return Ok(lists);
        }
        let (b, no, a) = raw.dims3()?;
        let nc = no - 4;
        let scores = raw.narrow(1, 4, nc)?;
        let best = scores.max_keepdim(1)?;
        let cls = scores.argmax_keepdim(1)?.to_dtype(raw.dtype())?;
        let packed = Tensor::cat(&[raw.narrow(1, 0, 4)?, best, cls], 1)?.to_dtype(DType::F32)?.to_device(&Device::Cpu)?;
        let v = packed.flatten_all()?.to_vec1::<f32>()?;
        clock.lap(|p| &mut p.candidates);
        let lists = (0..b)
            .map(|i| {
                let o = i * 6 * a;
                (0..a)
                    .filter(|&j| v[o + 4 * a + j] > conf)
                    .map(|j| Candidate {
                        xywh: [v[o + j], v[o + a + j], v[o + 2 * a + j], v[o + 3 * a + j]],
                        score: v[o + 4 * a + j],
                        class_id: v[o + 5 * a + j] as usize,
                    })
                    .collect()
            })
            .collect();
        clock.lap(|p| &mut p.lists);
        Ok(lists)
    }

    /// What the detection step takes from a raw output: each picture's candidates, or on CUDA,
    /// where the device runs NMS at these thresholds, each picture's kept boxes.
    fn picked_timed(&self, raw: &Tensor, th: &Thresholds, clock: &mut StepClock) -> candle_core::Result<Picked> {
        #[cfg(feature = "cuda")]
        {
            clock.lap(|p| &mut p.queue);
            let _arena = crate::backend::serve_arena(raw.device());
            if crate::backend::device_nms_takes(raw, th) && self.device_nms_ok() {
                if let Some(kept) = crate::backend::device_nms(raw, th) {
                    let kept = kept?;
                    clock.lap(|p| &mut p.candidates);
                    return Ok(Picked::Kept(kept));
                }
            }
        }
        self.candidates_timed(raw, th.conf, clock).map(Picked::Candidates)
    }

    /// Whether this process runs NMS on the device: checked once, on first use, against the
    /// host's NMS on this device ([`crate::backend::verify_device_nms`]);
    /// where the answers differ or the check fails, the host runs NMS and a warning says why.
    #[cfg(feature = "cuda")]
    fn device_nms_ok(&self) -> bool {
        *self.device_nms.get_or_init(|| {
            let Device::Cuda(dev) = self.device() else { return false };
            match crate::backend::verify_device_nms(dev) {
                Ok(()) => true,
                Err(why) => {
                    tracing::warn!(%why, "the device's NMS does not give the host's answers on this device; NMS runs on the host");
                    false
                }
            }
        })
    }

    /// Detections for a batch of letterboxed pictures, in each picture's original pixels, in
    /// batch order. Pictures of different input shapes (rect letterboxes of different aspect
    /// ratios) run in one pass per shape.
    pub fn detect(&self, batch: &[&Letterboxed], th: &Thresholds) -> candle_core::Result<Vec<Vec<Detection>>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let groups = preprocess::group_positions(batch.iter().map(|lb| (lb.geometry.in_w, lb.geometry.in_h)));
        if groups.len() > 1 {
            let mut out: Vec<Vec<Detection>> = vec![Vec::new(); batch.len()];
            for (_, idx) in groups {
                let group: Vec<&Letterboxed> = idx.iter().map(|&i| batch[i]).collect();
                for (d, i) in self.detect_one_shape(&group, th)?.into_iter().zip(idx) {
                    out[i] = d;
                }
            }
            return Ok(out);
        }
        self.detect_one_shape(batch, th)
    }

    fn detect_one_shape(&self, batch: &[&Letterboxed], th: &Thresholds) -> candle_core::Result<Vec<Vec<Detection>>> {
        let mut clock = StepClock::start(batch.len());
        let cands = {
            #[cfg(feature = "cuda")]
            let graphed = self.graphed_pictures(batch, |raw| self.picked_timed(raw, th, &mut clock));
            #[cfg(not(feature = "cuda"))]
            let graphed: Option<candle_core::Result<Picked>> = None;
            match graphed {
                Some(c) => c?,
                None => self.picked_timed(&self.forward(&self.input(batch)?)?, th, &mut clock)?,
            }
        };
        let geometries: Vec<&LetterboxGeometry> = batch.iter().map(|lb| &lb.geometry).collect();
        Ok(self.finish(cands, &geometries, th, clock))
    }

    /// Detections for pictures already letterboxed on the device: `x` is `(B, H, W, 3)` u8 (as
    /// the GPU JPEG decoder leaves them), `geometries` one per picture.
    #[cfg(feature = "cuda")]
    pub fn detect_uploaded(
        &self,
        x: &Tensor,
        geometries: &[&LetterboxGeometry],
        th: &Thresholds,
    ) -> candle_core::Result<Vec<Vec<Detection>>> {
        let (b, h, w, c) = x.dims4()?;
        if b != geometries.len() || c != 3 || geometries.iter().any(|g| (g.in_w as usize, g.in_h as usize) != (w, h)) {
            candle_core::bail!("{b} pictures of {w}x{h} with {} geometries that do not all match", geometries.len());
        }
        let pass = |t: &Tensor, out: Option<&Tensor>| self.pictures_pass(t, out);
        let mut clock = StepClock::start(b);
        let cands = match self.graphed(x, &pass, |raw| self.picked_timed(raw, th, &mut clock)) {
            Some(c) => c?,
            None => {
                let _arena = crate::backend::serve_arena(self.device());
                self.picked_timed(&pass(x, None)?, th, &mut clock)?
            }
        };
        Ok(self.finish(cands, geometries, th, clock))
    }

    /// Sets up who decodes the JPEGs a feed leaves encoded: nvJPEG with `lanes` decoders where
    /// `choice` asks for it, or where `auto` finds it ([`Detector::use_gpu_jpeg`]). An error (why
    /// nvJPEG cannot run) only where `nvjpeg` was asked for.
    pub fn set_jpeg_decoder(&self, choice: JpegDecoder, lanes: usize) -> Result<JpegSetup, String> {
        if choice == JpegDecoder::Cpu {
            return Ok(JpegSetup::Host);
        }
        #[cfg(feature = "cuda")]
        let why = match self.use_gpu_jpeg(lanes) {
            Ok(backend) => return Ok(JpegSetup::Device { backend }),
            Err(e) => e.to_string(),
        };
        #[cfg(not(feature = "cuda"))]
        let why = {
            let _ = lanes;
            "nvJPEG needs a CUDA build of yolo-edge and a CUDA device".to_string()
        };
        match choice {
            JpegDecoder::Nvjpeg => Err(why),
            _ => Ok(JpegSetup::HostInstead { why }),
        }
    }

    /// Decodes the JPEGs a feed leaves encoded ([`Pixels::Jpeg`]) with nvJPEG on this detector's
    /// GPU from now on, with `lanes` decoders that may run at once ([`Detector::each_decoded`]
    /// runs one thread per decoder); the nvJPEG backend that runs (`hardware` or `default`), or
    /// why there is none (the host then decodes them). Once set up, later calls keep it.
    #[cfg(feature = "cuda")]
    pub fn use_gpu_jpeg(&self, lanes: usize) -> Result<&'static str, crate::backend::JpegError> {
        if let Some(j) = self.jpeg.get() {
            return Ok(j.backend());
        }
        let Device::Cuda(d) = self.device() else {
            return Err(crate::backend::JpegError::Cuda("the detector is not on a CUDA device".into()));
        };
        let j = crate::backend::GpuJpeg::new(d, lanes)?;
        Ok(self.jpeg.get_or_init(|| j).backend())
    }

    /// Detections for the pictures of a feed, in batch order, each with its own outcome:
    /// pictures letterboxed on the host as [`Detector::detect`]; JPEGs left encoded decoded and
    /// letterboxed on the device by nvJPEG ([`Detector::use_gpu_jpeg`]; a picture it does not
    /// take is decoded on the host and written into its slot), or, without it, on the host here.
    /// A picture that cannot be decoded gets its error and the others go on; an error of the
    /// pass itself is the batch's.
    pub fn detect_pictures(
        &self,
        batch: &[&Picture],
        th: &Thresholds,
        limits: &DecodeLimits,
    ) -> candle_core::Result<Vec<Result<Vec<Detection>, ImageError>>> {
        self.detect_pictures_decoded(batch, None, th, limits)
    }

    /// [`Detector::detect_pictures`] of a batch whose JPEGs [`Detector::decode_jpegs`] has
    /// already put on the device (`decoded`); without it, or with a decode made for other
    /// pictures, they are decoded here.
    pub fn detect_pictures_decoded(
        &self,
        batch: &[&Picture],
        decoded: Option<DecodedJpegs>,
        th: &Thresholds,
        limits: &DecodeLimits,
    ) -> candle_core::Result<Vec<Result<Vec<Detection>, ImageError>>> {
        use rayon::prelude::*;
        let mut out: Vec<Option<Result<Vec<Detection>, ImageError>>> = (0..batch.len()).map(|_| None).collect();
        let (mut host, jpegs) = split_encoded(batch);
        #[cfg(feature = "cuda")]
        let jpegs = match self.jpeg.get() {
            Some(gpu) if !jpegs.is_empty() => {
                match decoded.filter(|d| d.made_for(&jpegs, batch.len())) {
                    Some(d) => {
                        for group in d.groups {
                            self.detect_decoded(gpu, group, &jpegs, th, limits, &mut out)?;
                        }
                    }
                    None => self.decode_and_detect(gpu, &jpegs, th, limits, &mut out)?,
                }
                Vec::new()
            }
            _ => jpegs,
        };
        // nothing is decoded ahead without CUDA
        #[cfg(not(feature = "cuda"))]
        let _ = decoded;
        // without a device decoder: on the host, on all cores
        let decoded: Vec<(usize, Result<Letterboxed, ImageError>)> =
            jpegs.par_iter().map(|j| (j.at, j.on_host(self.imgsz as u32, limits))).collect();
        let mut decoded_ok = Vec::with_capacity(decoded.len());
        for (at, r) in decoded {
            match r {
                Ok(lb) => decoded_ok.push((at, lb)),
                Err(e) => out[at] = Some(Err(e)),
            }
        }
        host.extend(decoded_ok.iter().map(|(at, lb)| (*at, lb)));
        let lbs: Vec<&Letterboxed> = host.iter().map(|h| h.1).collect();
        for (d, (at, _)) in self.detect(&lbs, th)?.into_iter().zip(&host) {
            out[*at] = Some(Ok(d));
        }
        Ok(out.into_iter().map(|o| o.unwrap_or_else(|| Ok(Vec::new()))).collect())
    }

    /// Decodes and letterboxes the JPEGs of `batch` that a feed left encoded on the device's
    /// decoder ([`Detector::use_gpu_jpeg`]), on the calling thread's CUDA stream, and returns
    /// once they are on the device: for [`Detector::detect_pictures_decoded`] of the same batch.
    /// `None` without a device decoder or without a JPEG to decode.
    ///
    /// Called on another thread than the one running passes (each thread has its own stream:
    /// [`Detector::each_decoded`]), the decode of the next batch runs while the pass of the
    /// current one does.
    pub fn decode_jpegs(&self, batch: &[&Picture], limits: &DecodeLimits) -> candle_core::Result<Option<DecodedJpegs>> {
        #[cfg(feature = "cuda")]
        if let (Some(gpu), Device::Cuda(d)) = (self.jpeg.get(), self.device()) {
            let (_, jpegs) = split_encoded(batch);
            if jpegs.is_empty() {
                return Ok(None);
            }
            // outside the activation arena: it serves the inference thread's stream alone
            let groups = self.decode_groups(gpu, &jpegs, limits)?;
            use candle_core::cuda_backend::WrapErr;
            d.cuda_stream().synchronize().w()?;
            return Ok(Some(DecodedJpegs { len: batch.len(), groups }));
        }
        let _ = (batch, limits);
        Ok(None)
    }

    /// How many device JPEG decoders may run at once ([`Detector::use_gpu_jpeg`]); 0 without one.
    pub fn device_jpeg_decoders(&self) -> usize {
        #[cfg(feature = "cuda")]
        return self.jpeg.get().map_or(0, |j| j.lanes());
        #[cfg(not(feature = "cuda"))]
        0
    }

    /// Host time of the device JPEG decoder's calls since the last take (`None` without one).
    #[cfg(feature = "cuda")]
    pub fn take_jpeg_profile(&self) -> Option<crate::backend::JpegProfile> {
        self.jpeg.get().map(|j| j.take_profile())
    }

    /// The JPEGs of a batch through nvJPEG and the device letterbox, one input per shape.
    #[cfg(feature = "cuda")]
    fn decode_groups(
        &self,
        gpu: &crate::backend::GpuJpeg,
        jpegs: &[Encoded<'_>],
        limits: &DecodeLimits,
    ) -> candle_core::Result<Vec<DecodedGroup>> {
        let mut out = Vec::new();
        self.decode_groups_then(gpu, jpegs, limits, |g| {
            out.push(g);
            Ok(())
        })?;
        Ok(out)
    }

    /// The JPEGs of a batch through nvJPEG, the device letterbox and a pass, one per shape; each
    /// pass is queued while its decode runs. Results into `out` at each one's position.
    #[cfg(feature = "cuda")]
    fn decode_and_detect(
        &self,
        gpu: &crate::backend::GpuJpeg,
        jpegs: &[Encoded<'_>],
        th: &Thresholds,
        limits: &DecodeLimits,
        out: &mut [Option<Result<Vec<Detection>, ImageError>>],
    ) -> candle_core::Result<()> {
        let _arena = crate::backend::serve_arena(self.device());
        self.decode_groups_then(gpu, jpegs, limits, |g| self.detect_decoded(gpu, g, jpegs, th, limits, out))
    }

    /// Each input shape's JPEGs through nvJPEG and the device letterbox, handed to `then` as soon
    /// as their decode is queued ([`GpuJpeg::decode_letterbox_then`]); returns once nvJPEG is done
    /// with all of them.
    ///
    /// [`GpuJpeg::decode_letterbox_then`]: crate::backend::GpuJpeg::decode_letterbox_then
    #[cfg(feature = "cuda")]
    fn decode_groups_then(
        &self,
        gpu: &crate::backend::GpuJpeg,
        jpegs: &[Encoded<'_>],
        limits: &DecodeLimits,
        mut then: impl FnMut(DecodedGroup) -> candle_core::Result<()>,
    ) -> candle_core::Result<()> {
        let groups = preprocess::group_positions(jpegs.iter().map(|j| (j.geometry.in_w, j.geometry.in_h, j.fit)));
        for ((_, _, fit), positions) in groups {
            let bytes: Vec<&[u8]> = positions.iter().map(|&k| jpegs[k].bytes).collect();
            // the feed checked each header: the stored size is the geometry's original size
            let sizes: Vec<(u32, u32)> = positions.iter().map(|&k| (jpegs[k].geometry.orig_w, jpegs[k].geometry.orig_h)).collect();
            gpu.decode_letterbox_then(&bytes, &sizes, self.imgsz as u32, fit, limits, |(x, decoded)| {
                let pictures = positions.iter().map(|&k| (jpegs[k].at, jpegs[k].bytes.as_ptr() as usize)).collect();
                then(DecodedGroup { pictures, x, decoded })
            })?;
        }
        Ok(())
    }

    /// A pass over one decoded JPEG group; a picture nvJPEG did not take is decoded on the host
    /// into its slot first. Results into `out` at each one's position.
    #[cfg(feature = "cuda")]
    fn detect_decoded(
        &self,
        gpu: &crate::backend::GpuJpeg,
        DecodedGroup { pictures, x, decoded }: DecodedGroup,
        jpegs: &[Encoded<'_>],
        th: &Thresholds,
        limits: &DecodeLimits,
        out: &mut [Option<Result<Vec<Detection>, ImageError>>],
    ) -> candle_core::Result<()> {
        let _arena = crate::backend::serve_arena(self.device());
        let mut geometries = Vec::with_capacity(pictures.len());
        for (k, (&(at, _), r)) in pictures.iter().zip(decoded).enumerate() {
            let Some(j) = jpegs.binary_search_by_key(&at, |j| j.at).ok().map(|i| &jpegs[i]) else {
                candle_core::bail!("decoded JPEG at {at} is not in the batch");
            };
            let why = match r {
                Ok(g) => {
                    geometries.push(g);
                    continue;
                }
                Err(why) => why,
            };
            tracing::debug!(reason = %why, "nvJPEG did not take a picture; decoding it on the host");
            let g = j.geometry;
            match j.on_host(self.imgsz as u32, limits) {
                Ok(lb) if (lb.geometry.in_w, lb.geometry.in_h) == (g.in_w, g.in_h) => {
                    gpu.write_slot(&x, k, &lb)?;
                    geometries.push(lb.geometry);
                }
                // the slot's shape is the one the feed's header check gave: a picture that
                // decodes to another is this picture's error, not the batch's
                decoded => {
                    let e = decoded.map_or_else(
                        |e| e,
                        |lb| ImageError::Corrupt {
                            format: "JPEG".into(),
                            reason: format!(
                                "decoded as {}x{}, its header read as {}x{}",
                                lb.geometry.orig_w, lb.geometry.orig_h, g.orig_w, g.orig_h
                            ),
                        },
                    );
                    out[j.at] = Some(Err(e));
                    geometries.push(*g);
                }
            }
        }
        let refs: Vec<&LetterboxGeometry> = geometries.iter().collect();
        for (d, &(at, _)) in self.detect_uploaded(&x, &refs, th)?.into_iter().zip(&pictures) {
            out[at].get_or_insert(Ok(d));
        }
        Ok(())
    }

    /// NMS (unless the device ran it) and mapping back to each picture: per picture on rayon's
    /// pool (a crowded scene, or an untrained model where every anchor is a candidate, costs
    /// milliseconds per picture on the host, which would add up serially).
    fn finish(&self, picked: Picked, geometries: &[&LetterboxGeometry], th: &Thresholds, mut clock: StepClock) -> Vec<Vec<Detection>> {
        let names = &self.info().names;
        let out = match picked {
            Picked::Kept(kept) => kept.into_iter().zip(geometries).map(|(k, g)| postprocess::finish_kept(k, g, names)).collect(),
            Picked::Candidates(cands) => {
                let finish = |(c, g): (Vec<Candidate>, &&LetterboxGeometry)| postprocess::finish(c, th, g, names);
                if cands.len() == 1 {
                    cands.into_iter().zip(geometries).map(finish).collect()
                } else {
                    use rayon::prelude::*;
                    cands.into_par_iter().zip(geometries.par_iter()).map(finish).collect()
                }
            }
        };
        clock.lap(|p| &mut p.nms);
        *self.step.lock().unwrap_or_else(|p| p.into_inner()) += clock.p;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::graph_rung;

    #[test]
    fn imgsz_is_a_positive_multiple_of_32_up_to_the_bound() {
        for ok in [32, 640, 1280, super::MAX_IMGSZ] {
            assert_eq!(super::check_imgsz(ok), Ok(ok));
        }
        for bad in [0, 16, 650, super::MAX_IMGSZ + 32, 1 << 40] {
            assert!(super::check_imgsz(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn jpeg_decoder_names_are_the_configs() {
        use super::JpegDecoder;
        for (name, want) in [("cpu", JpegDecoder::Cpu), ("nvjpeg", JpegDecoder::Nvjpeg), ("auto", JpegDecoder::Auto)] {
            assert_eq!(name.parse::<JpegDecoder>(), Ok(want), "the command line's {name}");
            assert_eq!(serde_json::from_str::<JpegDecoder>(&format!("\"{name}\"")).unwrap(), want, "the config's {name}");
        }
        let e = "gpu".parse::<JpegDecoder>().unwrap_err();
        assert!(e.contains("`gpu`") && e.contains("cpu, nvjpeg or auto"), "{e}");
        assert!("NVJPEG".parse::<JpegDecoder>().is_err() && serde_json::from_str::<JpegDecoder>("\"NVJPEG\"").is_err());
    }

    #[test]
    fn graph_rungs_are_powers_of_two_up_to_the_top() {
        // a ladder up to 24: 1 2 4 8 16 24
        let rungs: Vec<usize> = (1..=24).map(|b| graph_rung(b, 24)).collect();
        assert_eq!(&rungs[..9], &[1, 2, 4, 4, 8, 8, 8, 8, 16]);
        assert!(rungs[16..].iter().all(|&r| r == 24), "{rungs:?}");
        assert!((1..=24).all(|b| graph_rung(b, 24) >= b), "never fewer pictures than the batch");
        // above the ladder and without one: the batch itself
        assert_eq!(graph_rung(30, 24), 30);
        assert_eq!(graph_rung(5, 0), 5);
        assert_eq!(graph_rung(1, 1), 1);
        let distinct: std::collections::BTreeSet<usize> = (1..=256).map(|b| graph_rung(b, 256)).collect();
        assert_eq!(distinct.len(), 9, "1, 2, 4, ..., 256");
    }
}
