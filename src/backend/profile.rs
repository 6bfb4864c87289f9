//! Opt-in per-operation timing of a forward pass (`yolo-edge bench --profile`): each
//! instrumented operation adds its time to a per-thread table, so that the table says where a
//! batch's time goes. On CUDA an operation is timed by two events recorded on the stream around
//! its kernels, without synchronising, so the pass keeps the device as busy as an unprofiled
//! one and the table holds device time; recorded while a CUDA graph is captured, the events
//! become nodes of the graph and time each replay. (In an eager pass a span also holds the
//! device's idle time while it waits for the host's launches.) On the CPU an operation is timed
//! by the wall clock. Off (one thread-local read per operation) unless enabled on the
//! calling thread.
//!
//! An event recorded while a graph is captured is a node of that graph: it must live as long as
//! the graph. So no span recorded during a capture is destroyed before [`Profile`] is dropped,
//! not even one of work that declined to run; drop the graphs captured while profiling first.
//!
//! [`DeviceTimer`]: the device's own time of a span of work (CUDA events), beside the host's.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Instant;

use candle_core::Device;

struct Table {
    device: Device,
    ops: BTreeMap<String, (u64, f64)>,
    /// CUDA: spans recorded and not read yet (read by [`take`], after one synchronisation).
    #[cfg(feature = "cuda")]
    spans: Vec<(String, DeviceTimer)>,
    /// CUDA: spans of work that declined to run, kept unread: their events may be nodes of a
    /// graph being captured.
    #[cfg(feature = "cuda")]
    declined: Vec<DeviceTimer>,
}

/// What [`take`] collected: (operation, calls, total ms), slowest first, and the events they
/// were timed by, which graphs captured while profiling still record: drop those graphs before
/// this.
pub struct Profile {
    ops: Vec<(String, u64, f64)>,
    _events: Vec<DeviceTimer>,
}

impl Profile {
    /// (operation, calls, total ms), slowest first, dropping the events: call it after the graphs captured while profiling
    /// are dropped.
    pub fn into_ops(self) -> Vec<(String, u64, f64)> {
        self.ops
    }
}

thread_local! {
    static TABLE: RefCell<Option<Table>> = const { RefCell::new(None) };
}

/// Starts collecting on this thread (clears what was collected).
pub fn enable(device: &Device) {
    TABLE.with(|t| {
        *t.borrow_mut() = Some(Table {
            device: device.clone(),
            ops: BTreeMap::new(),
            #[cfg(feature = "cuda")]
            spans: Vec::new(),
            #[cfg(feature = "cuda")]
            declined: Vec::new(),
        })
    });
}

/// Drops the spans recorded and not read yet on this thread (CUDA; nothing on the CPU), after
/// their work has run: none may be a node of a graph still captured or kept.
pub fn forget_spans() {
    #[cfg(feature = "cuda")]
    TABLE.with(|t| {
        if let Some(t) = t.borrow_mut().as_mut() {
            t.spans.clear();
            t.declined.clear();
        }
    });
}

fn add(ops: &mut BTreeMap<String, (u64, f64)>, name: String, ms: f64) {
    let e = ops.entry(name).or_insert((0, 0.0));
    e.0 += 1;
    e.1 += ms;
}

/// Stops collecting and returns what was collected.
pub fn take() -> Profile {
    let Some(table) = TABLE.with(|t| t.borrow_mut().take()) else { return Profile { ops: Vec::new(), _events: Vec::new() } };
    #[allow(unused_mut)]
    let mut ops = table.ops;
    #[allow(unused_mut)]
    let mut events = Vec::new();
    #[cfg(feature = "cuda")]
    {
        let _ = table.device.synchronize();
        let mut unread = 0;
        for (name, span) in table.spans {
            match span.read() {
                Ok(Some(ms)) => add(&mut ops, name, ms),
                _ => unread += 1,
            }
            events.push(span);
        }
        events.extend(table.declined);
        if unread > 0 {
            tracing::warn!(unread, "profile: spans whose events could not be read");
        }
    }
    let mut v: Vec<_> = ops.into_iter().map(|(k, (n, ms))| (k, n, ms)).collect();
    v.sort_by(|a, b| b.2.total_cmp(&a.2));
    Profile { ops: v, _events: events }
}

/// Runs `f`, timing it as `name()` when collecting on this thread.
pub fn scope<T>(name: impl FnOnce() -> String, f: impl FnOnce() -> candle_core::Result<T>) -> candle_core::Result<T> {
    scope_if(name, f, |_| true)
}

/// [`scope`] of work that may decline to run (`Ok(None)`): only work done is recorded.
pub fn scope_some<T>(name: impl FnOnce() -> String, f: impl FnOnce() -> candle_core::Result<Option<T>>) -> candle_core::Result<Option<T>> {
    scope_if(name, f, Option::is_some)
}

