//! Camera and video stream sources (feature `gstreamer`): one thread per stream runs its
//! GStreamer pipeline ([`crate::media`]) and hands every decoded frame to the stream's slot in
//! the [`FrameHub`] (the freshest frames wait; replaced ones are counted). A lost stream (a
//! pipeline error, the end of a live stream, or no frame *arriving* for `stall_timeout`) is torn
//! down and reconnected with exponential backoff, one `source_error` per loss and a
//! `source_recovered` at the first frame after it. The agent's own backpressure cannot look
//! like a stall: live frames keep arriving (the slot drops them), and a video file read
//! `fast`, which waits for room instead, is not timed while it waits.
//!
//! [`manage`] starts the configured streams and follows config edits: streams added, removed
//! or changed are started, stopped or restarted; the others are not touched.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use gstreamer as gst;
use gstreamer::prelude::*;
use tokio::sync::watch;

use crate::agent::config::{Config, DecoderChoice, Pacing, RtspProtocol, StreamConfig, StreamKind};
use crate::agent::events::EventSink;
use crate::agent::frames::{FrameHub, FrameMeta, FramePixels, Pushed, StreamTx};
use crate::agent::messages::EventBody;
use crate::agent::pipeline::{Completion, ImageRef, Job, JobData};
use crate::agent::telemetry::{Stats, StreamState, StreamStats};
use crate::backend::hostmem;
use crate::media::{self, DecoderPref, FrameFlow};

/// How often a running stream's bus, stall timer and stop flag are looked at.
const POLL: Duration = Duration::from_millis(100);

