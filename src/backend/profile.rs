//! Opt-in per-operation timing of a forward pass (`yolo-edge bench --profile`): each
//! instrumented operation synchronises the device before and after itself and adds its time to
//! a per-thread table, so that the table says where a batch's time goes. Off (one thread-local
//! read per operation) unless enabled on the calling thread.
//!
//! [`DeviceTimer`]: the device's own time of a span of work (CUDA events), beside the host's.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Instant;

use candle_core::Device;

struct Table {
    device: Device,
    ops: BTreeMap<String, (u64, f64)>,
}

thread_local! {
    static TABLE: RefCell<Option<Table>> = const { RefCell::new(None) };
}

/// Starts collecting on this thread (clears what was collected).
pub fn enable(device: &Device) {
    TABLE.with(|t| *t.borrow_mut() = Some(Table { device: device.clone(), ops: BTreeMap::new() }));
}

/// Stops collecting and returns (operation, calls, total ms), slowest first.
pub fn take() -> Vec<(String, u64, f64)> {
    let ops = TABLE.with(|t| t.borrow_mut().take()).map(|t| t.ops).unwrap_or_default();
    let mut v: Vec<_> = ops.into_iter().map(|(k, (n, ms))| (k, n, ms)).collect();
    v.sort_by(|a, b| b.2.total_cmp(&a.2));
    v
}

/// Runs `f`, timing it as `name()` when collecting on this thread.
pub fn scope<T>(name: impl FnOnce() -> String, f: impl FnOnce() -> candle_core::Result<T>) -> candle_core::Result<T> {
    let dev = TABLE.with(|t| t.borrow().as_ref().map(|t| t.device.clone()));
    let Some(dev) = dev else { return f() };
    dev.synchronize()?;
    let t0 = Instant::now();
    let r = f()?;
    dev.synchronize()?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    TABLE.with(|t| {
        if let Some(t) = t.borrow_mut().as_mut() {
            let e = t.ops.entry(name()).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += ms;
        }
    });
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
            a.record(s).map_err(event_err)?;
        }
        Ok(())
    }

    /// Marks the end of the span and waits for it: the span's device time (ms); `None` on the
    /// CPU.
    pub fn stop(&self) -> candle_core::Result<Option<f64>> {
        #[cfg(feature = "cuda")]
        if let Some((s, a, b)) = &self.events {
            b.record(s).map_err(event_err)?;
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
        assert!(take().is_empty());
        enable(&Device::Cpu);
        for _ in 0..3 {
            scope(|| "exp".into(), || x.exp()).unwrap();
        }
        scope(|| "sqr".into(), || x.sqr()).unwrap();
        let t = take();
        let names: Vec<(&str, u64)> = t.iter().map(|(n, c, _)| (n.as_str(), *c)).collect();
        assert!(names.contains(&("exp", 3)) && names.contains(&("sqr", 1)), "{names:?}");
        assert!(take().is_empty(), "take() stops collecting");
    }

    #[test]
    fn device_timer_times_nothing_on_the_cpu() {
        let t = DeviceTimer::new(&Device::Cpu).unwrap();
        t.start().unwrap();
        assert_eq!(t.stop().unwrap(), None);
    }
}
