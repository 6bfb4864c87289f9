//! Memory-aware batch planning: a budget from the device's free memory, a memory model fitted
//! to measured peaks (fixed + per-image bytes), the largest batch whose predicted peak fits,
//! verified by a real forward pass and stepped down on failure.
//!
//! The planning logic is generic over a [`Prober`] (one measured forward pass at a batch size),
//! so it is tested on the CPU with synthetic probers; [`DetectorProber`] is the real one.
//! What it avoids (the known failure modes of ultralytics' AutoBatch): extrapolating only from
//! tiny probes (the chosen batch is always verified, and a verified point re-fits the model),
//! whole-GiB rounding (bytes throughout), counting other processes' memory as ours (the peak
//! is this process's allocator high-water mark, the budget the device's free memory), and
//! returning a batch at or above one that failed.

use serde::Serialize;

use crate::detector::Detector;
use crate::devmem::{self, DeviceMemory, PeakMeter};
use crate::postprocess::Thresholds;
use crate::preprocess::{LetterboxGeometry, Letterboxed};

pub const MIB: f64 = 1024.0 * 1024.0;

/// Why planning failed.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("invalid planner setting: {0}")]
    Config(String),
    #[error("not even batch 1 fits: {0}")]
    NothingFits(String),
    #[error("probe at batch {batch} failed: {reason}")]
    Probe { batch: usize, reason: String },
    #[error(transparent)]
    Memory(#[from] devmem::DevMemError),
}

/// A failed probe.
#[derive(Debug)]
pub enum ProbeError {
    /// The device ran out of memory (the planner steps down).
    Oom(String),
    /// Anything else (the planner gives up).
    Other(String),
}

/// One measured forward pass: the peak bytes it needed above what was resident before it.
pub trait Prober {
    fn peak_at(&mut self, batch: usize) -> Result<u64, ProbeError>;

    /// The bytes the pass's tensors held at once in the last successful [`Self::peak_at`] (the
    /// pool's *used* high-water mark), where the prober can read it; the planner reports the
    /// model's own memory from it beside the pool's reservation.
    fn last_used(&self) -> Option<u64> {
        None
    }
}

/// Planner settings.
#[derive(Debug, Clone, Serialize)]
pub struct PlannerConfig {
    /// Cap on the memory the agent may use, below the device's free memory (bytes).
    pub memory_limit: Option<u64>,
    /// Share of min(free, memory_limit) that the agent plans to use.
    pub memory_fraction: f64,
    /// Largest batch the agent will run.
    pub max_batch: usize,
    /// Batches measured to fit the memory model (ascending, small).
    pub probe_batches: Vec<usize>,
}

impl Default for PlannerConfig {
    fn default() -> Self {
        Self { memory_limit: None, memory_fraction: 0.8, max_batch: 256, probe_batches: vec![1, 2, 4] }
    }
}

impl PlannerConfig {
    pub fn validate(&self) -> Result<(), PlanError> {
        if !(self.memory_fraction > 0.0 && self.memory_fraction <= 1.0) {
            return Err(PlanError::Config(format!("memory_fraction {} must be in (0, 1]", self.memory_fraction)));
        }
        if self.max_batch == 0 || self.max_batch > 65536 {
            return Err(PlanError::Config(format!("max_batch {} must be in 1..=65536", self.max_batch)));
        }
        if self.probe_batches.is_empty() || self.probe_batches.contains(&0) || self.probe_batches.windows(2).any(|w| w[0] >= w[1]) {
            return Err(PlanError::Config(format!("probe_batches {:?} must be ascending and positive", self.probe_batches)));
        }
        if self.memory_limit == Some(0) {
            return Err(PlanError::Config("memory_limit must be positive".into()));
        }
        Ok(())
    }
}

/// Parses a byte size: `8GiB`, `512MiB`, `8G` (= GiB), `1.5GB` (decimal), `123456`.
pub fn parse_bytes(s: &str) -> Result<u64, PlanError> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().map_err(|_| PlanError::Config(format!("`{s}` is not a size (e.g. 8GiB, 512MiB)")))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => MIB,
        "g" | "gib" => MIB * 1024.0,
        "t" | "tib" => MIB * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        u => return Err(PlanError::Config(format!("unknown size unit `{u}` in `{s}`"))),
    };
    let bytes = v * mult;
    if !bytes.is_finite() || bytes < 1.0 {
        return Err(PlanError::Config(format!("`{s}` is not a positive size")));
    }
    Ok(bytes.round() as u64)
}

/// The memory the agent may use.
#[derive(Debug, Clone, Serialize)]
pub struct Budget {
    pub free: u64,
    pub total: u64,
    pub memory_limit: Option<u64>,
    pub memory_fraction: f64,
    pub source: devmem::MemorySource,
    /// min(free, memory_limit) x memory_fraction, bytes.
    pub bytes: u64,
}