/// [`scope`], recording the span only where `keep` holds for the result.
fn scope_if<T>(
    name: impl FnOnce() -> String,
    f: impl FnOnce() -> candle_core::Result<T>,
    keep: impl FnOnce(&T) -> bool,
) -> candle_core::Result<T> {
    let dev = TABLE.with(|t| t.borrow().as_ref().map(|t| t.device.clone()));
    let Some(dev) = dev else { return f() };
    #[cfg(feature = "cuda")]
    if dev.is_cuda() {
        let span = DeviceTimer::new(&dev)?;
        span.start()?;
        let r = f();
        let stopped = span.mark_stop();
        let kept = stopped.is_ok() && r.as_ref().is_ok_and(keep);
        TABLE.with(|t| {
            if let Some(t) = t.borrow_mut().as_mut() {
                if kept {
                    t.spans.push((name(), span));
                } else {
                    t.declined.push(span);
                }
            }
        });
        let r = r?;
        stopped?;
        return Ok(r);
    }
    dev.synchronize()?;
    let t0 = Instant::now();
    let r = f()?;
    dev.synchronize()?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    if keep(&r) {
        TABLE.with(|t| {
            if let Some(t) = t.borrow_mut().as_mut() {
                add(&mut t.ops, name(), ms);
            }
        });
    }
    Ok(r)
}

/// Times spans of work on the device: CUDA events recorded on the calling thread's stream at
/// [`start`](Self::start) and [`stop`](Self::stop), so the time excludes the host's work
/// before the first kernel and after the last. On the CPU it times nothing.
pub struct DeviceTimer {
    #[cfg(feature = "cuda")]
    events: Option<(
        std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>,
        candle_core::cuda_backend::cudarc::driver::CudaEvent,
        candle_core::cuda_backend::cudarc::driver::CudaEvent,
    )>,
}

#[cfg(feature = "cuda")]
fn event_err(e: candle_core::cuda_backend::cudarc::driver::DriverError) -> candle_core::Error {
    candle_core::Error::Msg(format!("CUDA event: {e}"))
}

/// Records `event` on `stream`; while the stream is captured into a CUDA graph, as an event
/// record node of the graph (which a plain record during capture is not: there it only orders
/// the capture's streams), so that each replay records it.
#[cfg(feature = "cuda")]
fn record(
    event: &candle_core::cuda_backend::cudarc::driver::CudaEvent,
    stream: &candle_core::cuda_backend::cudarc::driver::CudaStream,
) -> candle_core::Result<()> {
    use candle_core::cuda_backend::cudarc::driver::sys;
    if stream.capture_status().map_err(event_err)? != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
        return event.record(stream).map_err(event_err);
    }
    // SAFETY: both handles are live (owned by `event` and `stream`, borrowed for the call), and
    // the stream is being captured, the only state in which this flag is valid.
    unsafe {
        sys::cuEventRecordWithFlags(event.cu_event(), stream.cu_stream(), sys::CUevent_record_flags_enum::CU_EVENT_RECORD_EXTERNAL as u32)
    }
    .result()
    .map_err(event_err)
}

impl DeviceTimer {
    pub fn new(device: &Device) -> candle_core::Result<Self> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(d) = device {
            use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
            let stream = d.cuda_stream();
            let ctx = stream.context().clone();
            let a = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(event_err)?;
            let b = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(event_err)?;
            return Ok(Self { events: Some((stream, a, b)) });
        }
        let _ = device;
        Ok(Self {
            #[cfg(feature = "cuda")]
            events: None,
        })
    }

    /// Marks the start of the span on the stream.
    pub fn start(&self) -> candle_core::Result<()> {
        #[cfg(feature = "cuda")]
        if let Some((s, a, _)) = &self.events {
            record(a, s)?;
        }
        Ok(())
    }

    /// Marks the end of the span and waits for it: the span's device time (ms); `None` on the
    /// CPU.
    pub fn stop(&self) -> candle_core::Result<Option<f64>> {
        self.mark_stop()?;
        self.read()
    }

    /// Marks the end of the span on the stream, without waiting.
    pub fn mark_stop(&self) -> candle_core::Result<()> {
        #[cfg(feature = "cuda")]
        if let Some((s, _, b)) = &self.events {
            record(b, s)?;
        }
        Ok(())
    }

    /// Waits for the span marked by [`start`](Self::start) and [`mark_stop`](Self::mark_stop):
    /// its device time (ms); `None` on the CPU.
    pub fn read(&self) -> candle_core::Result<Option<f64>> {
        #[cfg(feature = "cuda")]
        if let Some((_, a, b)) = &self.events {
            b.synchronize().map_err(event_err)?;
            return Ok(Some(a.elapsed_ms(b).map_err(event_err)? as f64));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Tensor;

    #[test]
    fn collects_only_when_enabled() {
        let x = Tensor::ones((4, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
        scope(|| "off".into(), || x.exp()).unwrap();
        assert!(take().into_ops().is_empty());
        enable(&Device::Cpu);
        for _ in 0..3 {
            scope(|| "exp".into(), || x.exp()).unwrap();
        }
        scope(|| "sqr".into(), || x.sqr()).unwrap();
        scope_some(|| "declined".into(), || Ok(None::<Tensor>)).unwrap();
        assert!(scope_some(|| "done".into(), || x.exp().map(Some)).unwrap().is_some());
        let t = take().into_ops();
        let names: Vec<(&str, u64)> = t.iter().map(|(n, c, _)| (n.as_str(), *c)).collect();
        assert!(names.contains(&("exp", 3)) && names.contains(&("sqr", 1)) && names.contains(&("done", 1)), "{names:?}");
        assert!(!names.iter().any(|(n, _)| *n == "declined"), "work declined is not recorded: {names:?}");
        assert!(take().into_ops().is_empty(), "take() stops collecting");
    }

    #[test]
    fn device_timer_times_nothing_on_the_cpu() {
        let t = DeviceTimer::new(&Device::Cpu).unwrap();
        t.start().unwrap();
        assert_eq!(t.stop().unwrap(), None);
    }
}
