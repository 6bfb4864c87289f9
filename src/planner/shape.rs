//! The plan at another input shape. The planner measures batches of `imgsz x imgsz` pictures,
//! the largest input a letterbox makes at `imgsz`; a rect letterbox feeds smaller ones (a 16:9
//! picture at 640 runs at 640x384). A batch's memory above the resident model is its
//! activations (and, on host memory, the pictures the pipeline holds), all of which scale with
//! the input's pixels: `b` pictures of `w x h` cost what `ceil(b x w x h / imgsz²)` square ones
//! do. So a plan made at the square gives every shape an estimate of its batch: the largest `b`
//! whose square equivalent is at most the planned batch, capped by `max_batch`. Memory is not
//! in proportion to pixels everywhere, so the agent measures an estimate above the planned
//! batch before it runs it (`agent::pipeline`; BENCHMARKS.md "Batches per input shape").

use serde::Serialize;

use super::Plan;

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

/// `ceil(batch x area_ratio)`, at least 1; the small tolerance keeps a ratio that is exactly
/// `k / batch` from rounding up past `k` in floating point.
fn square_equivalent(batch: usize, area_ratio: f64) -> usize {
    ((batch as f64 * area_ratio - 1e-9).ceil() as usize).max(1)
}

/// A plan of `batch` (of `max_batch`) at the square, for tests: peaks 30, 50 and 90 MiB measured
/// at batches 1, 2 and 4.
#[cfg(test)]
pub(crate) fn test_plan(batch: usize, max_batch: usize) -> Plan {
    use crate::backend::devmem::{DeviceMemory, Limit, MemorySource};
    use crate::planner::{Budget, MemoryFit, PlannerConfig};
    let fit = MemoryFit::fit(&[(1, 30 << 20), (2, 50 << 20), (4, 90 << 20)]).expect("three points fit");
    let mem = DeviceMemory { free: 1 << 30, total: 2 << 30, source: MemorySource::HostMeminfo, limit: Limit::Meminfo("MemAvailable") };
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
}