impl Budget {
    pub fn new(mem: DeviceMemory, cfg: &PlannerConfig) -> Self {
        let base = cfg.memory_limit.map_or(mem.free, |l| l.min(mem.free));
        Self { free: mem.free, total: mem.total, memory_limit: cfg.memory_limit, memory_fraction: cfg.memory_fraction, source: mem.source, bytes: (base as f64 * cfg.memory_fraction) as u64 }
    }
}

/// Peak bytes as fixed + per_image x batch (least squares over the measured points, raised over
/// them), and the measured points themselves ([`MemoryFit::predict`]).
#[derive(Debug, Clone, Serialize)]
pub struct MemoryFit {
    pub fixed: f64,
    pub per_image: f64,
    /// (batch, measured peak bytes)
    pub points: Vec<(usize, u64)>,
}

impl MemoryFit {
    /// Fits the points. One point: all of it is per-image (an over-estimate for larger batches).
    /// The per-image cost is the least-squares slope, at least the secant from the smallest to
    /// the largest measured batch (and positive); the line
    /// is then raised to lie on or above every measured point (an upper envelope): with CUDA's
    /// pool alone (`YOLO_EDGE_ALLOCATOR=pool`), a peak that read low because the pool happened
    /// to place the large activations well must not pull the line under the peaks that read
    /// high. [`predict`](Self::predict) uses its slope past the largest measured batch.
    pub fn fit(points: &[(usize, u64)]) -> Option<Self> {
        let mut pts: Vec<(usize, u64)> = points.to_vec();
        pts.sort();
        // a batch measured twice keeps its higher reading
        let mut merged: Vec<(usize, u64)> = Vec::with_capacity(pts.len());
        for p in pts {
            match merged.last_mut() {
                Some(q) if q.0 == p.0 => q.1 = q.1.max(p.1),
                _ => merged.push(p),
            }
        }
        let pts = merged;
        match pts.len() {
            0 => None,
            1 => Some(Self { fixed: 0.0, per_image: pts[0].1 as f64 / pts[0].0 as f64, points: pts }),
            n => {
                let nf = n as f64;
                let mx = pts.iter().map(|p| p.0 as f64).sum::<f64>() / nf;
                let my = pts.iter().map(|p| p.1 as f64).sum::<f64>() / nf;
                let sxy: f64 = pts.iter().map(|p| (p.0 as f64 - mx) * (p.1 as f64 - my)).sum();
                let sxx: f64 = pts.iter().map(|p| (p.0 as f64 - mx).powi(2)).sum();
                let ls = if sxx > 0.0 { sxy / sxx } else { 0.0 };
                // at least the secant from the smallest to the largest batch: growth that steepens
                // with the batch is extrapolated at its overall rate (the slope between two close
                // batches is fragmentation noise: 131 -> 136 read +736 MiB on the H200)
                let (a, b) = (pts[0], pts[n - 1]);
                let secant = (b.1 as f64 - a.1 as f64) / (b.0 - a.0) as f64;
                let slope = ls.max(secant).max(1.0);
                // the lowest line of that slope with no measured point above it
                let fixed = pts.iter().map(|p| p.1 as f64 - slope * p.0 as f64).fold(f64::NEG_INFINITY, f64::max);
                Some(Self { fixed, per_image: slope, points: pts })
            }
        }
    }

    /// Predicted peak bytes at `batch`: a measured batch's own reading; between two measured
    /// batches, the straight line between their readings; past the largest, its reading plus
    /// the fitted cost per image; below the smallest, the fitted line.
    ///
    /// The readings repeat exactly with the activation arena (`crate::arena`: the same batch read
    /// the same bytes every time, H200, session 9), so they are the best prediction there is at
    /// and between the measured batches. A single line through them all is not: which cuDNN
    /// algorithm a shape gets (and its workspace) is chosen by timing, once per process, so one
    /// small batch can read a few MiB above the line of the others (yolov9s batch 2 read 76 MiB
    /// in one process, 62 in another), and the line raised over it over-predicted batch 1 by 41 %.
    pub fn predict(&self, batch: usize) -> u64 {
        let line = |b: usize| (self.fixed + self.per_image * b as f64).max(0.0) as u64;
        let pts = &self.points;
        match pts.iter().position(|p| p.0 >= batch) {
            Some(i) if pts[i].0 == batch => pts[i].1,
            Some(0) => line(batch),
            Some(i) => {
                let ((b0, y0), (b1, y1)) = (pts[i - 1], pts[i]);
                (y0 as f64 + (y1 as f64 - y0 as f64) * (batch - b0) as f64 / (b1 - b0) as f64).max(0.0) as u64
            }
            None => match pts.last() {
                Some(&(bl, yl)) => yl + (self.per_image * (batch - bl) as f64) as u64,
                None => line(batch),
            },
        }
    }

