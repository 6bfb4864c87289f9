//! Warm-up forward passes after loading, timed and reported as the cold and warm start (the
//! first pass on CUDA JIT-compiles candle's PTX kernels or loads them from the driver's compute
//! cache, which [`crate::env::configure_compute_cache`] makes persistent).

use std::time::Instant;

use candle_core::{Device, Tensor};
use serde::Serialize;

use crate::detector::Detector;

/// Timings of the first forward passes after loading.
#[derive(Debug, Clone, Serialize)]
pub struct StartupTimes {
    pub load_ms: f64,
    /// First forward (batch 1): kernel JIT or cache load, cuBLAS handles, allocator growth.
    pub first_forward_ms: f64,
    /// Second forward (batch 1): the warm steady state.
    pub second_forward_ms: f64,
    pub compute_cache: Option<String>,
}

/// Runs two batch-1 forward passes and times them (synchronised).
pub fn warm_up(det: &Detector, load_ms: f64) -> candle_core::Result<StartupTimes> {
    let s = det.imgsz();
    let dev: &Device = det.device();
    let x = Tensor::rand(0f32, 1f32, (1, 3, s, s), dev)?.to_dtype(det.dtype())?;
    let mut t = [0.0; 2];
    for slot in &mut t {
        dev.synchronize()?;
        let t0 = Instant::now();
        let y = det.model().forward(&x)?;
        dev.synchronize()?;
        *slot = t0.elapsed().as_secs_f64() * 1e3;
        drop(y);
    }
    Ok(StartupTimes {
        load_ms,
        first_forward_ms: t[0],
        second_forward_ms: t[1],
        compute_cache: if dev.is_cuda() { crate::env::configure_compute_cache().map(|p| p.display().to_string()) } else { None },
    })
}
