//! The processing pipeline: intake -> decode/letterbox pool (bounded, order-preserving) ->
//! batcher (current batch or `max_wait`) -> one inference thread owning the detector (runtime
//! OOM fallback: split, lower, probe back up) -> ordered outcomes for the publisher.
//!
//! With nvJPEG (`[device] jpeg_decoder`) the pool only checks each JPEG's header and the
//! inference thread decodes and letterboxes the batch's JPEGs on the device before its pass
//! ([`Detector::detect_pictures`]); other formats are decoded on the pool as always.
//!
//! Stream frames (cameras, video) do not pass the intake: they wait in the [`FrameHub`]'s
//! per-stream slots, and the batcher takes at most one per stream per batch, round-robin, and
//! letterboxes them on the pool (they are decoded pixels already).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use crate::agent::config::Config;
use crate::agent::events::EventSink;
use crate::agent::frames::{FrameHub, FrameMeta, FramePixels};
use crate::agent::messages::{BatchChangeReason, EventBody, InputStage, OomAction};
use crate::agent::telemetry::{Stage, Stats};
use crate::backend::oom::{is_oom, OomInjector};
use crate::detector::Detector;
use crate::planner::Plan;
use crate::vision::feed::{self, FeedOptions, Picture, Pixels, StageTimes};
use crate::vision::postprocess::Detection;
use crate::vision::preprocess::{self, DecodeLimits, Fit};

/// Where a picture came from: a file path, an id (MQTT) or a stream's frame.
#[derive(Debug, Clone)]
pub enum ImageRef {
    Path(PathBuf),
    Id(String),
    Frame(FrameMeta),
}

/// The bytes of a picture: read from disk by the decode pool, or carried in the message; or a
/// stream's decoded frame (letterboxed as it is).
#[derive(Debug)]
pub enum JobData {
    File(PathBuf),
    Bytes(Vec<u8>),
    Frame(FramePixels),
}

/// What the batcher waits on: a picture being decoded, or word that a stream frame waits in the
/// [`FrameHub`].
pub enum Pending {
    Picture(Receiver<Decoded>),
    Wake,
}

/// What to do with the input once its outcome is safely delivered (acknowledged or spooled).
#[derive(Debug, Clone)]
pub enum Completion {
    None,
    File { path: PathBuf, done_dir: PathBuf, failed_dir: PathBuf },
}

impl Completion {
    /// Moves a processed file into `done/`.
    pub fn done(&self) -> std::io::Result<()> {
        match self {
            Completion::None => Ok(()),
            Completion::File { path, done_dir, .. } => move_into(path, done_dir).map(|_| ()),
        }
    }

    /// Moves a rejected file into `failed/`, with `<name>.reason.txt` beside it.
    pub fn failed(&self, reason: &str) -> std::io::Result<()> {
        match self {
            Completion::None => Ok(()),
            Completion::File { path, failed_dir, .. } => {
                let dest = move_into(path, failed_dir)?;
                let mut name = dest.file_name().unwrap_or_default().to_os_string();
                name.push(".reason.txt");
                std::fs::write(dest.with_file_name(name), format!("{reason}\n"))
            }
        }
    }
}

/// Renames `path` into `dir` (created if needed), never overwriting: a taken name gets `.N`.
fn move_into(path: &Path, dir: &Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().ok_or_else(|| std::io::Error::other("no file name"))?;
    let mut dest = dir.join(name);
    let mut n = 1;
    // the entry itself, not what it names: a link to nothing already there is a taken name too
    while std::fs::symlink_metadata(&dest).is_ok() {
        let mut alt = name.to_os_string();
        alt.push(format!(".{n}"));
        dest = dir.join(alt);
        n += 1;
    }
    std::fs::rename(path, &dest)?;
    Ok(dest)
}

/// One picture to process.
#[derive(Debug)]
pub struct Job {
    pub source: Arc<str>,
    pub image: ImageRef,
    pub data: JobData,
    pub completion: Completion,
}

/// The model as named in messages, swapped with the detector.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelMeta {
    pub variant: String,
    pub nc: usize,
    pub names: Vec<String>,
    pub sha256: String,
    pub path: String,
    /// `variant:sha256[..12]`, the `model` field of detection messages.
    pub label: String,
}

impl ModelMeta {
    pub fn of(d: &Detector) -> Self {
        let i = d.info();
        let variant = i.variant.name().to_string();
        let label = format!("{variant}:{}", &i.sha256[..i.sha256.len().min(12)]);
        Self { variant, nc: i.nc, names: i.names.clone(), sha256: i.sha256.clone(), path: i.path.clone(), label }
    }
}

/// The result for one picture, in intake order per source.
#[derive(Debug)]
pub enum Outcome {
    Detected { job: Job, w: u32, h: u32, batch_size: usize, decode_ms: f64, infer_ms: f64, detections: Vec<Detection>, model: Arc<str> },
    Failed { job: Job, stage: InputStage, reason: String },
}

