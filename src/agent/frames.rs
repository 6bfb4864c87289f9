//! The waiting frames of the camera and video streams: one small queue per stream (by default a
//! single slot), which a newer frame replaces the oldest of (counted `dropped`), so that
//! inference always takes the freshest frames; or, for a video file read as fast as possible, a
//! queue that makes the source wait for room (nothing dropped). The batcher takes at most one
//! frame per stream per batch, round-robin over the streams, so no stream starves.
//!
//! No GStreamer here: the sources (`sources::camera`, feature `gstreamer`) push decoded frames,
//! the pipeline takes them.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use crate::agent::pipeline::{Job, Pending};
use crate::agent::telemetry::StreamStats;

/// A decoded frame: tightly packed RGB rows.
#[derive(Debug)]
pub struct FramePixels {
    pub width: u32,
    pub height: u32,
    pub data: Vec<u8>,
}

/// Where a frame sits in its stream, and when it arrived.
#[derive(Debug, Clone, Copy)]
pub struct FrameMeta {
    /// 0, 1, 2... for every frame the decoder delivered since the source started.
    pub index: u64,
    /// Presentation timestamp (ns), when the stream has one.
    pub pts_ns: Option<u64>,
    /// When the decoded frame reached the agent (wall clock, for messages).
    pub capture: SystemTime,
    /// The same moment on the monotonic clock (for latency).
    pub captured_at: Instant,
}

struct Slot {
    id: Arc<str>,
    generation: u64,
    depth: usize,
    blocking: bool,
    frames: VecDeque<Job>,
    stats: Arc<StreamStats>,
}

struct Inner {
    slots: Vec<Slot>,
    /// The slot the next round starts at.
    cursor: usize,
    next_generation: u64,
    closed: bool,
}

/// Every stream's waiting frames.
pub struct FrameHub {
    inner: Mutex<Inner>,
    /// Signalled when frames are taken or slots go (blocking sources wait on it).
    room: Condvar,
    /// Tells the batcher that a frame waits (None once closed).
    wake: Mutex<Option<SyncSender<Pending>>>,
}

impl FrameHub {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(Inner { slots: Vec::new(), cursor: 0, next_generation: 1, closed: false }),
            room: Condvar::new(),
            wake: Mutex::new(None),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Connects the batcher's queue (done by the pipeline when it starts).
    pub(crate) fn set_wake(&self, tx: SyncSender<Pending>) {
        if let Ok(mut w) = self.wake.lock() {
            *w = Some(tx);
        }
    }

    /// Adds a stream's queue (replacing one of the same id, whose frames are dropped) and
    /// returns its producer end. `blocking`: a full queue makes the producer wait instead of
    /// dropping the oldest frame.
    pub fn add(self: &Arc<Self>, id: &str, depth: usize, blocking: bool, stats: Arc<StreamStats>) -> StreamTx {
        let mut g = self.lock();
        g.slots.retain(|s| &*s.id != id);
        let generation = g.next_generation;
        g.next_generation += 1;
        let id: Arc<str> = Arc::from(id);
        g.slots.push(Slot { id: id.clone(), generation, depth: depth.max(1), blocking, frames: VecDeque::new(), stats });
        drop(g);
        self.room.notify_all();
        StreamTx { hub: self.clone(), id, generation }
    }

    /// Removes a stream's queue (its waiting frames go; its producer's pushes fail from now).
    pub fn remove(&self, id: &str) {
        self.lock().slots.retain(|s| &*s.id != id);
        self.room.notify_all();
    }

    /// Stops taking frames: every producer's push fails from now, the batcher is let go.
    pub fn close(&self) {
        let mut g = self.lock();
        g.closed = true;
        g.slots.clear();
        drop(g);
        self.room.notify_all();
        if let Ok(mut w) = self.wake.lock() {
            *w = None;
        }
    }

    /// Streams with a queue now.
    pub fn streams(&self) -> usize {
        self.lock().slots.len()
    }

    /// Takes up to `max` frames, at most one per stream and none of the streams in `skip`,
    /// oldest waiting frame of each stream, round-robin from where the previous call stopped.
    pub fn take(&self, max: usize, skip: &[Arc<str>]) -> Vec<Job> {
        let mut out = Vec::new();
        let mut g = self.lock();
        let n = g.slots.len();
        if n == 0 || max == 0 {
            return out;
        }
        let start = g.cursor % n;
        let mut next = start;
        for k in 0..n {
            let i = (start + k) % n;
            let s = &mut g.slots[i];
            if skip.contains(&s.id) {
                continue;
            }
            if let Some(job) = s.frames.pop_front() {
                out.push(job);
                next = i + 1;
                if out.len() == max {
                    break;
                }
            }
        }
        g.cursor = next;
        drop(g);
        if !out.is_empty() {
            self.room.notify_all();
        }
        out
    }
}

/// A stream's producer end.
#[derive(Clone)]
pub struct StreamTx {
    hub: Arc<FrameHub>,
    id: Arc<str>,
    generation: u64,
}

/// What became of a pushed frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Pushed {
    /// Queued (an older frame may have been dropped for it).
    Queued,
    /// The stream was removed or the hub closed: the source should stop.
    Gone,
}

