//! The plan at another input shape. The planner measures batches of `imgsz x imgsz` pictures,
//! the largest input a letterbox makes at `imgsz`; a rect letterbox feeds smaller ones (a 16:9
//! picture at 640 runs at 640x384). A batch's memory above the resident model is its
//! activations (and, on host memory, the pictures the pipeline holds), all of which scale with
//! the input's pixels: `b` pictures of `w x h` cost what `ceil(b x w x h / imgsz²)` square ones
//! do. So a plan made at the square gives every shape an estimate of its batch: the largest `b`
//! whose square equivalent is at most the planned batch, capped by `max_batch`. Memory is not
//! in proportion to pixels everywhere, so on a discrete GPU the agent measures an estimate above
//! the planned batch before it runs it; on host memory it never runs above the planned batch
//! (`agent::pipeline`; BENCHMARKS.md "Batches per input shape").

use serde::Serialize;

use super::{Plan, ProbeError, Prober};

/// What a [`Plan`] allows at one input shape.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ShapePlan {
    /// Input width and height.
    pub width: u32,
    pub height: u32,
    /// The input's pixels over the planned square's.
    pub area_ratio: f64,
    /// The largest batch of this shape whose square equivalent is at most the planned batch
    /// (at least 1, at most `max_batch`).
    pub batch: usize,
    /// The square batch that costs what `batch` pictures of this shape do.
    pub square_equivalent: usize,
    /// The plan's predicted peak at `square_equivalent` (bytes).
    pub predicted_peak: u64,
}

impl Plan {
    /// The batch this plan, made at `side x side`, allows for inputs of `width x height`.
    pub fn for_shape(&self, side: u32, width: u32, height: u32) -> ShapePlan {
        let area_ratio = (width as f64 * height as f64) / (side as f64 * side as f64).max(1.0);
        let batch = if area_ratio > 0.0 { (self.batch as f64 / area_ratio).floor() } else { self.max_batch as f64 };
        let batch = (batch as usize).clamp(1, self.max_batch.max(1));
        let square_equivalent = square_equivalent(batch, area_ratio);
        ShapePlan { width, height, area_ratio, batch, square_equivalent, predicted_peak: self.fit.predict(square_equivalent) }
    }
}

/// One measured batch of [`Plan::decide_shape`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShapeProbe {
    pub batch: usize,
    /// The measured peak (bytes), where the pass ran.
    pub peak: Option<u64>,
    /// Why the pass did not run (out of memory, or another error).
    pub error: Option<String>,
}

/// The batch taken for an input shape, and how it was decided.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShapeDecision {
    pub estimate: ShapePlan,
    /// The batch taken.
    pub batch: usize,
    /// The measured peak of `batch` where it was measured (bytes).
    pub verified_peak: Option<u64>,
    /// The batches measured, in order.
    pub tried: Vec<ShapeProbe>,
}