/// Requests to the inference thread, applied between batches.
pub enum Control {
    SwapModel(Box<Detector>),
}

pub struct Decoded {
    job: Job,
    result: Result<Picture, String>,
    /// Reading and decoding (or checking a JPEG's header for the device), in milliseconds.
    ms: f64,
    /// The letterbox after it, in milliseconds (None: not letterboxed here: the picture did not
    /// decode, or it is a JPEG for the device's decoder).
    letterbox_ms: Option<f64>,
    /// When the decode task finished (the queue wait runs from here to the batch's start).
    ready: Instant,
}

/// How the decode pool prepares a picture.
#[derive(Debug, Clone, Copy)]
struct Prep {
    limits: DecodeLimits,
    imgsz: u32,
    fit: Fit,
    /// JPEGs are left encoded for the detector's device decoder.
    jpeg_on_device: bool,
}

impl Prep {
    fn feed(&self) -> FeedOptions {
        FeedOptions { imgsz: self.imgsz, fit: self.fit, limits: self.limits, jpeg_on_device: self.jpeg_on_device, ..FeedOptions::default() }
    }
}

/// What the pipeline reads from and writes to.
pub struct Wiring {
    /// The validated config, and each reload's.
    pub cfg: watch::Receiver<Arc<Config>>,
    /// Pictures from folder and MQTT sources.
    pub intake: mpsc::Receiver<Job>,
    /// The newest frame of each camera and video stream.
    pub hub: Arc<FrameHub>,
    /// Every job's outcome, in the order batches finish.
    pub results: mpsc::Sender<Outcome>,
    /// Where the pipeline's events go (batch changes, out-of-memory fallbacks, re-plans).
    pub events: EventSink,
    /// The counters telemetry and metrics read.
    pub stats: Arc<Stats>,
}

/// Handles of the running pipeline threads.
pub struct Pipeline {
    pub control: SyncSender<Control>,
    pub model: Arc<RwLock<ModelMeta>>,
    threads: Vec<JoinHandle<()>>,
}

impl Pipeline {
    /// Starts the pipeline with the batch and plan the agent started with. It ends by itself
    /// once the intake is closed and drained and the hub closed, after the last outcome has been
    /// sent on `results`.
    pub fn start(detector: Detector, startup_batch: usize, plan: Option<Plan>, wiring: Wiring) -> std::io::Result<Self> {
        let Wiring { cfg, intake, hub, results, events, stats } = wiring;
        let c = cfg.borrow().clone();
        let threads_n = c.device.decode_threads.max(1);
        let pool = Arc::new(
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads_n)
                .thread_name(|i| format!("decode-{i}"))
                .build()
                .map_err(std::io::Error::other)?,
        );
        // decoded pictures waiting for the batcher: two batches' worth of the startup batch (the
        // working batch never grows past it), which the planner counts in on host memory
        // (`planner::probe::PICTURES_PER_BATCH_SLOT`)
        let queue = (2 * startup_batch).max(threads_n * 2).max(8);
        let (ordered_tx, ordered_rx) = sync_channel::<Pending>(queue);
        hub.set_wake(ordered_tx.clone());
        let (batch_tx, batch_rx) = sync_channel::<Vec<Decoded>>(1);
        // the inference thread asks for each batch: the batcher fills one only when it can run
        // at once, so that stream frames are taken from their slots as late as possible
        let (ready_tx, ready_rx) = sync_channel::<()>(1);
        let (control_tx, control_rx) = sync_channel::<Control>(2);
        let model = Arc::new(RwLock::new(ModelMeta::of(&detector)));
        stats.batch_current.store(startup_batch as u64, Relaxed);
        stats.batch_startup.store(startup_batch as u64, Relaxed);
        stats.batch_ceiling.store(startup_batch as u64, Relaxed);
        let limits = c.input.decode_limits();
        let prep = Prep { limits, imgsz: c.device.imgsz as u32, fit: c.device.fit, jpeg_on_device: detector.device_jpeg_decoders() > 0 };
        let mut threads = Vec::new();