    /// Largest batch in 1..=max_batch (and below `failed_at`) whose predicted peak fits.
    pub fn choose(&self, budget: u64, max_batch: usize, failed_at: Option<usize>) -> Option<usize> {
        let cap = failed_at.map_or(max_batch, |f| max_batch.min(f.saturating_sub(1)));
        (1..=cap).rev().find(|&b| self.predict(b) <= budget)
    }
}

/// One measurement the planner made.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub batch: usize,
    pub purpose: &'static str,
    pub predicted: Option<u64>,
    pub measured: Option<u64>,
    pub outcome: String,
}

/// The planner's decision and its reasons.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub budget: Budget,
    pub max_batch: usize,
    pub fit: MemoryFit,
    /// The same fit of the *used* peaks (the tensors alone, without the pool's granules and
    /// fragmentation), where the prober reads them.
    pub used_fit: Option<MemoryFit>,
    pub batch: usize,
    pub predicted_peak: u64,
    pub verified_peak: u64,
    pub steps: Vec<Step>,
    pub reasons: Vec<String>,
}

fn mib(b: impl Into<f64>) -> String {
    format!("{:.1} MiB", b.into() / MIB)
}

/// Most verifying forward passes one plan makes (beyond the probes).
const MAX_VERIFIES: usize = 8;

