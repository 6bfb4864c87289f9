//! The real prober: measured forward passes of the detector at a batch size (peak memory from the
//! allocator's high-water mark), stage timings, and soaks at the chosen batch.

use serde::Serialize;

use super::*;
use crate::backend::devmem::{self, PeakMeter};
use crate::detector::Detector;
use crate::vision::postprocess::Thresholds;
use crate::vision::preprocess::{LetterboxGeometry, Letterboxed};

/// High-water marks of one measurement, above the resident set (bytes).
#[derive(Debug, Clone, Copy)]
pub struct Peaks {
    /// Memory the pool reserved from the device (what runs out; the planner's figure).
    pub reserved: u64,
    /// Memory the pass's tensors held at once.
    pub used: u64,
}

/// The real prober: one batch through the agent's own path (u8 pictures uploaded, normalised
/// on the device, forward pass, candidate extraction), measured as the peak of memory the
/// device had to give (the *reserved* high-water mark of the pool and the activation arena above
/// what was reserved before: fragmentation counts, since that is what runs out), with the model
/// already resident.
/// Passes per measurement (after the warm-up), the pool untouched between them.
pub const MEASURED_PASSES: usize = 3;

/// Letterboxed pictures the agent's pipeline holds per slot of the batch while batches run: two
/// in the decoded queue (`agent::pipeline` sizes it at twice the startup batch), one gathered by
/// the batcher, one in the batch handed over and one in the batch running. On the CPU and an
/// integrated GPU they take the memory the budget covers, so a measurement there counts them.
pub const PICTURES_PER_BATCH_SLOT: u64 = 5;

pub struct DetectorProber<'a> {
    det: &'a Detector,
    meter: PeakMeter,
    picture: Letterboxed,
    /// The used high-water mark of the last successful probe.
    last_used: Option<u64>,
    /// Whether the device's memory is host memory (the CPU, an integrated GPU): the pipeline's
    /// pictures count then.
    host_memory: bool,
}

impl<'a> DetectorProber<'a> {
    /// Measures batches of `imgsz x imgsz` pictures (the largest input a letterbox makes).
    pub fn new(det: &'a Detector) -> Self {
        let s = det.imgsz() as u32;
        Self::at_shape(det, s, s)
    }

    /// Measures batches of `width x height` inputs (a rect letterbox's shape).
    pub fn at_shape(det: &'a Detector, width: u32, height: u32) -> Self {
        let (w, h) = (width.max(1), height.max(1));
        // a textured picture (not a constant: some kernels take shortcuts on zeros)
        let pixels: Vec<u8> = (0..(w as usize * h as usize * 3)).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        // a picture that fills the input exactly
        let geometry = LetterboxGeometry { orig_w: w, orig_h: h, in_w: w, in_h: h, new_w: w, new_h: h, left: 0, top: 0 };
        let picture = Letterboxed { pixels, geometry };
        let host_memory = devmem::device_memory(det.device()).map(|m| m.source.is_host_memory()).unwrap_or(!det.device().is_cuda());
        Self { det, meter: PeakMeter::new(det.device()), picture, last_used: None, host_memory }
    }

    /// Bytes of the pictures the pipeline holds around batches of `batch` on host memory
    /// ([`PICTURES_PER_BATCH_SLOT`] per slot); 0 on a discrete GPU.
    fn pipeline_bytes(&self, batch: usize) -> u64 {
        if self.host_memory {
            PICTURES_PER_BATCH_SLOT * batch as u64 * self.picture.pixels.len() as u64
        } else {
            0
        }
    }

    /// Peak bytes above the resident set for batches of `batch` pictures, as the agent runs
    /// them: after one unmeasured warm-up pass (on CUDA: the first pass at a new shape runs
    /// cuDNN's one-off algorithm search, whose scratch adapts to what is free and never recurs),
    /// the pool is trimmed and [`MEASURED_PASSES`] passes run back to back with the pool left as
    /// the agent leaves it between batches; the reserved high-water mark over them is what the
    /// planner plans on, the used one (the tensors alone, without the pool's granules and
    /// fragmentation) what it reports beside it. On host memory both include the pipeline's
    /// pictures ([`PICTURES_PER_BATCH_SLOT`] per slot).
    /// Trimming between passes read low: where large activations land in a pool that still holds
    /// the previous pass's free blocks differs from an empty pool (measured: yolov9m
    /// batch 74 read 3232 MiB from an empty pool, and peaked at 3680 MiB in a 1000-batch soak).
    pub fn measure(&self, batch: usize) -> Result<Peaks, ProbeError> {
        if self.det.device().is_cuda() {
            self.run_batch(batch)?;
        }
        let r = self.high_water(|| (0..MEASURED_PASSES).try_for_each(|_| self.run_batch(batch)));
        let _ = self.meter.trim(); // also after an out-of-memory error: the next probe starts clean
        let peaks = r?.1;
        let pictures = self.pipeline_bytes(batch);
        Ok(Peaks { reserved: peaks.reserved + pictures, used: peaks.used + pictures })
    }