impl StreamTx {
    /// Queues a frame. A full queue drops its oldest frame (counted), or for a blocking stream
    /// waits for room, checking `stop` every 50 ms.
    pub fn push(&self, job: Job, stop: &dyn Fn() -> bool) -> Pushed {
        let mut g = self.hub.lock();
        let was_empty;
        loop {
            if g.closed {
                return Pushed::Gone;
            }
            let Some(s) = g.slots.iter_mut().find(|s| s.generation == self.generation) else { return Pushed::Gone };
            if s.frames.len() >= s.depth {
                if s.blocking {
                    if stop() {
                        return Pushed::Gone;
                    }
                    g = self.hub.room.wait_timeout(g, Duration::from_millis(50)).map(|(g, _)| g).unwrap_or_else(|e| e.into_inner().0);
                    continue;
                }
                s.frames.pop_front();
                s.stats.dropped.fetch_add(1, Relaxed);
            }
            was_empty = s.frames.is_empty();
            s.frames.push_back(job);
            break;
        }
        drop(g);
        if was_empty {
            if let Ok(w) = self.hub.wake.lock() {
                if let Some(tx) = w.as_ref() {
                    let _ = tx.try_send(Pending::Wake);
                }
            }
        }
        Pushed::Queued
    }

    /// Waits until this stream's waiting frames are taken (a video at its end), checking `stop`
    /// every 50 ms.
    pub fn drain(&self, stop: &dyn Fn() -> bool) {
        let mut g = self.hub.lock();
        while !g.closed && !stop() && g.slots.iter().any(|s| s.generation == self.generation && !s.frames.is_empty()) {
            g = self.hub.room.wait_timeout(g, Duration::from_millis(50)).map(|(g, _)| g).unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Removes this stream's queue (a video that ended): the batcher stops counting it.
    pub fn close(&self) {
        self.hub.lock().slots.retain(|s| s.generation != self.generation);
        self.hub.room.notify_all();
    }

    /// The stream's id.
    pub fn id(&self) -> &Arc<str> {
        &self.id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::pipeline::{Completion, ImageRef, JobData};

    fn job(id: &str, index: u64) -> Job {
        let now = Instant::now();
        Job {
            source: Arc::from(id),
            image: ImageRef::Frame(FrameMeta { index, pts_ns: None, capture: SystemTime::now(), captured_at: now }),
            data: JobData::Frame(FramePixels { width: 2, height: 2, data: vec![0; 12] }),
            completion: Completion::None,
        }
    }

    fn index(j: &Job) -> (String, u64) {
        match &j.image {
            ImageRef::Frame(m) => (j.source.to_string(), m.index),
            _ => unreachable!(),
        }
    }

    #[test]
    fn the_freshest_frame_waits_and_the_replaced_are_counted() {
        let hub = FrameHub::new();
        let st = Arc::new(StreamStats::new("rtsp", "auto"));
        let tx = hub.add("a", 1, false, st.clone());
        for i in 0..5 {
            assert_eq!(tx.push(job("a", i), &|| false), Pushed::Queued);
        }
        assert_eq!(st.dropped.load(Relaxed), 4);
        let got = hub.take(4, &[]);
        assert_eq!(got.iter().map(index).collect::<Vec<_>>(), vec![("a".to_string(), 4)]);
        hub.remove("a");
        assert_eq!(tx.push(job("a", 5), &|| false), Pushed::Gone);
    }

    #[test]
    fn one_frame_per_stream_per_round_and_round_robin() {
        let hub = FrameHub::new();
        let txs: Vec<StreamTx> = ["a", "b", "c"].iter().map(|id| hub.add(id, 3, false, Arc::new(StreamStats::default()))).collect();
        for (k, tx) in txs.iter().enumerate() {
            for i in 0..3 {
                tx.push(job(["a", "b", "c"][k], i), &|| false);
            }
        }
        // batches of two: a b, then c a, then b c ...
        let names = |v: Vec<Job>| v.iter().map(|j| index(j).0).collect::<Vec<_>>().join("");
        assert_eq!(names(hub.take(2, &[])), "ab");
        assert_eq!(names(hub.take(2, &[])), "ca");
        assert_eq!(names(hub.take(2, &[])), "bc");
        // a stream already in the batch is skipped
        let skip: Vec<Arc<str>> = vec![Arc::from("a")];
        assert_eq!(names(hub.take(3, &skip)), "bc");
        assert_eq!(names(hub.take(3, &[])), "a");
        assert!(hub.take(3, &[]).is_empty());
    }

    #[test]
    fn a_blocking_stream_waits_for_room_and_drops_nothing() {
        let hub = FrameHub::new();
        let st = Arc::new(StreamStats::default());
        let tx = hub.add("v", 1, true, st.clone());
        let h = std::thread::spawn(move || {
            for i in 0..20 {
                assert_eq!(tx.push(job("v", i), &|| false), Pushed::Queued);
            }
        });
        let mut seen = Vec::new();
        while seen.len() < 20 {
            seen.extend(hub.take(1, &[]).iter().map(|j| index(j).1));
            std::thread::sleep(Duration::from_millis(1));
        }
        h.join().unwrap();
        assert_eq!(seen, (0..20).collect::<Vec<_>>());
        assert_eq!(st.dropped.load(Relaxed), 0);
        // closing lets a waiting producer go
        let tx = hub.add("w", 1, true, st);
        tx.push(job("w", 0), &|| false);
        let h = std::thread::spawn(move || tx.push(job("w", 1), &|| false));
        std::thread::sleep(Duration::from_millis(100));
        hub.close();
        assert_eq!(h.join().unwrap(), Pushed::Gone);
    }
}