/// A running stream: its thread and stop flag.
pub struct StreamHandle {
    pub config: StreamConfig,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StreamHandle {
    /// Stops the stream and waits for its thread (at most a poll interval and a teardown).
    pub fn stop(mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn pref_of(d: DecoderChoice) -> DecoderPref {
    match d {
        DecoderChoice::Auto => DecoderPref::Auto,
        DecoderChoice::Cpu => DecoderPref::Cpu,
        DecoderChoice::Nvdec => DecoderPref::Nvdec,
        DecoderChoice::Nvv4l2 => DecoderPref::Nvv4l2,
    }
}

fn input_of(k: &StreamKind) -> media::Input {
    match k {
        StreamKind::Rtsp { url, protocol, latency_ms, username, password } => media::Input::Rtsp {
            url: url.clone(),
            tcp: *protocol == RtspProtocol::Tcp,
            latency_ms: *latency_ms,
            username: username.clone(),
            password: password.clone(),
        },
        StreamKind::Video { path, .. } => media::Input::File { path: path.clone() },
        StreamKind::V4l2 { device, width, height, fps } => {
            media::Input::V4l2 { device: device.clone(), width: *width, height: *height, fps: *fps }
        }
        StreamKind::Uri { uri } => media::Input::Uri { uri: uri.clone() },
    }
}

/// Starts a stream: registers its slot and counters, and its thread.
pub fn start(cfg: StreamConfig, hub: &Arc<FrameHub>, events: EventSink, stats: &Arc<Stats>) -> std::io::Result<StreamHandle> {
    let st = Arc::new(StreamStats::new(cfg.kind.name(), cfg.decoder.name()));
    stats.add_stream(&cfg.id, st.clone());
    let blocking = matches!(cfg.kind, StreamKind::Video { pacing: Pacing::Fast, .. });
    let tx = hub.add(&cfg.id, cfg.queue_depth, blocking, st.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let s = Stream { cfg: cfg.clone(), tx, st, events, stop: stop.clone(), index: Arc::new(AtomicU64::new(0)) };
    let thread = std::thread::Builder::new().name(format!("stream-{}", cfg.id)).spawn(move || s.run())?;
    Ok(StreamHandle { config: cfg, stop, thread: Some(thread) })
}

struct Stream {
    cfg: StreamConfig,
    tx: StreamTx,
    st: Arc<StreamStats>,
    events: EventSink,
    stop: Arc<AtomicBool>,
    /// Frames delivered since the source started (the next frame's index).
    index: Arc<AtomicU64>,
}

/// How one connection ended.
enum Ended {
    /// Asked to stop (or the stream's slot is gone).
    Stopped,
    /// A file's (or non-live URI's) end.
    Finished,
    /// Lost: reconnect.
    Lost(String),
}

/// What the streaming thread shares with the stream's thread during one connection.
#[derive(Default)]
struct Session {
    /// Frames that arrived in this connection.
    frames: AtomicU64,
    /// When the last frame arrived (None: none yet).
    last: Mutex<Option<Instant>>,
    /// The source waits for room in its (blocking) slot.
    waiting: AtomicBool,
    /// The slot is gone: stop.
    gone: AtomicBool,
}

impl Stream {
    fn location(&self) -> String {
        self.cfg.kind.location()
    }

    fn run(self) {
        let mut backoff = self.cfg.reconnect_min;
        let mut lost: Option<String> = None;
        loop {
            if self.stop.load(Relaxed) {
                break;
            }
            self.st.set_state(if lost.is_some() { StreamState::Reconnecting } else { StreamState::Connecting });
            let session = Arc::new(Session::default());
            let ended = self.connect(&session, &mut lost);
            let had_frames = session.frames.load(Relaxed) > 0;
            match ended {
                Ended::Stopped => {
                    tracing::info!(source = %self.cfg.id, stop = self.stop.load(Relaxed), slot_gone = session.gone.load(Relaxed), "stream stopped");
                    break;
                }
                Ended::Finished => {
                    // the last frames still go to inference
                    self.tx.drain(&|| self.stop.load(Relaxed));
                    self.st.set_state(StreamState::Ended);
                    self.tx.close();
                    self.events.emit(EventBody::SourceEnded {
                        source: self.cfg.id.clone(),
                        path: self.location(),
                        frames: self.index.load(Relaxed),
                    });
                    break;
                }
                Ended::Lost(error) => {
                    self.st.reconnects.fetch_add(1, Relaxed);
                    self.st.set_state(StreamState::Reconnecting);
                    if had_frames {
                        backoff = self.cfg.reconnect_min;
                    }
                    tracing::warn!(source = %self.cfg.id, error = %error, retry_in_ms = backoff.as_millis() as u64, "stream lost");
                    if lost.is_none() {
                        self.events.emit(EventBody::SourceError {
                            source: self.cfg.id.clone(),
                            path: self.location(),
                            error: error.clone(),
                        });
                    }
                    lost = Some(error);
                    let until = Instant::now() + backoff;
                    while Instant::now() < until && !self.stop.load(Relaxed) {
                        std::thread::sleep(POLL.min(until.saturating_duration_since(Instant::now())));
                    }
                    backoff = (backoff * 2).min(self.cfg.reconnect_max);
                }
            }
        }
    }

    /// One connection: build, play, watch until it ends.
    fn connect(&self, session: &Arc<Session>, lost: &mut Option<String>) -> Ended {
        let pipeline = match self.build(session) {
            Ok(p) => p,
            Err(e) => return Ended::Lost(e.to_string()),
        };
        let ended = self.watch(&pipeline, session, lost);
        // a source waiting for room sees the stop and lets the streaming thread go
        session.gone.store(true, Relaxed);
        teardown(pipeline, &self.cfg.id, &self.st);
        // the old pipeline's frames and buffers were freed on its streaming threads, into
        // allocator arenas that keep them resident unless told otherwise
        hostmem::release_free_heap();
        ended
    }

    fn build(&self, session: &Arc<Session>) -> Result<gst::Pipeline, media::MediaError> {
        let realtime = matches!(self.cfg.kind, StreamKind::Video { pacing: Pacing::Realtime, .. });
        let on_frame = {
            let tx_session = session.clone();
            let stop = self.stop.clone();
            let st = self.st.clone();
            let index = self.index.clone();
            let source = self.tx.id().clone();
            let max_fps = self.cfg.max_fps;
            let last_kept: Mutex<Option<u64>> = Mutex::new(None);
            let tx = self.tx.clone();
            let origin = Instant::now();
            move |f: media::Frame| {
                let now = Instant::now();
                let s = &tx_session;
                s.frames.fetch_add(1, Relaxed);
                if let Ok(mut l) = s.last.lock() {
                    *l = Some(now);
                }
                st.frames_in.fetch_add(1, Relaxed);
                let n = index.fetch_add(1, Relaxed);
                if s.gone.load(Relaxed) || stop.load(Relaxed) {
                    return FrameFlow::Stop;
                }
                if let Some(fps) = max_fps {
                    // by presentation time where the stream has it, else by arrival
                    let t = f.pts_ns.unwrap_or_else(|| now.duration_since(origin).as_nanos() as u64);
                    let mut last = last_kept.lock().unwrap_or_else(|e| e.into_inner());
                    let min_gap = (1e9 / fps * 0.999) as u64;
                    if let Some(prev) = *last {
                        if t >= prev && t - prev < min_gap {
                            st.skipped.fetch_add(1, Relaxed);
                            return FrameFlow::Continue;
                        }
                    }
                    *last = Some(t);
                }
                let job = Job {
                    source: source.clone(),
                    image: ImageRef::Frame(FrameMeta { index: n, pts_ns: f.pts_ns, capture: SystemTime::now(), captured_at: now }),
                    data: JobData::Frame(FramePixels { width: f.width, height: f.height, data: f.data }),
                    completion: Completion::None,
                };
                s.waiting.store(true, Relaxed);
                let stop_now = || stop.load(Relaxed) || s.gone.load(Relaxed);
                let pushed = tx.push(job, &stop_now);
                s.waiting.store(false, Relaxed);
                // a frame that waited for room arrived now, as far as stalls go
                if let Ok(mut l) = s.last.lock() {
                    *l = Some(Instant::now());
                }
                match pushed {
                    Pushed::Queued => FrameFlow::Continue,
                    Pushed::Gone => {
                        s.gone.store(true, Relaxed);
                        FrameFlow::Stop
                    }
                }
            }
        };
        let on_decoder = {
            let st = self.st.clone();
            let events = self.events.clone();
            let id = self.cfg.id.clone();
            let requested = self.cfg.decoder;
            move |codec: media::Codec, pick: &media::DecoderPick| {
                if let Ok(mut d) = st.decoder.lock() {
                    if d.as_deref() == Some(pick.element.as_str()) {
                        return;
                    }
                    *d = Some(pick.element.clone());
                }
                tracing::info!(source = %id, codec = codec.name(), decoder = %pick.element, requested = requested.name(), "stream decoder");
                if pick.fell_back() {
                    events.emit(EventBody::DecoderFallback {
                        source: id.clone(),
                        codec: codec.name().to_string(),
                        requested: requested.name().to_string(),
                        missing: pick.missing.clone(),
                        using: pick.element.clone(),
                    });
                }
            }
        };
        let cb = media::Callbacks { on_frame: Box::new(on_frame), on_decoder: Box::new(on_decoder) };
        let lossless = matches!(self.cfg.kind, StreamKind::Video { pacing: Pacing::Fast, .. });
        media::build(&input_of(&self.cfg.kind), pref_of(self.cfg.decoder), media::SinkMode { sync: realtime, lossless }, cb)
    }

    fn watch(&self, pipeline: &gst::Pipeline, session: &Session, lost: &mut Option<String>) -> Ended {
        if let Err(e) = pipeline.set_state(gst::State::Playing) {
            let detail = pipeline.bus().and_then(|b| b.pop_filtered(&[gst::MessageType::Error])).and_then(|m| match m.view() {
                gst::MessageView::Error(e) => Some(media::error_text(e)),
                _ => None,
            });
            return Ended::Lost(detail.unwrap_or_else(|| format!("cannot start: {e}")));
        }
        let Some(bus) = pipeline.bus() else { return Ended::Lost("pipeline without a bus".into()) };
        let started = Instant::now();
        loop {
            if self.stop.load(Relaxed) || session.gone.load(Relaxed) {
                return Ended::Stopped;
            }
            // every message of this poll interval is looked at (a source posting many other
            // messages must not keep the stall check from running)
            let until = Instant::now() + POLL;
            loop {
                let left = until.saturating_duration_since(Instant::now());
                let Some(msg) = bus.timed_pop(gst::ClockTime::from_nseconds(left.as_nanos() as u64)) else { break };
                match msg.view() {
                    gst::MessageView::Error(e) => {
                        if self.stop.load(Relaxed) || session.gone.load(Relaxed) {
                            return Ended::Stopped;
                        }
                        return Ended::Lost(media::error_text(e));
                    }
                    gst::MessageView::Eos(_) if self.cfg.kind.is_live() => return Ended::Lost("end of stream".into()),
                    gst::MessageView::Eos(_) => return Ended::Finished,
                    _ => {}
                }
                if left.is_zero() {
                    break;
                }
            }
            if session.frames.load(Relaxed) > 0 {
                self.st.set_state(StreamState::Running);
                if let Some(e) = lost.take() {
                    tracing::info!(source = %self.cfg.id, after = %e, "stream recovered");
                    self.events.emit(EventBody::SourceRecovered { source: self.cfg.id.clone(), path: self.location() });
                }
            }
            // stalls are measured on frames arriving; a source waiting for room is not stalled
            let last = session.last.lock().ok().and_then(|l| *l).unwrap_or(started);
            if !session.waiting.load(Relaxed) && last.elapsed() >= self.cfg.stall_timeout {
                return Ended::Lost(format!("no frame for {} ms (stall_timeout_ms)", self.cfg.stall_timeout.as_millis()));
            }
        }
    }
}

/// How long a stream waits for its old pipeline to stop before it goes on without it.
const TEARDOWN_WAIT: Duration = Duration::from_secs(3);

/// Stops a pipeline on a thread of its own, waiting at most [`TEARDOWN_WAIT`].
///
/// The pipeline is flushed first: stopped straight away, `rtspsrc` can hang in its state change
/// (GStreamer 1.22: its own task, stopping its RTP bin, waits for a jitter buffer's streaming
/// thread that nothing wakes, while the stop waits for that task; after a few percent of the ends
/// of stream a server sends, and when a server vanishes). A flush wakes that thread first. A
/// pipeline that still does not stop in time is left to its thread (its frames are refused: the
/// session is marked gone), counted in the stream's `stuck_teardowns` until its stop returns, and
/// the stream reconnects with a fresh one instead of hanging with it.
fn teardown(pipeline: gst::Pipeline, id: &str, st: &Arc<StreamStats>) {
    let stop = move || {
        let _ = pipeline.send_event(gst::event::FlushStart::new());
        let _ = pipeline.set_state(gst::State::Null);
    };
    match stop_within(format!("teardown-{id}"), TEARDOWN_WAIT, &st.stuck_teardowns, stop) {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            source = %id,
            stuck = st.stuck_teardowns.load(SeqCst),
            "the old pipeline did not stop within {} s; reconnecting without it",
            TEARDOWN_WAIT.as_secs()
        ),
        Err(e) => tracing::warn!(source = %id, "cannot start a teardown thread: {e}"),
    }
}

/// Runs `stop` on a thread of its own named `name` and waits at most `wait` for it: true when it
/// returned in time. When it did not, `stuck` counts it until it returns.
fn stop_within(name: String, wait: Duration, stuck: &Arc<AtomicU64>, stop: impl FnOnce() + Send + 'static) -> std::io::Result<bool> {
    const RUNNING: u8 = 0;
    const DONE: u8 = 1;
    const ABANDONED: u8 = 2;
    let state = Arc::new(AtomicU8::new(RUNNING));
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    {
        let (state, stuck) = (state.clone(), stuck.clone());
        std::thread::Builder::new().name(name).spawn(move || {
            stop();
            if state.swap(DONE, SeqCst) == ABANDONED {
                stuck.fetch_sub(1, SeqCst);
            }
            let _ = tx.send(());
        })?;
    }
    if rx.recv_timeout(wait).is_ok() {
        return Ok(true);
    }
    // counted before it is marked, so that the thread's decrement always comes after
    stuck.fetch_add(1, SeqCst);
    if state.compare_exchange(RUNNING, ABANDONED, SeqCst, SeqCst).is_ok() {
        Ok(false)
    } else {
        stuck.fetch_sub(1, SeqCst); // it returned just now
        Ok(true)
    }
}

/// Runs the configured streams until `stop`: starts them, then follows config edits (streams
/// added, removed or changed; the others untouched). At the end every stream is stopped.
pub async fn manage(
    mut cfg: watch::Receiver<Arc<Config>>,
    hub: Arc<FrameHub>,
    events: EventSink,
    stats: Arc<Stats>,
    mut stop: watch::Receiver<bool>,
) {
    if let Err(e) = media::init() {
        tracing::error!("{e}; camera and video sources do not run");
        for s in cfg.borrow().streams() {
            events.emit(EventBody::SourceError { source: s.id.clone(), path: s.kind.location(), error: e.to_string() });
        }
        let _ = stop.changed().await;
        return;
    }
    let mut running: BTreeMap<String, StreamHandle> = BTreeMap::new();
    loop {
        let want: Vec<StreamConfig> = cfg.borrow_and_update().streams().cloned().collect();
        // removed or changed: stopped (off the runtime: joining waits for the pipeline)
        let gone: Vec<String> =
            running.iter().filter(|(id, h)| !want.iter().any(|w| &w.id == *id && *w == h.config)).map(|(id, _)| id.clone()).collect();
        for id in gone {
            if let Some(h) = running.remove(&id) {
                tracing::info!(source = %id, "stream stopped (config)");
                hub.remove(&id);
                let _ = tokio::task::spawn_blocking(move || h.stop()).await;
                if !want.iter().any(|w| w.id == id) {
                    stats.remove_stream(&id);
                }
            }
        }
        for w in want {
            if running.contains_key(&w.id) {
                continue;
            }
            tracing::info!(source = %w.id, kind = w.kind.name(), location = %w.kind.location(), decoder = w.decoder.name(), "stream starting");
            match start(w.clone(), &hub, events.clone(), &stats) {
                Ok(h) => {
                    running.insert(w.id.clone(), h);
                }
                Err(e) => events.emit(EventBody::SourceError { source: w.id.clone(), path: w.kind.location(), error: e.to_string() }),
            }
        }
        tokio::select! {
            r = cfg.changed() => if r.is_err() { break },
            _ = stop.changed() => break,
        }
    }
    for (id, h) in std::mem::take(&mut running) {
        hub.remove(&id);
        let _ = tokio::task::spawn_blocking(move || h.stop()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_that_hangs_is_counted_until_it_returns() {
        let stuck = Arc::new(AtomicU64::new(0));
        // in time: not counted
        assert!(stop_within("quick".into(), Duration::from_secs(5), &stuck, || ()).unwrap());
        assert_eq!(stuck.load(SeqCst), 0);
        // two that hang past the wait: counted while they hang
        let (go_a, wait_a) = std::sync::mpsc::channel::<()>();
        let (go_b, wait_b) = std::sync::mpsc::channel::<()>();
        let hang = |rx: std::sync::mpsc::Receiver<()>| {
            move || {
                let _ = rx.recv();
            }
        };
        assert!(!stop_within("a".into(), Duration::from_millis(50), &stuck, hang(wait_a)).unwrap());
        assert!(!stop_within("b".into(), Duration::from_millis(50), &stuck, hang(wait_b)).unwrap());
        assert_eq!(stuck.load(SeqCst), 2);
        // each one that returns at last is no longer counted
        let settle = |want: u64| {
            let t = Instant::now();
            while stuck.load(SeqCst) != want && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(5));
            }
            assert_eq!(stuck.load(SeqCst), want);
        };
        go_a.send(()).unwrap();
        settle(1);
        drop(go_b);
        settle(0);
    }
}