/// Plans the batch: probe, fit, choose, verify; re-fit with every verified point and try the
/// larger batch it allows; after a failure, search between the best verified batch and the
/// failed one (halving), until within 5 % of the failed one.
pub fn plan(prober: &mut dyn Prober, budget: Budget, cfg: &PlannerConfig) -> Result<Plan, PlanError> {
    cfg.validate()?;
    let mut steps = Vec::new();
    let mut reasons = vec![format!(
        "budget {} = min(free {}, limit {}) x {}",
        mib(budget.bytes as f64),
        mib(budget.free as f64),
        budget.memory_limit.map_or("none".to_string(), |l| mib(l as f64)),
        budget.memory_fraction
    )];
    let mut points: Vec<(usize, u64)> = Vec::new();
    let mut used_points: Vec<(usize, u64)> = Vec::new();
    let mut failed_at: Option<usize> = None;
    // one measured pass; the used peak, where the prober reads one, is kept beside the reserved
    let mut probe = |b: usize, used_points: &mut Vec<(usize, u64)>| {
        let r = prober.peak_at(b);
        if r.is_ok() {
            used_points.extend(prober.last_used().map(|u| (b, u)));
        }
        r
    };
    let record = |steps: &mut Vec<Step>, batch, purpose, predicted, r: &Result<u64, ProbeError>, fits: bool| {
        steps.push(Step {
            batch,
            purpose,
            predicted,
            measured: r.as_ref().ok().copied(),
            outcome: match r {
                Ok(_) if fits => "ok".into(),
                Ok(_) => "over budget".into(),
                Err(ProbeError::Oom(m)) => format!("out of memory: {m}"),
                Err(ProbeError::Other(m)) => format!("failed: {m}"),
            },
        })
    };
    for &b in cfg.probe_batches.iter().filter(|&&b| b <= cfg.max_batch) {
        let r = probe(b, &mut used_points);
        let fits = matches!(r, Ok(p) if p <= budget.bytes);
        record(&mut steps, b, "probe", None, &r, fits);
        match r {
            Ok(p) => {
                points.push((b, p));
                if !fits {
                    failed_at = Some(b);
                    break;
                }
            }
            Err(ProbeError::Oom(_)) => {
                failed_at = Some(b);
                break;
            }
            Err(ProbeError::Other(m)) => return Err(PlanError::Probe { batch: b, reason: m }),
        }
    }
    let mut fit = MemoryFit::fit(&points).ok_or_else(|| PlanError::NothingFits(format!("batch 1 ran out of memory within a budget of {}", mib(budget.bytes as f64))))?;
    reasons.push(format!(
        "probes {:?} fit: fixed {} + {} per image (predictions: a measured batch's own reading, straight lines between measured batches, the per-image cost beyond them)",
        points.iter().map(|p| p.0).collect::<Vec<_>>(),
        mib(fit.fixed),
        mib(fit.per_image)
    ));
    let mut best: Option<(usize, u64, u64)> = None; // (batch, predicted, verified)
    // once a batch failed (over budget or out of memory) the line is not trusted alone: each
    // candidate is also at most halfway between the best verified batch and the failed one
    let mut searching = failed_at.is_some();
    let mut verifies = 0;
    while verifies < MAX_VERIFIES {
        let Some(mut b) = fit.choose(budget.bytes, cfg.max_batch, failed_at) else { break };
        if searching {
            let f = failed_at.unwrap_or(b + 1);
            b = b.min(match best {
                Some((ok, _, _)) => (ok + f) / 2,
                None => (f * 3 / 4).max(1),
            });
        }
        if let Some((ok, _, _)) = best {
            if b <= ok {
                break; // nothing larger left to try
            }
            if failed_at.is_some_and(|f| ok * 100 >= (f - 1) * 95) {
                break; // within 5 % of the smallest batch known not to fit
            }
            reasons.push(format!("with batch {ok} verified, the re-fit allows {b}: trying it"));
        }
        let predicted = fit.predict(b);
        let r = match points.iter().find(|p| p.0 == b) {
            Some(&(_, p)) => Ok(p),
            None => {
                verifies += 1;
                probe(b, &mut used_points)
            }
        };
        let fits = matches!(r, Ok(p) if p <= budget.bytes);
        record(&mut steps, b, "verify", Some(predicted), &r, fits);
        match r {
            Ok(p) => {
                points.push((b, p));
                if fits {
                    reasons.push(format!("batch {b}: predicted {}, measured {} (fits)", mib(predicted as f64), mib(p as f64)));
                    best = Some((b, predicted, p));
                } else {
                    reasons.push(format!("batch {b}: predicted {}, measured {} over budget; stepping down", mib(predicted as f64), mib(p as f64)));
                    failed_at = Some(failed_at.map_or(b, |f| f.min(b)));
                    searching = true;
                }
            }
            Err(ProbeError::Oom(m)) => {
                reasons.push(format!("batch {b}: out of memory ({m}); stepping down"));
                failed_at = Some(failed_at.map_or(b, |f| f.min(b)));
                searching = true;
            }
            Err(ProbeError::Other(m)) => return Err(PlanError::Probe { batch: b, reason: m }),
        }
        if let Some(f) = MemoryFit::fit(&points) {
            fit = f;
        }
    }
    let (batch, predicted_peak, verified_peak) = best.ok_or_else(|| PlanError::NothingFits(format!("no batch verified within a budget of {}", mib(budget.bytes as f64))))?;
    if batch == cfg.max_batch {
        reasons.push(format!("chose {batch}: max_batch reached"));
    } else {
        reasons.push(format!("chose {batch}: largest verified batch whose peak fits{}", failed_at.map_or(String::new(), |f| format!(" (batch {f} did not)"))));
    }
    let used_fit = MemoryFit::fit(&used_points);
    // (on the CPU the two readings are one: the process's resident set)
    if let Some(u) = used_fit.as_ref().filter(|_| used_points != points) {
        let used_at = u.predict(batch).max(1);
        reasons.push(format!(
            "the tensors themselves need {} + {} per picture (the pool's used high-water mark); the pool reserved {:.2}x that at batch {batch} (its granules and fragmentation), which is what the budget holds",
            mib(u.fixed),
            mib(u.per_image),
            verified_peak as f64 / used_at as f64
        ));
    }
    Ok(Plan { budget, max_batch: cfg.max_batch, fit, used_fit, batch, predicted_peak, verified_peak, steps, reasons })
}

/// Telemetry values for the agent (issue 4, item 6).
#[derive(Debug, Clone, Serialize)]
pub struct MemoryTelemetry {
    pub device_total: u64,
    pub device_free: u64,
    pub process_used: u64,
    pub process_reserved: u64,
    pub process_high_water: u64,
    pub predicted_peak: u64,
    pub verified_peak: u64,
    pub startup_batch: usize,
    pub current_batch: usize,
    pub oom_fallbacks: u64,
    /// Unix seconds of the last out-of-memory fallback.
    pub last_oom_unix: Option<u64>,
}

impl MemoryTelemetry {
    pub fn new(plan: &Plan, mem: DeviceMemory, usage: devmem::Usage) -> Self {
        Self {
            device_total: mem.total,
            device_free: mem.free,
            process_used: usage.used,
            process_reserved: usage.reserved,
            process_high_water: usage.used_high,
            predicted_peak: plan.predicted_peak,
            verified_peak: plan.verified_peak,
            startup_batch: plan.batch,
            current_batch: plan.batch,
            oom_fallbacks: 0,
            last_oom_unix: None,
        }
    }

    /// Records an out-of-memory fallback to `new_batch`.
    pub fn record_oom(&mut self, new_batch: usize) {
        self.oom_fallbacks += 1;
        self.current_batch = new_batch;
        self.last_oom_unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_secs());
    }
}

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