    /// Runs `work` from a trimmed pool with the high-water marks reset; returns its result and the
    /// high-water marks above the trimmed start (bytes).
    /// With CUDA graphs on, the detector's graphs are dropped first: the work captures its own,
    /// and the memory they replay over is part of the peak.
    fn high_water<T>(&self, work: impl FnOnce() -> Result<T, ProbeError>) -> Result<(T, Peaks), ProbeError> {
        self.det.drop_graphs();
        self.meter.trim().map_err(dev_err)?;
        let base = self.meter.usage().map_err(dev_err)?;
        self.meter.reset().map_err(dev_err)?;
        let r = work();
        let peak = self.meter.usage().map_err(dev_err)?;
        Ok((r?, Peaks { reserved: peak.reserved_high.saturating_sub(base.reserved), used: peak.used_high.saturating_sub(base.used) }))
    }

    /// One batch of `batch` textured pictures through the agent's path, synchronised.
    fn run_batch(&self, batch: usize) -> Result<(), ProbeError> {
        let pics: Vec<&Letterboxed> = vec![&self.picture; batch];
        // no candidate passes: what is measured is the device's work, not host-side NMS
        let th = Thresholds { conf: 2.0, ..Thresholds::default() };
        self.det.detect(&pics, &th).and_then(|_| self.det.device().synchronize()).map_err(cand_err)
    }

    /// A soak test of a decision: `passes` batches at `batch` (or until `max_s` seconds) through
    /// the agent's path, the pool untouched between them, counting out-of-memory errors and
    /// recording the reserved high-water mark over the whole run (above the trimmed start).
    pub fn soak(&self, batch: usize, passes: usize, max_s: f64) -> Result<Soak, ProbeError> {
        // the stages run eagerly: a graph of the network alone, on a normalised input, is not
        // one the agent's path replays, and would hold its memory beside the agent's
        let graphs = self.det.graphs_enabled();
        self.det.use_graphs(false);
        let stages = self.stage_times(batch, STAGE_PASSES);
        self.det.use_graphs(graphs);
        let stages = stages?;
        let t = std::time::Instant::now();
        let ((done, oom), peak) = self.high_water(|| {
            let (mut done, mut oom) = (0, 0);
            while done < passes && t.elapsed().as_secs_f64() < max_s {
                match self.run_batch(batch) {
                    Ok(()) => {}
                    Err(ProbeError::Oom(_)) => oom += 1,
                    Err(e) => return Err(e),
                }
                done += 1;
            }
            Ok((done, oom))
        })?;
        let peak = peak.reserved + self.pipeline_bytes(batch);
        Ok(Soak { batch, passes: done, oom, seconds: t.elapsed().as_secs_f64(), peak, stages })
    }

    /// Where a batch's time goes on the agent's path, median over `n` batches, each stage
    /// synchronised before the next starts (so the sum is a little more than a batch takes).
    fn stage_times(&self, batch: usize, n: usize) -> Result<StageTimes, ProbeError> {
        let pics: Vec<&Letterboxed> = vec![&self.picture; batch];
        let dev = self.det.device();
        let sync = || dev.synchronize().map_err(cand_err);
        let (mut up, mut model, mut cands) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..n {
            let t0 = std::time::Instant::now();
            let x = self.det.input(&pics).map_err(cand_err)?;
            sync()?;
            let t1 = std::time::Instant::now();
            let raw = self.det.forward(&x).map_err(cand_err)?;
            sync()?;
            let t2 = std::time::Instant::now();
            self.det.candidates(&raw, 2.0).map_err(cand_err)?;
            let t3 = std::time::Instant::now();
            up.push((t1 - t0).as_secs_f64() * 1e3);
            model.push((t2 - t1).as_secs_f64() * 1e3);
            cands.push((t3 - t2).as_secs_f64() * 1e3);
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        };
        Ok(StageTimes { batches: n, upload_ms: median(up), model_ms: median(model), candidates_ms: median(cands) })
    }
}

/// Batches timed stage by stage at the start of a soak.
pub(super) const STAGE_PASSES: usize = 5;

/// Median milliseconds per batch of each stage of the agent's path (see
/// [`DetectorProber::soak`]): pictures to the device's normalised input, the network, and the
/// candidates back on the host.
#[derive(Debug, Clone, Serialize)]
pub struct StageTimes {
    pub batches: usize,
    pub upload_ms: f64,
    pub model_ms: f64,
    pub candidates_ms: f64,
}

/// What [`DetectorProber::soak`] saw.
#[derive(Debug, Clone, Serialize)]
pub struct Soak {
    pub batch: usize,
    pub passes: usize,
    pub oom: usize,
    pub seconds: f64,
    /// Reserved high-water mark over the soak, above the trimmed start (bytes).
    pub peak: u64,
    /// Where the time of a batch goes (timed before the soak).
    pub stages: StageTimes,
}

fn dev_err(e: devmem::DevMemError) -> ProbeError {
    ProbeError::Other(e.to_string())
}

fn cand_err(e: candle_core::Error) -> ProbeError {
    if crate::backend::oom::is_oom(&e) {
        ProbeError::Oom(e.to_string().lines().next().unwrap_or("").to_string())
    } else {
        ProbeError::Other(e.to_string())
    }
}

impl Prober for DetectorProber<'_> {
    fn peak_at(&mut self, batch: usize) -> Result<u64, ProbeError> {
        let p = self.measure(batch)?;
        self.last_used = Some(p.used);
        Ok(p.reserved)
    }

    fn last_used(&self) -> Option<u64> {
        self.last_used
    }
}
