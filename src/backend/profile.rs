//! Opt-in per-operation timing of a forward pass (`yolo-edge bench --profile`): each
//! instrumented operation synchronises the device before and after itself and adds its time to
//! a per-thread table, so that the table says where a batch's time goes. Off (one thread-local
//! read per operation) unless enabled on the calling thread.

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
}