pub struct DetectorProber<'a> {
    det: &'a Detector,
    meter: PeakMeter,
    picture: Letterboxed,
    /// The used high-water mark of the last successful probe.
    last_used: Option<u64>,
}

impl<'a> DetectorProber<'a> {
    pub fn new(det: &'a Detector) -> Self {
        let s = det.imgsz() as u32;
        // a textured picture (not a constant: some kernels take shortcuts on zeros)
        let pixels: Vec<u8> = (0..(s * s * 3) as usize).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let picture = Letterboxed { pixels, geometry: LetterboxGeometry::new(s, s, s) };
        Self { det, meter: PeakMeter::new(det.device()), picture, last_used: None }
    }

    /// Peak bytes above the resident set for batches of `batch` pictures, as the agent runs
    /// them: after one unmeasured warm-up pass (on CUDA: the first pass at a new shape runs
    /// cuDNN's one-off algorithm search, whose scratch adapts to what is free and never recurs),
    /// the pool is trimmed and [`MEASURED_PASSES`] passes run back to back with the pool left as
    /// the agent leaves it between batches; the reserved high-water mark over them is what the
    /// planner plans on, the used one (the tensors alone, without the pool's granules and
    /// fragmentation) what it reports beside it.
    /// Trimming between passes read low: where large activations land in a pool that still holds
    /// the previous pass's free blocks differs from an empty pool (H200, session 4: yolov9m
    /// batch 74 read 3232 MiB from an empty pool, and peaked at 3680 MiB in a 1000-batch soak).
    pub fn measure(&self, batch: usize) -> Result<Peaks, ProbeError> {
        if self.det.device().is_cuda() {
            self.run_batch(batch)?;
        }
        let r = self.high_water(|| (0..MEASURED_PASSES).try_for_each(|_| self.run_batch(batch)));
        let _ = self.meter.trim(); // also after an out-of-memory error: the next probe starts clean
        Ok(r?.1)
    }

