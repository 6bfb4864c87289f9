//! The pass's memory arena: the device pool grown up front to the planned footprint of one
//! batch, so that what the process holds is what the planner predicted.
//!
//! Why: the tensors of a forward pass need exactly `fixed + per_image x batch` bytes at their
//! peak (the pool's *used* high-water mark is linear in the batch to the byte on the H200), but a
//! pool that grows on demand maps 32 MiB granules wherever the allocation order leaves holes, and
//! reserves 1.1-1.7x that, differently at every batch size. Growing the pool once by one
//! allocation of the planned size (and freeing it at once: the pool keeps it, see
//! [`crate::devmem::PeakMeter::hold_reserved`]) lets the pass carve its tensors out of one region, and makes the
//! footprint a number the planner chose. Whether the pass needed more is still measured (the
//! reserved high-water mark over the pass): the arena is a floor, never a cap.
//!
//! `YOLO_EDGE_ARENA`: the headroom over the tensors' own peak as a fraction (`0.1` = 10 %), or
//! `off` for the pool's on-demand growth (the A/B baseline).

use crate::planner::MemoryFit;

/// The pool's mapping granule on CUDA (every reserved figure on the H200 is a multiple of it).
pub const GRANULE: u64 = 32 << 20;

/// Headroom used when `YOLO_EDGE_ARENA` is not set.
pub const DEFAULT_MARGIN: f64 = 0.1;

/// How the arena is sized: the tensors' peak plus `margin` of it, rounded up to a granule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ArenaPolicy {
    pub margin: f64,
}

impl ArenaPolicy {
    /// From `YOLO_EDGE_ARENA` (`None`: off). A value that does not parse is reported and the
    /// default used, so a typo cannot silently change the memory figures.
    pub fn from_env() -> Option<Self> {
        Self::parse(std::env::var("YOLO_EDGE_ARENA").ok().as_deref())
    }

    pub fn parse(v: Option<&str>) -> Option<Self> {
        match v.map(str::trim) {
            None | Some("") => Some(Self { margin: DEFAULT_MARGIN }),
            Some("off" | "none") => None,
            Some(s) => match s.parse::<f64>() {
                Ok(m) if m.is_finite() && (0.0..=4.0).contains(&m) => Some(Self { margin: m }),
                _ => {
                    tracing::warn!(value = s, default = DEFAULT_MARGIN, "YOLO_EDGE_ARENA is not a fraction in 0..=4 or `off`; using the default");
                    Some(Self { margin: DEFAULT_MARGIN })
                }
            },
        }
    }

    /// Arena bytes for a pass whose tensors peak at `used` bytes.
    pub fn size(&self, used: u64) -> u64 {
        let want = (used as f64 * (1.0 + self.margin)).ceil() as u64;
        want.div_ceil(GRANULE) * GRANULE
    }
}

/// The agent's arena: the policy and the planner's fit of the tensors' own peak per batch.
#[derive(Debug, Clone)]
pub struct ArenaPlan {
    pub policy: ArenaPolicy,
    pub used: MemoryFit,
}

impl ArenaPlan {
    /// Arena bytes for passes at `batch`.
    pub fn bytes(&self, batch: usize) -> u64 {
        self.policy.size(self.used.predict(batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_setting() {
        assert_eq!(ArenaPolicy::parse(None), Some(ArenaPolicy { margin: DEFAULT_MARGIN }));
        assert_eq!(ArenaPolicy::parse(Some("off")), None);
        assert_eq!(ArenaPolicy::parse(Some(" 0.05 ")), Some(ArenaPolicy { margin: 0.05 }));
        assert_eq!(ArenaPolicy::parse(Some("0")), Some(ArenaPolicy { margin: 0.0 }));
        // nonsense falls back to the default instead of to something surprising
        assert_eq!(ArenaPolicy::parse(Some("-1")), Some(ArenaPolicy { margin: DEFAULT_MARGIN }));
        assert_eq!(ArenaPolicy::parse(Some("lots")), Some(ArenaPolicy { margin: DEFAULT_MARGIN }));
    }

    #[test]
    fn sizes_round_up_to_whole_granules() {
        let p = ArenaPolicy { margin: 0.1 };
        assert_eq!(p.size(0), 0);
        assert_eq!(p.size(1), GRANULE);
        // 300 MiB + 10 % = 330 MiB -> 11 granules (352 MiB)
        assert_eq!(p.size(300 << 20), 11 * GRANULE);
        let exact = ArenaPolicy { margin: 0.0 };
        assert_eq!(exact.size(10 * GRANULE), 10 * GRANULE);
        assert_eq!(exact.size(10 * GRANULE + 1), 11 * GRANULE);
    }
}