        let st = stats.clone();
        let dispatch_pool = pool.clone();
        threads.push(
            std::thread::Builder::new().name("dispatch".into()).spawn(move || dispatch(intake, dispatch_pool, ordered_tx, prep, st))?,
        );
        let st = stats.clone();
        let b = Batcher {
            ordered: ordered_rx,
            ready: ready_rx,
            out: batch_tx,
            max_wait: c.device.max_wait,
            hub,
            cfg: cfg.clone(),
            pool,
            prep,
            stats: st,
        };
        threads.push(std::thread::Builder::new().name("batcher".into()).spawn(move || b.run())?);
        // graphs for the batch sizes this worker runs: a ladder up to its batch
        detector.set_graph_ladder(startup_batch);
        let shapes = Shapes::new(plan, detector.imgsz() as u32, startup_batch);
        let worker = Worker {
            detector,
            model: model.clone(),
            cfg,
            startup: startup_batch,
            current: startup_batch,
            shapes,
            last_change: Instant::now(),
            last_oom: None,
            last_pressure: None,
            last_work: Instant::now(),
            released: false,
            frames_done: 0,
            infer_delay: c.infer_delay,
            limits,
            ready: ready_tx,
            asked: false,
            injector: c.inject_oom,
            events,
            stats,
        };
        threads.push(std::thread::Builder::new().name("inference".into()).spawn(move || worker.run(batch_rx, control_rx, results))?);
        Ok(Self { control: control_tx, model, threads })
    }

    /// Waits for the pipeline threads (after the intake closed).
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Decodes and letterboxes a picture (a JPEG for the device's decoder: checks its header); also
/// returns the milliseconds the letterbox took, where it ran here.
fn decode(job: &mut Job, p: &Prep) -> Result<(Picture, Option<f64>), String> {
    let limits = &p.limits;
    let bytes = match &mut job.data {
        JobData::Frame(f) => {
            if f.width > limits.max_side || f.height > limits.max_side || f.width as u64 * f.height as u64 > limits.max_pixels {
                return Err(format!("frame {}x{} is above the input limits (input.max_side, input.max_pixels)", f.width, f.height));
            }
            // the pixels move into the picture; the job keeps an empty frame of the same size
            let data = std::mem::take(&mut f.data);
            let img = image::RgbImage::from_raw(f.width, f.height, data)
                .ok_or_else(|| format!("frame {}x{}: wrong pixel count", f.width, f.height))?;
            let t = Instant::now();
            let lb = preprocess::letterbox_fit(&img, p.imgsz, p.fit);
            return Ok((Picture { pixels: Pixels::Letterboxed(lb), decoded: None }, Some(t.elapsed().as_secs_f64() * 1e3)));
        }
        // the bytes move into the picture (a JPEG for the device keeps them until its batch runs)
        JobData::Bytes(b) => std::mem::take(b),
        JobData::File(path) => preprocess::read_image_file(path, limits).map_err(|e| e.to_string())?,
    };
    let mut t = StageTimes::default();
    let picture = feed::picture_from_bytes(bytes, &p.feed(), &mut t).map_err(|e| e.to_string())?;
    let letterbox_ms = picture.letterboxed().map(|_| t.letterbox.as_secs_f64() * 1e3);
    Ok((picture, letterbox_ms))
}

/// Decodes (or takes a frame's pixels) and letterboxes one job, timing it.
fn prepare(mut job: Job, p: &Prep) -> Decoded {
    let t = Instant::now();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decode(&mut job, p)))
        .unwrap_or_else(|_| Err("decoder panicked on this input".to_string()));
    let total_ms = t.elapsed().as_secs_f64() * 1e3;
    let letterbox_ms = result.as_ref().ok().and_then(|r| r.1);
    let result = result.map(|r| r.0);
    let ms = total_ms - letterbox_ms.unwrap_or(0.0);
    Decoded { job, result, ms, letterbox_ms, ready: Instant::now() }
}

fn dispatch(mut intake: mpsc::Receiver<Job>, pool: Arc<rayon::ThreadPool>, ordered: SyncSender<Pending>, prep: Prep, stats: Arc<Stats>) {
    while let Some(job) = intake.blocking_recv() {
        stats.frames_in.fetch_add(1, Relaxed);
        stats.q_intake.store(intake.len() as u64, Relaxed);
        let (tx, rx) = sync_channel(1);
        pool.spawn(move || {
            let _ = tx.send(prepare(job, &prep));
        });
        stats.q_decoded.fetch_add(1, Relaxed);
        if ordered.send(Pending::Picture(rx)).is_err() {
            return;
        }
    }
}

struct Batcher {
    ordered: Receiver<Pending>,
    /// One token per batch the inference thread is ready for.
    ready: Receiver<()>,
    out: SyncSender<Vec<Decoded>>,
    max_wait: Duration,
    hub: Arc<FrameHub>,
    /// The config: whether any folder or MQTT source feeds the intake (without, a batch holding
    /// a frame of every stream goes at once instead of waiting `max_wait` for pictures).
    cfg: watch::Receiver<Arc<Config>>,
    pool: Arc<rayon::ThreadPool>,
    prep: Prep,
    stats: Arc<Stats>,
}