    /// Runs `work` from a trimmed pool with the high-water marks reset; returns its result and the
    /// high-water marks above the trimmed start (bytes).
    fn high_water<T>(&self, work: impl FnOnce() -> Result<T, ProbeError>) -> Result<(T, Peaks), ProbeError> {
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
        let stages = self.stage_times(batch, STAGE_PASSES)?;
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
        Ok(Soak { batch, passes: done, oom, seconds: t.elapsed().as_secs_f64(), peak: peak.reserved, stages })
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
const STAGE_PASSES: usize = 5;

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
    if crate::memory::is_oom(&e) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devmem::MemorySource;

    const M: u64 = 1 << 20;

    /// A synthetic device: peak = fixed + per_image x b (+ an optional jump past a batch);
    /// anything above `capacity` is out of memory.
    struct Fake {
        fixed: u64,
        per: u64,
        jump_after: Option<(usize, u64)>,
        capacity: u64,
        calls: Vec<usize>,
    }
    impl Prober for Fake {
        fn peak_at(&mut self, b: usize) -> Result<u64, ProbeError> {
            self.calls.push(b);
            let mut p = self.fixed + self.per * b as u64;
            if let Some((after, extra)) = self.jump_after {
                if b > after {
                    p += extra;
                }
            }
            if p > self.capacity {
                Err(ProbeError::Oom("CUDA_ERROR_OUT_OF_MEMORY".into()))
            } else {
                Ok(p)
            }
        }
    }

    fn budget(free: u64, limit: Option<u64>) -> (Budget, PlannerConfig) {
        let cfg = PlannerConfig { memory_limit: limit, ..Default::default() };
        (Budget::new(DeviceMemory { free, total: free * 2, source: MemorySource::HostMeminfo }, &cfg), cfg)
    }

    #[test]
    fn budget_is_min_of_free_and_limit_times_fraction() {
        let (b, _) = budget(10_000 * M, Some(4096 * M));
        assert_eq!(b.bytes, (4096.0 * M as f64 * 0.8) as u64);
        let (b, _) = budget(1000 * M, Some(4096 * M));
        assert_eq!(b.bytes, 800 * M);
        let (b, _) = budget(1000 * M, None);
        assert_eq!(b.bytes, 800 * M);
    }

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_bytes("8GiB").unwrap(), 8 << 30);
        assert_eq!(parse_bytes("8G").unwrap(), 8 << 30);
        assert_eq!(parse_bytes("512 MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("8XB").is_err());
        assert!(parse_bytes("0").is_err());
    }

    #[test]
    fn fit_recovers_a_linear_model() {
        let f = MemoryFit::fit(&[(1, 150 * M), (2, 200 * M), (4, 300 * M)]).unwrap();
        assert!((f.per_image - 50.0 * M as f64).abs() < 1.0);
        assert!((f.fixed - 100.0 * M as f64).abs() < 2.0);
        assert_eq!(f.predict(10), 600 * M);
        // choose: (1000 - 100) / 50 = 18
        assert_eq!(f.choose(1000 * M, 256, None), Some(18));
        assert_eq!(f.choose(1000 * M, 16, None), Some(16));
        assert_eq!(f.choose(1000 * M, 256, Some(12)), Some(11));
        assert_eq!(f.choose(100 * M, 256, None), None);
        // the line lies on or above every measured point, also between them
        let g = MemoryFit::fit(&[(1, 100 * M), (2, 120 * M), (4, 200 * M)]).unwrap();
        assert!(g.predict(3) >= 160 * M && g.predict(3) <= 180 * M, "{}", g.predict(3) / M);
        for (b, p) in [(1, 100 * M), (2, 120 * M), (4, 200 * M)] {
            assert!(g.predict(b) >= p);
        }
    }

    #[test]
    fn fit_never_underpredicts_the_largest_point() {
        // convex growth: the line still covers the largest point, at least at the secant's rate
        let f = MemoryFit::fit(&[(1, 100 * M), (2, 120 * M), (4, 200 * M)]).unwrap();
        assert!(f.predict(4) >= 200 * M);
        assert!(f.per_image >= 100.0 / 3.0 * M as f64);
        // two close batches that read far apart (fragmentation) do not set the slope
        let k = MemoryFit::fit(&[(1, 32 * M), (4, 160 * M), (102, 5056 * M), (131, 5984 * M), (136, 6720 * M)]).unwrap();
        assert!(k.per_image < 60.0 * M as f64, "{} MiB per image", k.per_image / M as f64);
        assert!(k.predict(136) >= 6720 * M);
        // a low reading (lucky placement) does not pull the line under a high one; a batch read
        // twice keeps its higher reading
        let h = MemoryFit::fit(&[(1, 40 * M), (62, 3072 * M), (66, 2880 * M), (74, 3232 * M), (66, 2900 * M)]).unwrap();
        for (b, p) in [(62, 3072 * M), (66, 2900 * M), (74, 3232 * M)] {
            assert!(h.predict(b) >= p, "batch {b}: {} < {}", h.predict(b), p);
        }
        assert_eq!(h.points.iter().filter(|p| p.0 == 66).count(), 1);
        // one point: all per-image
        let f1 = MemoryFit::fit(&[(1, 64 * M)]).unwrap();
        assert_eq!(f1.predict(8), 512 * M);
    }

    #[test]
    fn predicts_measured_batches_exactly_and_interpolates_between_them() {
        // yolov9s 16 GiB with the arena (H200, session 9): batch 2 read high in that process
        let f = MemoryFit::fit(&[(1, 32 * M), (2, 76 * M), (4, 124 * M), (256, 7900 * M)]).unwrap();
        assert!(f.fixed > 10.0 * M as f64, "the envelope line is raised over batch 2");
        assert_eq!(f.predict(1), 32 * M, "a measured batch predicts its own reading (the line says {} MiB)", (f.fixed + f.per_image) as u64 / M);
        assert_eq!(f.predict(2), 76 * M);
        assert_eq!(f.predict(3), 100 * M);
        let b6 = 124.0 * M as f64 + 2.0 * (7900.0 - 124.0) / 252.0 * M as f64;
        assert!((f.predict(6) as f64 - b6).abs() < 2.0, "{} vs {b6}", f.predict(6));
        assert_eq!(f.predict(256), 7900 * M);
        // past the largest batch: its reading plus the fitted cost per image
        assert_eq!(f.predict(266), 7900 * M + (10.0 * f.per_image) as u64);
        // the choice and the verification use the same predictions
        assert_eq!(f.choose(124 * M, 256, None), Some(4));
        assert_eq!(f.choose(99 * M, 256, None), Some(2));
    }

    #[test]
    fn a_probe_that_reads_high_skews_no_other_prediction() {
        // yolov9s at 16 GiB on the H200 (session 9): batch 2 read 76 MiB where its neighbours'
        // line gives 62 (a process-wide cuDNN algorithm choice); every batch up to the chosen
        // one must still be predicted within 10 %
        struct Bumpy;
        fn truth(b: usize) -> u64 {
            if b == 2 {
                76 * M
            } else {
                M + b as u64 * 30_861 * M / 1000
            }
        }
        impl Prober for Bumpy {
            fn peak_at(&mut self, b: usize) -> Result<u64, ProbeError> {
                Ok(truth(b))
            }
        }
        let (bud, cfg) = budget(100_000 * M, Some(16384 * M));
        let plan = plan(&mut Bumpy, bud, &cfg).unwrap();
        assert_eq!(plan.batch, 256);
        for b in 1..=plan.batch {
            let (p, t) = (plan.fit.predict(b) as f64, truth(b) as f64);
            assert!((p - t).abs() <= 0.1 * t, "batch {b}: predicted {} MiB, reads {} MiB", p / M as f64, t / M as f64);
        }
    }

    #[test]
    fn plans_the_largest_fitting_batch_and_verifies_it() {
        let (b, cfg) = budget(100_000 * M, Some(8192 * M)); // budget 6553.6 MiB
        let mut p = Fake { fixed: 300 * M, per: 50 * M, jump_after: None, capacity: u64::MAX, calls: vec![] };
        let plan = plan(&mut p, b.clone(), &cfg).unwrap();
        let exact = ((b.bytes - 300 * M) / (50 * M)) as usize; // 125
        assert_eq!(plan.batch, exact);
        assert!(plan.verified_peak <= b.bytes);
        assert_eq!(p.calls, vec![1, 2, 4, exact]);
        assert!(plan.reasons.iter().any(|r| r.contains("chose")));
    }

    #[test]
    fn respects_max_batch() {
        let (b, mut cfg) = budget(100_000 * M, None);
        cfg.max_batch = 32;
        let mut p = Fake { fixed: 300 * M, per: 50 * M, jump_after: None, capacity: u64::MAX, calls: vec![] };
        let plan = plan(&mut p, b, &cfg).unwrap();
        assert_eq!(plan.batch, 32);
    }

    #[test]
    fn steps_down_when_small_probes_underestimate() {
        // past batch 16 a workspace of 2 GiB appears that the probes at 1, 2, 4 cannot see
        let (b, cfg) = budget(100_000 * M, Some(8192 * M));
        let mut p = Fake { fixed: 300 * M, per: 50 * M, jump_after: Some((16, 2048 * M)), capacity: u64::MAX, calls: vec![] };
        let plan = plan(&mut p, b.clone(), &cfg).unwrap();
        // the true largest fitting batch
        let truth = (1..=256).rev().find(|&n| 300 * M + 50 * M * n as u64 + if n > 16 { 2048 * M } else { 0 } <= b.bytes).unwrap();
        assert!(plan.verified_peak <= b.bytes);
        assert!(plan.batch <= truth, "chose {} > truth {}", plan.batch, truth);
        assert!(plan.batch as f64 >= 0.9 * truth as f64, "chose {} < 90% of {}", plan.batch, truth);
    }

    /// A pool that hands out memory in 32 MiB granules: small probes see steps, not the slope.
    struct Granular {
        per: f64,
        calls: Vec<usize>,
    }
    impl Prober for Granular {
        fn peak_at(&mut self, b: usize) -> Result<u64, ProbeError> {
            self.calls.push(b);
            let g = 32.0 * M as f64;
            Ok(((self.per * b as f64 / g).ceil() * g) as u64 - 32 * M)
        }
    }

    /// A pool that reserves 20 % more than the tensors hold, and reports both.
    struct Reserving {
        per: u64,
    }
    impl Prober for Reserving {
        fn peak_at(&mut self, b: usize) -> Result<u64, ProbeError> {
            Ok(self.per * b as u64 * 6 / 5)
        }
    }

    #[test]
    fn the_plan_reports_the_tensors_own_memory_beside_the_pool() {
        struct Both {
            per: u64,
            last: Option<u64>,
        }
        impl Prober for Both {
            fn peak_at(&mut self, b: usize) -> Result<u64, ProbeError> {
                self.last = Some(self.per * b as u64);
                Ok(self.per * b as u64 * 6 / 5)
            }
            fn last_used(&self) -> Option<u64> {
                self.last
            }
        }
        let (b, cfg) = budget(4096 * M, None);
        let both = plan(&mut Both { per: 20 * M, last: None }, b.clone(), &cfg).unwrap();
        let u = both.used_fit.as_ref().expect("used peaks were reported");
        assert!((u.per_image - 20.0 * M as f64).abs() < 1.0 && u.fixed.abs() < 1.0, "{u:?}");
        assert!((both.fit.per_image - 24.0 * M as f64).abs() < 1.0, "{:?}", both.fit);
        assert!(both.reasons.iter().any(|r| r.contains("20.0 MiB per picture") && r.contains("1.20x")), "{:?}", both.reasons);
        // a prober without used readings: no used fit, the same decision
        let other = plan(&mut Reserving { per: 20 * M }, b, &cfg).unwrap();
        assert!(other.used_fit.is_none());
        assert_eq!(other.batch, both.batch);
    }

    #[test]
    fn granular_pool_still_gets_within_90_percent() {
        // measured on the H200 in the agent: probes 0, 32, 96 MiB at 1, 2, 4 (slope 32 MiB)
        // while the real cost is ~21.5 MiB per picture; the first verify fits far below budget
        let (b, cfg) = budget(1422 * M, None); // budget 1137.6 MiB
        let mut p = Granular { per: 21.5 * M as f64, calls: vec![] };
        let plan = plan(&mut p, b.clone(), &cfg).unwrap();
        let truth = (1..=256).rev().find(|&n| (((21.5 * n as f64) / 32.0).ceil() * 32.0 - 32.0) * M as f64 <= b.bytes as f64).unwrap();
        assert!(plan.verified_peak <= b.bytes);
        assert!(plan.batch <= truth && plan.batch as f64 >= 0.9 * truth as f64, "chose {} of {} ({:?})", plan.batch, truth, p.calls);
        assert!(p.calls.len() <= 3 + MAX_VERIFIES, "{:?}", p.calls);
    }

    #[test]
    fn never_returns_a_batch_at_or_above_one_that_failed() {
        // the device itself has less than the budget (another process took memory)
        let (b, cfg) = budget(100_000 * M, Some(8192 * M));
        let mut p = Fake { fixed: 300 * M, per: 50 * M, jump_after: None, capacity: 3000 * M, calls: vec![] };
        let plan = plan(&mut p, b, &cfg).unwrap();
        let oom_batches: Vec<usize> = p.calls.iter().copied().filter(|&n| 300 + 50 * n as u64 > 3000).collect();
        assert!(!oom_batches.is_empty(), "the first verify should have failed");
        assert!(plan.batch < *oom_batches.iter().min().unwrap());
        assert!(plan.batch <= 54 && plan.batch as f64 >= 0.9 * 54.0, "chose {}", plan.batch); // (3000 - 300) / 50 fits
        assert!(plan.steps.iter().any(|s| s.outcome.starts_with("out of memory")));
    }

    #[test]
    fn fails_cleanly_when_nothing_fits() {
        let (b, cfg) = budget(1000 * M, None);
        let mut p = Fake { fixed: 2000 * M, per: 50 * M, jump_after: None, capacity: u64::MAX, calls: vec![] };
        assert!(matches!(plan(&mut p, b, &cfg), Err(PlanError::NothingFits(_))));
        let (b, cfg) = budget(100_000 * M, None);
        let mut p = Fake { fixed: 2000 * M, per: 50 * M, jump_after: None, capacity: 10 * M, calls: vec![] };
        assert!(matches!(plan(&mut p, b, &cfg), Err(PlanError::NothingFits(_))));
    }

    #[test]
    fn rejects_bad_settings() {
        let (b, mut cfg) = budget(1000 * M, None);
        cfg.memory_fraction = 1.5;
        let mut p = Fake { fixed: 0, per: M, jump_after: None, capacity: u64::MAX, calls: vec![] };
        assert!(matches!(plan(&mut p, b.clone(), &cfg), Err(PlanError::Config(_))));
        cfg.memory_fraction = 0.8;
        cfg.probe_batches = vec![4, 2];
        assert!(matches!(plan(&mut p, b, &cfg), Err(PlanError::Config(_))));
    }

    #[test]
    fn plans_a_real_model_on_the_cpu_within_a_small_limit() {
        use crate::model::{BuildOptions, Variant, YoloV9};
        let ck = crate::randweights::random_checkpoint(Variant::T, 0).unwrap();
        let model = YoloV9::from_checkpoint(&ck, &BuildOptions::new(candle_core::Device::Cpu, candle_core::DType::F32)).unwrap();
        let det = Detector::from_model(model, 64);
        let mut prober = DetectorProber::new(&det);
        let cfg = PlannerConfig { memory_limit: Some(256 << 20), max_batch: 64, ..Default::default() };
        let budget = Budget::new(devmem::device_memory(&candle_core::Device::Cpu).unwrap(), &cfg);
        let plan = plan(&mut prober, budget.clone(), &cfg).unwrap();
        assert!(plan.batch >= 1 && plan.batch <= 64);
        assert!(plan.verified_peak <= budget.bytes);
        assert!(plan.fit.per_image > 0.0);
        // the soak of that decision: every pass runs, none fails, each stage is timed
        let soak = prober.soak(plan.batch.min(4), 3, 600.0).unwrap();
        assert_eq!((soak.passes, soak.oom), (3, 0));
        assert_eq!(soak.stages.batches, STAGE_PASSES);
        assert!(soak.stages.model_ms > 0.0 && soak.stages.upload_ms > 0.0, "{:?}", soak.stages);
    }
}