impl Plan {
    /// The batch for inputs of `width x height` when batches of `startup` square pictures are
    /// known to fit: the estimate ([`Self::for_shape`]), taken as it is at or below `startup`.
    /// Above it, on a discrete GPU, measured first with `prober` (which runs passes at that
    /// shape): the estimate, then the batch halfway to `startup`, the first whose peak is within
    /// the budget; `startup` if neither is. Memory is not in proportion to pixels everywhere (on
    /// the CPU, 40 pictures at 320x224 were measured to need more than 28 at 320x320).
    ///
    /// On host memory (the CPU, an integrated GPU) the shape runs at `startup` at most, never
    /// measured above it: there a batch over the limit is not an error but the kernel's OOM
    /// killer, and a pass measured inside the running agent shares the process with the
    /// pipeline's own allocations (in a 256 MiB cgroup, 41 pictures at 320x224 read 241 MiB in
    /// the agent against 178 MiB predicted, and an agent measuring them was OOM-killed). Every
    /// shape a letterbox makes fits inside the planned square, so its batches
    /// of `startup` need no more than the square's verified ones.
    pub fn decide_shape(&self, prober: &mut impl Prober, side: u32, width: u32, height: u32, startup: usize) -> ShapeDecision {
        let estimate = self.for_shape(side, width, height);
        let mut decision = ShapeDecision { estimate, batch: estimate.batch.min(startup), verified_peak: None, tried: Vec::new() };
        if estimate.batch <= startup || self.budget.source.is_host_memory() {
            return decision;
        }
        for b in [estimate.batch, (estimate.batch + startup).div_ceil(2)] {
            if b <= startup {
                break;
            }
            let r = prober.peak_at(b);
            let fits = matches!(r, Ok(p) if p <= self.budget.bytes);
            decision.tried.push(match r {
                Ok(p) => ShapeProbe { batch: b, peak: Some(p), error: None },
                Err(ProbeError::Oom(e) | ProbeError::Other(e)) => ShapeProbe { batch: b, peak: None, error: Some(e) },
            });
            if fits {
                decision.batch = b;
                decision.verified_peak = decision.tried.last().and_then(|t| t.peak);
                break;
            }
        }
        decision
    }
}

/// `ceil(batch x area_ratio)`, at least 1; the small tolerance keeps a ratio that is exactly
/// `k / batch` from rounding up past `k` in floating point.
fn square_equivalent(batch: usize, area_ratio: f64) -> usize {
    ((batch as f64 * area_ratio - 1e-9).ceil() as usize).max(1)
}