impl Batcher {
    /// Fills each batch up to the current batch size: pictures in intake order, and stream
    /// frames at most one per stream, round-robin; a partial batch goes after `max_wait` (or at
    /// once when only streams feed the pipeline and every stream has a frame in it).
    fn run(self) {
        let take = |rx: Receiver<Decoded>| {
            self.stats.q_decoded.fetch_sub(1, Relaxed);
            // The decode task always answers (panics are caught), so this only fails if the pool died.
            rx.recv().ok()
        };
        let mut token = false;
        loop {
            if !token {
                if self.ready.recv().is_err() {
                    return;
                }
                token = true;
            }
            // the working batch size, read afresh at every step: it may fall (out of memory, memory
            // high) while the batcher waits for the first picture
            let target = || self.stats.batch_current.load(Relaxed).max(1) as usize;
            let mut items: Vec<Decoded> = Vec::new();
            // frames already waiting start the batch (a slot that stays full sends no wake);
            // otherwise the first picture or wake does
            let mut frames: Vec<Job> = self.hub.take(target(), &[]);
            let mut in_batch: Vec<Arc<str>> = frames.iter().map(|j| j.source.clone()).collect();
            if frames.is_empty() {
                match self.ordered.recv() {
                    Ok(Pending::Picture(rx)) => items.extend(take(rx)),
                    Ok(Pending::Wake) => {}
                    Err(_) => return,
                }
            }
            let deadline = Instant::now() + self.max_wait;
            let pictures = self.cfg.borrow().has_picture_sources();
            loop {
                let target = target();
                let have = items.iter().filter(|d| d.result.is_ok()).count() + frames.len();
                if have < target {
                    let got = self.hub.take(target - have, &in_batch);
                    in_batch.extend(got.iter().map(|j| j.source.clone()));
                    frames.extend(got);
                }
                let have = items.iter().filter(|d| d.result.is_ok()).count() + frames.len();
                if have >= target || (!pictures && have > 0 && in_batch.len() >= self.hub.streams()) {
                    break;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                let next = if left.is_zero() {
                    self.ordered.try_recv().map_err(|_| RecvTimeoutError::Timeout)
                } else {
                    self.ordered.recv_timeout(left)
                };
                match next {
                    Ok(Pending::Picture(rx)) => items.extend(take(rx)),
                    Ok(Pending::Wake) => {}
                    Err(_) => break,
                }
            }
            if !frames.is_empty() {
                self.stats.frames_in.fetch_add(frames.len() as u64, Relaxed);
                let prep = self.prep;
                let prepared: Vec<Decoded> = self.pool.install(|| {
                    use rayon::prelude::*;
                    frames.into_par_iter().map(|job| prepare(job, &prep)).collect()
                });
                items.extend(prepared);
            }
            // nothing came (a stale wake): the token is kept for the next batch
            if items.is_empty() {
                continue;
            }
            if self.out.send(items).is_err() {
                return;
            }
            token = false;
        }
    }
}

/// How long a shape keeps holding the working batch's ceiling after its last picture.
const SHAPE_WINDOW: Duration = Duration::from_secs(60);

/// Most shapes remembered (a rect letterbox at `imgsz` makes at most `2 x imgsz / 32`); the one
/// seen longest ago goes first.
const MAX_SHAPES: usize = 64;

/// The input shapes the inference thread has run and the batch each allows; with a fixed
/// batch, or no plan, the startup batch for every shape.
struct Shapes {
    plan: Option<Plan>,
    /// The side of the square the plan measured (`imgsz`).
    side: u32,
    startup: usize,
    /// (shape, its batch, when last seen)
    seen: Vec<((u32, u32), usize, Instant)>,
}

impl Shapes {
    fn new(plan: Option<Plan>, side: u32, startup: usize) -> Self {
        Self { plan, side, startup, seen: Vec::new() }
    }

    /// Records `shapes` as seen `now`; returns those not seen before, each at the startup batch
    /// until [`Self::set`] gives it its own.
    fn note(&mut self, shapes: impl IntoIterator<Item = (u32, u32)>, now: Instant) -> Vec<(u32, u32)> {
        let mut new = Vec::new();
        for shape in shapes {
            if let Some(e) = self.seen.iter_mut().find(|e| e.0 == shape) {
                e.2 = now;
                continue;
            }
            if self.seen.len() >= MAX_SHAPES {
                if let Some(oldest) = (0..self.seen.len()).min_by_key(|&i| self.seen[i].2) {
                    self.seen.swap_remove(oldest);
                }
            }
            self.seen.push((shape, self.startup, now));
            new.push(shape);
        }
        new
    }

    /// The batch of `shape`.
    fn set(&mut self, shape: (u32, u32), batch: usize) {
        if let Some(e) = self.seen.iter_mut().find(|e| e.0 == shape) {
            e.1 = batch;
        }
    }

