//! The memory model: a batch's peak predicted from measured peaks (each measured batch
//! predicts its own reading, straight lines between measured batches, the per-image cost
//! beyond).

use serde::Serialize;

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
    /// pool alone (`[tuning] allocator = "pool"`), a peak that read low because the pool happened
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
                // batches is fragmentation noise: 131 -> 136 read +736 MiB on a data-centre GPU)
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
    /// The readings repeat exactly with the activation arena (`crate::backend::arena`: the same batch read
    /// the same bytes every time; BENCHMARKS.md), so they are the best prediction there is at
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