/// A plan of `batch` (of `max_batch`) at the square on a discrete GPU with 1 GiB free, for
/// tests: peaks 30, 50 and 90 MiB measured at batches 1, 2 and 4.
#[cfg(test)]
pub(crate) fn test_plan(batch: usize, max_batch: usize) -> Plan {
    use crate::backend::devmem::{DeviceMemory, Limit, MemorySource};
    use crate::planner::{Budget, MemoryFit, PlannerConfig};
    let fit = MemoryFit::fit(&[(1, 30 << 20), (2, 50 << 20), (4, 90 << 20)]).expect("three points fit");
    let mem = DeviceMemory { free: 1 << 30, total: 2 << 30, source: MemorySource::CudaDriver, limit: Limit::Driver };
    Plan {
        budget: Budget::new(mem, &PlannerConfig { max_batch, ..Default::default() }),
        max_batch,
        fit,
        used_fit: None,
        batch,
        predicted_peak: 0,
        verified_peak: 0,
        steps: vec![],
        reasons: vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::test_plan as plan;
    use crate::backend::devmem::MemorySource;
    use crate::planner::{ProbeError, Prober};

    /// Peaks of `per_picture` bytes per picture, out of memory above `capacity`.
    struct AtShape {
        per_picture: u64,
        capacity: u64,
        calls: Vec<usize>,
    }
    impl Prober for AtShape {
        fn peak_at(&mut self, b: usize) -> Result<u64, ProbeError> {
            self.calls.push(b);
            let p = self.per_picture * b as u64;
            if p > self.capacity {
                Err(ProbeError::Oom("out of memory".into()))
            } else {
                Ok(p)
            }
        }
    }

    #[test]
    fn smaller_inputs_get_the_batch_their_pixels_allow() {
        // memory-bound at 30 square pictures: 640x384 is 0.6 of 640x640, so 50 of them cost
        // what 30 square ones do
        let p = plan(30, 256);
        let s = p.for_shape(640, 640, 384);
        assert_eq!((s.batch, s.square_equivalent), (50, 30));
        assert!((s.area_ratio - 0.6).abs() < 1e-12);
        assert_eq!(s.predicted_peak, p.fit.predict(30));
        // 4:3 at 640x480: 30 / 0.75 = 40
        assert_eq!(p.for_shape(640, 640, 480).batch, 40);
        // the square itself: the plan's own batch
        let sq = p.for_shape(640, 640, 640);
        assert_eq!((sq.batch, sq.square_equivalent), (30, 30));
        // a sliver never goes past max_batch
        assert_eq!(p.for_shape(640, 640, 32).batch, 256);
    }

    #[test]
    fn a_plan_capped_by_max_batch_stays_there_and_larger_inputs_shrink_it() {
        let p = plan(16, 16);
        assert_eq!(p.for_shape(640, 640, 384).batch, 16);
        assert_eq!(p.for_shape(640, 640, 384).square_equivalent, 10);
        // an input larger than the planned square (imgsz raised after planning): fewer pictures
        let big = p.for_shape(640, 1280, 1280);
        assert_eq!((big.batch, big.square_equivalent), (4, 16));
        // never below 1
        assert_eq!(plan(1, 8).for_shape(320, 640, 640).batch, 1);
    }

    #[test]
    fn a_shape_at_or_below_the_startup_batch_is_taken_unmeasured() {
        let p = plan(30, 256);
        let mut prober = AtShape { per_picture: 1, capacity: u64::MAX, calls: vec![] };
        // larger than the square: 640x1280 allows 15, below the startup 30
        let d = p.decide_shape(&mut prober, 640, 640, 1280, 30);
        assert_eq!((d.batch, d.verified_peak, d.tried.len()), (15, None, 0));
        // the square itself: its estimate is the startup batch, taken unmeasured
        let d = p.decide_shape(&mut prober, 640, 640, 640, 30);
        assert_eq!(d.batch, 30);
        assert!(prober.calls.is_empty());
    }

    #[test]
    fn on_host_memory_a_shape_never_runs_above_the_startup_batch() {
        for source in [MemorySource::HostMeminfo, MemorySource::IntegratedMeminfo] {
            let mut p = plan(30, 256);
            p.budget.source = source;
            let mut prober = AtShape { per_picture: 1, capacity: u64::MAX, calls: vec![] };
            // 640x384 estimates 50: kept at 30, nothing measured
            let d = p.decide_shape(&mut prober, 640, 640, 384, 30);
            assert_eq!((d.estimate.batch, d.batch, d.verified_peak, d.tried.len()), (50, 30, None, 0), "{source:?}");
            // below the startup batch the estimate still holds
            assert_eq!(p.decide_shape(&mut prober, 640, 640, 1280, 30).batch, 15);
            assert!(prober.calls.is_empty(), "{source:?}: {:?}", prober.calls);
        }
    }

    #[test]
    fn a_shape_above_the_startup_batch_is_measured_then_halved_toward_it() {
        // the budget of test_plan is 0.8 x 1 GiB
        let p = plan(30, 256);
        let budget = p.budget.bytes;
        // 640x384 estimates 50; 50 pictures fit: taken, measured
        let mut fits = AtShape { per_picture: budget / 60, capacity: u64::MAX, calls: vec![] };
        let d = p.decide_shape(&mut fits, 640, 640, 384, 30);
        assert_eq!((d.estimate.batch, d.batch, fits.calls.clone()), (50, 50, vec![50]));
        assert_eq!(d.verified_peak, Some(50 * (budget / 60)));
        // 50 over the budget, 40 within: 40
        let mut tight = AtShape { per_picture: budget / 45, capacity: u64::MAX, calls: vec![] };
        let d = p.decide_shape(&mut tight, 640, 640, 384, 30);
        assert_eq!((d.batch, tight.calls.clone()), (40, vec![50, 40]));
        assert!(d.tried[0].peak.unwrap() > budget && d.tried[0].error.is_none());
        // neither fits (the second out of memory): the startup batch, not measured again
        let mut oom = AtShape { per_picture: budget / 35, capacity: budget, calls: vec![] };
        let d = p.decide_shape(&mut oom, 640, 640, 384, 30);
        assert_eq!((d.batch, d.verified_peak), (30, None));
        assert_eq!(oom.calls, vec![50, 40]);
        assert!(d.tried.iter().all(|t| t.peak.is_none() && t.error.as_deref() == Some("out of memory")));
    }
}
