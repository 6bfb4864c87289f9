//! The planner on synthetic probers: every rule of the search and the memory model, on the CPU.

use super::probe::STAGE_PASSES;
use super::search::MAX_VERIFIES;
use super::*;
use crate::backend::devmem::{DeviceMemory, Limit, MemorySource};
use crate::detector::Detector;

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
    let mem = DeviceMemory { free, total: free * 2, source: MemorySource::HostMeminfo, limit: Limit::Meminfo("MemAvailable") };
    (Budget::new(mem, &cfg), cfg)
}

#[test]
fn budget_is_min_of_free_and_limit_times_fraction() {
    let (b, _) = budget(10_000 * M, Some(4096 * M));
    assert_eq!(b.bytes, (4096.0 * M as f64 * 0.8) as u64);
    assert_eq!(b.limit, "config:memory_limit");
    let (b, _) = budget(1000 * M, Some(4096 * M));
    assert_eq!(b.bytes, 800 * M);
    assert_eq!(b.limit, "meminfo:MemAvailable");
    let (b, _) = budget(1000 * M, None);
    assert_eq!(b.bytes, 800 * M);
    assert_eq!(b.limit, "meminfo:MemAvailable");
}

/// The whole path from what the box reports to the plan's budget: a service capped by systemd
/// at 3 GiB with 1 GiB in use plans against 2 GiB, names the cgroup limit, and a tighter
/// `memory_limit` from the config takes over.
#[test]
fn budget_from_a_cgroup_capped_host_names_the_binding_limit() {
    use crate::backend::devmem::{DeviceReport, SysRoot};
    let dir = tempfile::tempdir().unwrap();
    let g = 1u64 << 30;
    crate::backend::hostmem::fixtures::capped_service(dir.path());
    let root = SysRoot::under(dir.path());
    for report in [DeviceReport::Cpu, DeviceReport::IntegratedGpu] {
        let mem = crate::backend::hostmem::device_memory_at(&root, report).unwrap();
        let cfg = PlannerConfig { memory_fraction: 0.5, ..Default::default() };
        let b = Budget::new(mem.clone(), &cfg);
        assert_eq!((b.free, b.total, b.bytes), (2 * g, 3 * g, g));
        assert_eq!(b.limit, "cgroup:/system.slice/yolo-edge.service memory.max");
        let cfg = PlannerConfig { memory_limit: Some(g), memory_fraction: 0.5, ..Default::default() };
        let b = Budget::new(mem, &cfg);
        assert_eq!((b.bytes, b.limit.as_str()), (g / 2, "config:memory_limit"));
    }
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
    // yolov9s 16 GiB with the arena (measured): batch 2 read high in that process
    let f = MemoryFit::fit(&[(1, 32 * M), (2, 76 * M), (4, 124 * M), (256, 7900 * M)]).unwrap();
    assert!(f.fixed > 10.0 * M as f64, "the envelope line is raised over batch 2");
    assert_eq!(
        f.predict(1),
        32 * M,
        "a measured batch predicts its own reading (the line says {} MiB)",
        (f.fixed + f.per_image) as u64 / M
    );
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
    // yolov9s at 16 GiB (measured): batch 2 read 76 MiB where its neighbours'
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

/// A device whose memory grows with the batch except over a band of batches that need `extra`
/// more (a cuDNN algorithm with a large workspace at those shapes, as yolov9m's batch 8).
struct Band {
    fixed: u64,
    per: u64,
    band: std::ops::RangeInclusive<usize>,
    extra: u64,
    calls: Vec<usize>,
}
impl Prober for Band {
    fn peak_at(&mut self, b: usize) -> Result<u64, ProbeError> {
        self.calls.push(b);
        Ok(self.fixed + self.per * b as u64 + if self.band.contains(&b) { self.extra } else { 0 })
    }
}

#[test]
fn measures_every_graph_rung_below_the_chosen_batch() {
    // yolov9m on the H200 under 4 GiB (2026-12-05): 4 -> 208 MiB, 8 -> 536 MiB, 60 -> 2636 MiB
    let (b, cfg) = budget(100_000 * M, Some(4096 * M)); // budget 3276.8 MiB
    let band = || Band { fixed: 20 * M, per: 46 * M, band: 5..=12, extra: 150 * M, calls: vec![] };
    let mut plain = band();
    let without = plan(&mut plain, b.clone(), &cfg).unwrap();
    let mut laddered = band();
    let with = plan(&mut laddered, b.clone(), &PlannerConfig { rungs: true, ..cfg }).unwrap();
    // the decision does not change; the rungs below it are measured after it, each once
    assert_eq!(with.batch, without.batch);
    assert_eq!(with.batch, 70);
    assert_eq!(&laddered.calls[..plain.calls.len()], &plain.calls[..]);
    assert_eq!(&laddered.calls[plain.calls.len()..], &[8, 16, 32, 64]);
    let rungs: Vec<&Step> = with.steps.iter().filter(|s| s.purpose == "rung").collect();
    assert_eq!(rungs.iter().map(|s| s.batch).collect::<Vec<_>>(), vec![8, 16, 32, 64]);
    assert!(rungs.iter().all(|s| s.outcome == "ok" && s.predicted.is_some()));
    // every rung is now predicted from its own reading; without them, batch 8 read 25 % above
    // the line between its neighbours
    let truth = |n: usize| 20 * M + 46 * M * n as u64 + if (5..=12).contains(&n) { 150 * M } else { 0 };
    for r in [1, 2, 4, 8, 16, 32, 64, 70] {
        assert_eq!(with.fit.predict(r), truth(r), "rung {r}");
    }
    let off = |p: u64, t: u64| (p as f64 - t as f64).abs() / t as f64;
    assert!(off(without.fit.predict(8), truth(8)) > 0.2, "{}", without.fit.predict(8) / M);
    assert!(with.reasons.iter().any(|r| r.contains("graph rungs [8, 16, 32, 64] measured")), "{:?}", with.reasons);
}

#[test]
fn a_rung_over_the_budget_is_reported_and_the_decision_stands() {
    // a band around batch 16 that needs more than the whole budget, which probes at 1, 2, 4 and
    // a verification at the chosen batch never see
    let (b, cfg) = budget(100_000 * M, Some(4096 * M));
    let mut p = Band { fixed: 20 * M, per: 46 * M, band: 13..=20, extra: 4096 * M, calls: vec![] };
    let with = plan(&mut p, b.clone(), &PlannerConfig { rungs: true, ..cfg }).unwrap();
    assert_eq!(with.batch, 70);
    assert!(with.verified_peak <= b.bytes);
    let s16 = with.steps.iter().find(|s| s.purpose == "rung" && s.batch == 16).expect("rung 16 measured");
    assert_eq!(s16.outcome, "over budget");
    assert!(with.reasons.iter().any(|r| r.contains("graph rung 16") && r.contains("over the budget")), "{:?}", with.reasons);
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
    // measured on a GPU in the agent: probes 0, 32, 96 MiB at 1, 2, 4 (slope 32 MiB)
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
    let _memory = crate::process_memory_test_lock();
    use crate::model::{BuildOptions, Variant, YoloV9};
    let ck = crate::model::random::random_checkpoint(Variant::T, 0).unwrap();
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