    /// The smallest batch of the shapes seen within [`SHAPE_WINDOW`] of `now`, and its shape;
    /// `None` before the first picture.
    fn ceiling(&self, now: Instant) -> Option<(usize, (u32, u32))> {
        self.seen
            .iter()
            .filter(|e| now.saturating_duration_since(e.2) <= SHAPE_WINDOW)
            .min_by_key(|e| (e.1, std::cmp::Reverse(e.0 .0 as u64 * e.0 .1 as u64)))
            .map(|e| (e.1, e.0))
    }
}

struct Worker {
    detector: Detector,
    model: Arc<RwLock<ModelMeta>>,
    cfg: watch::Receiver<Arc<Config>>,
    startup: usize,
    current: usize,
    /// The input shapes seen and the batch they allow (the working batch's ceiling).
    shapes: Shapes,
    last_change: Instant,
    last_oom: Option<Instant>,
    /// When the last step down for high memory was taken.
    last_pressure: Option<Instant>,
    /// When the last batch ran, and whether the pool was given back since.
    last_work: Instant,
    released: bool,
    frames_done: u64,
    /// `[debug] infer_delay_ms`: a deliberately slow model.
    infer_delay: Option<Duration>,
    /// The input limits the device's JPEG decoder checks too.
    limits: DecodeLimits,
    /// Asks the batcher for the next batch; `asked`: a request is outstanding.
    ready: SyncSender<()>,
    asked: bool,
    injector: Option<OomInjector>,
    events: EventSink,
    stats: Arc<Stats>,
}

/// A picture's detections, the batch it ran in and the pass's milliseconds; or the stage that
/// failed and why.
type FrameResult = Result<(Vec<Detection>, usize, f64), (InputStage, String)>;

impl Worker {
    fn run(mut self, batches: Receiver<Vec<Decoded>>, control: Receiver<Control>, results: mpsc::Sender<Outcome>) {
        loop {
            while let Ok(Control::SwapModel(d)) = control.try_recv() {
                self.swap(*d);
            }
            self.maybe_lower_for_memory();
            self.maybe_probe_up();
            if !self.asked {
                self.asked = self.ready.try_send(()).is_ok();
            }
            let items = match batches.recv_timeout(Duration::from_millis(100)) {
                Ok(i) => {
                    self.asked = false;
                    i
                }
                Err(RecvTimeoutError::Timeout) => {
                    self.maybe_release_idle();
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            };
            let frames: Vec<&Picture> = items.iter().filter_map(|d| d.result.as_ref().ok()).collect();
            let mut out: VecDeque<FrameResult> = VecDeque::with_capacity(frames.len());
            let start = Instant::now();
            for d in items.iter().filter(|d| d.result.is_ok()) {
                self.stats.record(Stage::QueueWait, start.saturating_duration_since(d.ready).as_secs_f64() * 1e3);
            }
            if !frames.is_empty() {
                self.last_work = Instant::now();
                self.released = false;
                self.stats.batches.fetch_add(1, Relaxed);
                self.follow_shapes(&frames);
                self.infer_by_shape(&frames, &mut out);
            }
            let label: Arc<str> = self.model.read().map(|m| Arc::from(m.label.as_str())).unwrap_or_else(|_| Arc::from("unknown"));
            for d in items {
                self.stats.record_decode(d.ms, d.letterbox_ms);
                let outcome = match d.result {
                    Err(reason) => Outcome::Failed { job: d.job, stage: InputStage::Decode, reason },
                    Ok(picture) => match out.pop_front() {
                        Some(Ok((detections, batch_size, infer_ms))) => Outcome::Detected {
                            job: d.job,
                            w: picture.geometry().orig_w,
                            h: picture.geometry().orig_h,
                            batch_size,
                            decode_ms: d.ms + d.letterbox_ms.unwrap_or(0.0),
                            infer_ms,
                            detections,
                            model: label.clone(),
                        },
                        Some(Err((stage, reason))) => Outcome::Failed { job: d.job, stage, reason },
                        None => Outcome::Failed { job: d.job, stage: InputStage::Infer, reason: "no result".into() },
                    },
                };
                self.stats.q_results.fetch_add(1, Relaxed);
                if results.blocking_send(outcome).is_err() {
                    return;
                }
            }
        }
    }

    /// Runs `frames` one forward pass per input shape (pictures of different sizes letterbox to
    /// different rectangles), at most the working batch per pass (a batch gathered before a
    /// larger shape lowered it is split); results in the order of `frames`.
    fn infer_by_shape(&mut self, frames: &[&Picture], out: &mut VecDeque<FrameResult>) {
        let groups = preprocess::group_positions(frames.iter().map(|p| (p.geometry().in_w, p.geometry().in_h)));
        if groups.len() <= 1 && frames.len() <= self.current {
            return self.infer(frames, out);
        }
        let mut by_frame: Vec<Option<FrameResult>> = vec![None; frames.len()];
        for (_, idx) in groups {
            for chunk in idx.chunks(self.current.max(1)) {
                let group: Vec<&Picture> = chunk.iter().map(|&i| frames[i]).collect();
                let mut part = VecDeque::with_capacity(group.len());
                self.infer(&group, &mut part);
                for (&i, r) in chunk.iter().zip(part) {
                    by_frame[i] = Some(r);
                }
            }
        }
        out.extend(by_frame.into_iter().map(|r| r.unwrap_or_else(|| Err((InputStage::Infer, "no result".into())))));
    }

    /// Notes the input shapes of a batch about to run: a shape not seen before gets its batch
    /// ([`Self::plan_shape`], `shape_planned`), and the working batch follows the ceiling of the
    /// shapes of the last [`SHAPE_WINDOW`]: down at once, up when nothing recent argues against
    /// it (an out-of-memory error or high memory within `oom.quiet_period_s`, or a batch already
    /// lowered by them).
    fn follow_shapes(&mut self, frames: &[&Picture]) {
        let now = Instant::now();
        let new = self.shapes.note(frames.iter().map(|p| (p.geometry().in_w, p.geometry().in_h)), now);
        for shape in new {
            if let Some(batch) = self.plan_shape(shape) {
                self.shapes.set(shape, batch);
            }
        }
        let Some((ceiling, (w, h))) = self.shapes.ceiling(now) else { return };
        self.stats.ceiling_shape_w.store(w as u64, Relaxed);
        self.stats.ceiling_shape_h.store(h as u64, Relaxed);
        let before = self.stats.batch_ceiling.swap(ceiling as u64, Relaxed) as usize;
        if ceiling == before {
            return;
        }
        let calm = self.no_recent_memory_trouble() && !self.stats.memory_high.load(Relaxed);
        if self.current > ceiling || (self.current == before && calm) {
            self.set_batch(ceiling, BatchChangeReason::Shape);
        }
    }

    /// The batch for a new input shape, from the startup plan (`None` without one):
    /// [`Plan::decide_shape`] with passes of this detector at that shape.
    fn plan_shape(&mut self, (w, h): (u32, u32)) -> Option<usize> {
        let plan = self.shapes.plan.as_ref()?;
        let t = Instant::now();
        let mut prober = crate::planner::DetectorProber::at_shape(&self.detector, w, h);
        let d = plan.decide_shape(&mut prober, self.shapes.side, w, h, self.startup);
        for tried in d.tried.iter().filter(|p| p.peak.is_none() || p.batch != d.batch) {
            tracing::info!(
                width = w,
                height = h,
                batch = tried.batch,
                peak = tried.peak,
                error = tried.error,
                budget = plan.budget.bytes,
                "shape batch did not fit"
            );
        }
        if !d.tried.is_empty() {
            let _ = crate::backend::devmem::PeakMeter::new(self.detector.device()).reset();
            tracing::info!(width = w, height = h, batch = d.batch, ms = t.elapsed().as_millis() as u64, "shape batch measured");
        }
        self.events.emit(EventBody::ShapePlanned {
            width: w,
            height: h,
            area_ratio: (d.estimate.area_ratio * 1e4).round() / 1e4,
            estimated: d.estimate.batch,
            predicted_peak: d.estimate.predicted_peak,
            batch: d.batch,
            verified_peak: d.verified_peak,
            budget: plan.budget.bytes,
            startup: self.startup,
        });
        Some(d.batch)
    }

    /// Runs `frames`, splitting in halves on OOM (same frames, same order) down to one.
    fn infer(&mut self, frames: &[&Picture], out: &mut VecDeque<FrameResult>) {
        let n = frames.len();
        let th = self.cfg.borrow().model.thresholds;
        let t = Instant::now();
        if let Some(d) = self.infer_delay {
            std::thread::sleep(d);
        }
        let r = match self.injector.and_then(|i| i.check(n, self.frames_done)) {
            Some(e) => Err(e),
            None => self.detector.detect_pictures(frames, &th, &self.limits),
        };
        let ms = t.elapsed().as_secs_f64() * 1e3;
        match r {
            Ok(dets) if dets.len() == n => {
                self.frames_done += n as u64;
                self.stats.record(Stage::Infer, ms);
                // a JPEG that neither the device's decoder nor the host could decode fails alone
                out.extend(dets.into_iter().map(|d| d.map(|d| (d, n, ms)).map_err(|e| (InputStage::Decode, e.to_string()))));
            }
            Ok(dets) => {
                out.extend((0..n).map(|_| Err((InputStage::Infer, format!("model returned {} results for {n} pictures", dets.len())))))
            }
            Err(e) if is_oom(&e) => {
                self.stats.oom_fallbacks.fetch_add(1, Relaxed);
                let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
                self.stats.last_oom_unix_ms.store(now_ms, Relaxed);
                self.last_oom = Some(Instant::now());
                let err = e.to_string().lines().next().unwrap_or_default().to_string();
                // give the pool's cached, unused memory back before retrying smaller
                if let Err(te) = crate::backend::devmem::PeakMeter::new(self.detector.device()).trim() {
                    tracing::warn!(error = %te, "could not trim the memory pool after out-of-memory");
                }
                if n == 1 {
                    self.events.emit(EventBody::OomFallback {
                        batch: 1,
                        action: Some(OomAction::FrameFailed),
                        retry_as: None,
                        batch_before: None,
                        batch_after: None,
                        error: err.clone(),
                    });
                    out.push_back(Err((InputStage::Infer, format!("out of memory at batch 1: {err}"))));
                    return;
                }
                let half = n / 2;
                let old = self.current;
                // the larger half (ceil), so that doubling back up reaches an odd startup batch
                // (75 -> 38 -> 76, capped at 75) instead of stopping one short (75 -> 37 -> 74)
                self.set_batch(self.current.min(n - half).max(1), BatchChangeReason::Oom);
                self.events.emit(EventBody::OomFallback {
                    batch: n,
                    action: None,
                    retry_as: Some([n - half, half]),
                    batch_before: Some(old),
                    batch_after: Some(self.current),
                    error: err,
                });
                let (a, b) = frames.split_at(n - half);
                self.infer(a, out);
                self.infer(b, out);
            }
            Err(e) => {
                let msg = e.to_string().lines().next().unwrap_or_default().to_string();
                out.extend((0..n).map(|_| Err((InputStage::Infer, msg.clone()))));
            }
        }
    }

    fn set_batch(&mut self, b: usize, reason: BatchChangeReason) {
        if b != self.current {
            self.events.emit(EventBody::BatchChange { from: self.current, to: b, startup: self.startup, reason });
            self.current = b;
            self.detector.set_graph_ladder(b);
            self.last_change = Instant::now();
            self.stats.batch_current.store(b as u64, Relaxed);
        }
    }

    /// After a quiet period without OOM, one step back up (doubling, capped at the startup batch).
    /// After `oom.release_idle_s` without work, gives the pool's cached memory back to the device
    /// (other services on a shared GPU can use it; the next batch allocates it again).
    fn maybe_release_idle(&mut self) {
        let Some(idle) = self.cfg.borrow().release_idle else { return };
        if self.released || self.last_work.elapsed() < idle || !self.detector.device().is_cuda() {
            return;
        }
        self.released = true;
        let meter = crate::backend::devmem::PeakMeter::new(self.detector.device());
        let before = meter.usage().map(|u| u.reserved).ok();
        match meter.trim() {
            Ok(()) => {
                let after = meter.usage().map(|u| u.reserved).ok();
                self.events.emit(EventBody::MemoryReleased { idle_s: idle.as_secs_f64(), reserved_before: before, reserved_after: after });
            }
            Err(e) => tracing::warn!(error = %e, "could not release idle pool memory"),
        }
    }

    fn maybe_probe_up(&mut self) {
        let ceiling = (self.stats.batch_ceiling.load(Relaxed) as usize).max(1);
        if self.current >= ceiling || self.stats.memory_high.load(Relaxed) {
            return;
        }
        if self.no_recent_memory_trouble() && self.last_change.elapsed() >= self.cfg.borrow().oom_quiet_period {
            self.set_batch((self.current * 2).min(ceiling), BatchChangeReason::Probe);
        }
    }

    /// No out-of-memory error and no step down for high memory within `oom.quiet_period_s`.
    fn no_recent_memory_trouble(&self) -> bool {
        let quiet = self.cfg.borrow().oom_quiet_period;
        self.last_oom.is_none_or(|t| t.elapsed() >= quiet) && self.last_pressure.is_none_or(|t| t.elapsed() >= quiet)
    }

    /// While the memory watchdog holds memory high (`agent::watchdog`) and `watchdog.lower_batch`
    /// is on: one step down (halving, to 1) per watchdog reading, the allocator's free memory
    /// handed back at each, so that the agent gives memory back before a CUDA error or the
    /// kernel's OOM killer would take it. Probing back up waits for `memory_ok` and the quiet
    /// period.
    fn maybe_lower_for_memory(&mut self) {
        if !self.stats.memory_high.load(Relaxed) {
            return;
        }
        let w = self.cfg.borrow().watchdog;
        if !w.lower_batch || self.last_pressure.is_some_and(|t| t.elapsed() < w.interval) {
            return;
        }
        self.last_pressure = Some(Instant::now());
        if self.current > 1 {
            self.set_batch((self.current / 2).max(1), BatchChangeReason::MemoryHigh);
        }
        if let Err(e) = crate::backend::devmem::PeakMeter::new(self.detector.device()).trim() {
            tracing::warn!(error = %e, "could not give free memory back under memory pressure");
        }
    }

    fn swap(&mut self, d: Detector) {
        let meta = ModelMeta::of(&d);
        // the shapes' batches above the startup one were measured with the old model: back to
        // the startup batch, and each shape is measured again with the new one as it comes
        self.shapes.seen.clear();
        self.stats.batch_ceiling.store(self.startup as u64, Relaxed);
        if self.current > self.startup {
            self.set_batch(self.startup, BatchChangeReason::Shape);
        }
        d.set_graph_ladder(self.current);
        let old = std::mem::replace(&mut self.detector, d);
        let old_meta = ModelMeta::of(&old);
        drop(old);
        if let Ok(mut m) = self.model.write() {
            *m = meta.clone();
        }
        self.stats.model_ready.store(true, Relaxed);
        self.stats.model_reloads.fetch_add(1, Relaxed);
        self.events.emit(EventBody::ModelReloaded { from: old_meta.label, to: meta.label, path: meta.path, sha256: meta.sha256 });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::test_plan;

    /// With a device JPEG decoder the pool leaves a JPEG encoded (its header checked, its geometry
    /// where the device's letterbox puts it) and decodes anything else; without one it decodes
    /// JPEGs too; bytes that are no picture fail in the pool either way.
    #[test]
    fn jpegs_for_the_device_are_checked_not_decoded() {
        use image::ImageEncoder;
        let img = image::RgbImage::from_fn(200, 100, |x, y| image::Rgb([x as u8, y as u8, 7]));
        let mut jpeg = Vec::new();
        image::codecs::jpeg::JpegEncoder::new(&mut jpeg).write_image(&img, 200, 100, image::ExtendedColorType::Rgb8).unwrap();
        let mut png = Vec::new();
        image::codecs::png::PngEncoder::new(&mut png).write_image(&img, 200, 100, image::ExtendedColorType::Rgb8).unwrap();
        let job = |data| Job { source: Arc::from("s"), image: ImageRef::Id("x".into()), data, completion: Completion::None };
        let device = Prep { limits: DecodeLimits::default(), imgsz: 640, fit: Fit::Rect, jpeg_on_device: true };
        let d = prepare(job(JobData::Bytes(jpeg.clone())), &device);
        match &d.result {
            Ok(Picture { pixels: Pixels::Jpeg { bytes, geometry, fit: Fit::Rect }, .. }) => {
                assert_eq!(bytes, &jpeg);
                assert_eq!((geometry.orig_w, geometry.orig_h, geometry.in_w, geometry.in_h), (200, 100, 640, 320));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(d.letterbox_ms, None, "letterboxed on the device");
        let d = prepare(job(JobData::Bytes(png)), &device);
        assert!(d.result.as_ref().is_ok_and(|p| p.letterboxed().is_some_and(|lb| (lb.geometry.in_w, lb.geometry.in_h) == (640, 320))));
        assert!(d.letterbox_ms.is_some());
        let host = Prep { jpeg_on_device: false, ..device };
        let d = prepare(job(JobData::Bytes(jpeg)), &host);
        assert!(d.result.as_ref().is_ok_and(|p| p.letterboxed().is_some()));
        for prep in [device, host] {
            let d = prepare(job(JobData::Bytes(b"\xff\xd8\xff\xe0 not a picture".to_vec())), &prep);
            assert!(d.result.is_err(), "{:?}", d.result.map(|p| *p.geometry()));
        }
    }

    #[test]
    fn each_shape_is_noted_once_and_the_smallest_recent_batch_sets_the_ceiling() {
        let t0 = Instant::now();
        let mut s = Shapes::new(Some(test_plan(30, 256)), 640, 30);
        assert_eq!(s.ceiling(t0), None, "no picture yet");
        assert_eq!(s.note([(640, 384), (640, 384)], t0), [(640, 384)]);
        // at the startup batch until set
        assert_eq!(s.ceiling(t0), Some((30, (640, 384))));
        s.set((640, 384), 50);
        assert_eq!(s.ceiling(t0), Some((50, (640, 384))));
        // seen again: not new
        assert!(s.note([(640, 384)], t0 + Duration::from_secs(1)).is_empty());
        // a 4:3 shape beside it: the smaller batch holds the ceiling
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(s.note([(640, 480)], t1), [(640, 480)]);
        s.set((640, 480), 40);
        assert_eq!(s.ceiling(t1), Some((40, (640, 480))));
        // the 4:3 source gone for longer than the window, the 16:9 one still running
        let t2 = t1 + SHAPE_WINDOW + Duration::from_secs(1);
        s.note([(640, 384)], t2);
        assert_eq!(s.ceiling(t2), Some((50, (640, 384))));
    }

    #[test]
    fn the_shape_list_is_bounded_and_ties_go_to_the_largest_input() {
        let t0 = Instant::now();
        let mut s = Shapes::new(None, 640, 8);
        assert_eq!(s.note([(640, 384)], t0), [(640, 384)]);
        assert_eq!(s.ceiling(t0), Some((8, (640, 384))));
        for k in 0..100u32 {
            s.note([(32 + k, 640)], t0 + Duration::from_millis(k as u64));
        }
        s.note([(640, 640)], t0 + Duration::from_millis(100));
        assert_eq!(s.seen.len(), MAX_SHAPES);
        // 101 shapes noted, 64 kept: the square and the 63 widest of the others (69..=131)
        let narrowest_kept = 32 + 100 - (MAX_SHAPES as u32 - 1);
        assert!(s.seen.iter().all(|e| e.0 .0 >= narrowest_kept), "the oldest went first");
        // every shape at the startup batch: the largest input names the ceiling
        assert_eq!(s.ceiling(t0 + Duration::from_secs(1)), Some((8, (640, 640))));
    }
}
