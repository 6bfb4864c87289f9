//! `yolo-edge plan`: picks the batch size from the device's memory and explains the decision
//! (budget, fixed and per-image cost, predicted vs verified peak, chosen batch), as text or JSON.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::Args;

use yolo_edge::backend::device;
use yolo_edge::backend::devmem::{self, PeakMeter};
use yolo_edge::detector::warmup as startup;
use yolo_edge::planner::{self, Budget, DetectorProber, MemoryTelemetry, PlannerConfig, MIB};

#[derive(Args)]
pub struct PlanArgs {
    /// Checkpoint (.pt/.safetensors) or `random:yolov9t|s|m|c|e`.
    #[arg(long)]
    model: String,
    #[arg(long, default_value = "auto")]
    device: String,
    #[arg(long, default_value = "auto")]
    dtype: String,
    #[arg(long, default_value_t = 640, value_parser = super::common::parse_imgsz)]
    imgsz: usize,
    /// Cap below the device's free memory, e.g. 8GiB.
    #[arg(long)]
    memory_limit: Option<yolo_edge::units::ByteSize>,
    #[arg(long, default_value_t = 0.8)]
    memory_fraction: f64,
    #[arg(long, default_value_t = 256)]
    max_batch: usize,
    /// Batches measured to fit the memory model.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    probe_batches: Vec<usize>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// After planning, measure the peak at batches 1, 2, 3, 4, 6, 8, 12, ... up to the first
    /// one over the budget (refined by bisection), and compare each with the prediction: how
    /// good the memory model is, and the largest batch that really fits.
    #[arg(long)]
    sweep: bool,
    /// With --sweep, measure every batch whose first reading is under 1 GiB this many times in
    /// all (each from a trimmed pool): how repeatable the pool's reservation is where a few
    /// 32 MiB granules are a large share of it.
    #[arg(long, default_value_t = 1)]
    sweep_repeats: usize,
    /// After planning, run this many forward passes at the chosen batch and count
    /// out-of-memory errors (a soak test of the decision).
    #[arg(long, default_value_t = 0)]
    soak: usize,
    /// Stop the soak after this many seconds even if fewer passes ran.
    #[arg(long, default_value_t = 120.0)]
    soak_seconds: f64,
    /// After planning, the batch the agent takes at each of these input shapes (WxH, e.g.
    /// 640x384 for 16:9 pictures at imgsz 640): the plan scaled by the shape's pixels, measured
    /// where that is above the planned batch, and the taken batch's measured peak against its
    /// prediction.
    #[arg(long, value_delimiter = ',', value_parser = super::common::parse_input_shape)]
    shapes: Vec<(usize, usize)>,
    #[command(flatten)]
    tuning: super::common::TuningArgs,
}

/// `--shapes`: one input shape's batch as the agent decides it, and the taken batch measured.
#[derive(serde::Serialize)]
struct ShapeReport {
    #[serde(flatten)]
    decision: planner::ShapeDecision,
    /// The taken batch's measured peak (the decision's own measurement where it made one).
    measured: Option<u64>,
    /// (estimate's predicted peak - measured) / measured, where the taken batch is the estimate.
    error: Option<f64>,
    within_budget: Option<bool>,
    /// Measured bytes per picture at this shape.
    per_picture: Option<f64>,
}

fn shapes(det: &yolo_edge::detector::Detector, plan: &planner::Plan, shapes: &[(usize, usize)]) -> Vec<ShapeReport> {
    let side = det.imgsz() as u32;
    shapes
        .iter()
        .map(|&(w, h)| {
            let (w, h) = (w as u32, h as u32);
            let mut prober = DetectorProber::at_shape(det, w, h);
            let decision = plan.decide_shape(&mut prober, side, w, h, plan.batch);
            let measured = decision.verified_peak.or_else(|| prober.measure(decision.batch).ok().map(|p| p.reserved));
            let error = measured
                .filter(|_| decision.batch == decision.estimate.batch)
                .map(|m| (decision.estimate.predicted_peak as f64 - m as f64) / m as f64);
            ShapeReport {
                within_budget: measured.map(|m| m <= plan.budget.bytes),
                per_picture: measured.map(|m| m as f64 / decision.batch as f64),
                measured,
                error,
                decision,
            }
        })
        .collect()
}

/// One measured point of `--sweep`.
#[derive(serde::Serialize)]
struct SweepPoint {
    batch: usize,
    /// the pictures its pass runs, padding included: the ladder's rung with graphs on
    runs_as: usize,
    /// the plan's prediction for `runs_as` pictures
    predicted: u64,
    measured: Option<u64>,
    /// (predicted - measured) / measured
    error: Option<f64>,
    /// the used high-water mark of the same passes (tensors only, no pool granules)
    measured_used: Option<u64>,
    /// further readings of the same batch (`--sweep-repeats`), each from a trimmed pool
    repeats: Vec<u64>,
    /// (largest - smallest) / smallest reading of this batch
    spread: Option<f64>,
    fits: bool,
    oom: bool,
}

/// `--sweep`: measured vs predicted peaks, and the largest batch that fits the budget.
#[derive(serde::Serialize)]
struct Sweep {
    points: Vec<SweepPoint>,
    largest_fitting: usize,
    /// chosen batch / largest fitting batch
    chosen_share: f64,
    /// worst |error| over the batches up to the chosen one
    worst_error_to_chosen: f64,
}

/// Each batch runs as the agent runs it after this plan (`det`'s ladder of graphs up to the chosen
/// batch, set by the caller): a partial batch on the next rung, whose prediction it is compared
/// with.
fn sweep(det: &yolo_edge::detector::Detector, plan: &planner::Plan, repeats: usize) -> Sweep {
    let prober = DetectorProber::new(det);
    let budget = plan.budget.bytes;
    let mut points: Vec<SweepPoint> = Vec::new();
    let measure = |b: usize, points: &mut Vec<SweepPoint>| -> bool {
        let runs_as = det.runs_as(b);
        let predicted = plan.fit.predict(runs_as);
        let r = prober.measure(b);
        let (measured, measured_used, oom) = match &r {
            Ok(p) => (Some(p.reserved), Some(p.used), false),
            Err(_) => (None, None, true),
        };
        let fits = measured.is_some_and(|m| m <= budget);
        let error = measured.map(|m| (predicted as f64 - m as f64) / m as f64);
        let again: Vec<u64> = match measured {
            Some(m) if m < 1 << 30 => (1..repeats).filter_map(|_| prober.measure(b).ok().map(|p| p.reserved)).collect(),
            _ => Vec::new(),
        };
        let spread = measured.filter(|_| !again.is_empty()).map(|m| {
            let (lo, hi) = again.iter().fold((m, m), |(lo, hi), &r| (lo.min(r), hi.max(r)));
            (hi - lo) as f64 / lo.max(1) as f64
        });
        points.push(SweepPoint { batch: b, runs_as, predicted, measured, error, measured_used, repeats: again, spread, fits, oom });
        fits
    };
    // geometric-ish ladder, then bisection between the last fitting and the first failing batch
    let mut ladder: Vec<usize> = vec![1, 2, 3, 4];
    while *ladder.last().unwrap() < plan.max_batch {
        let l = *ladder.last().unwrap();
        ladder.push((l + l / 2).min(plan.max_batch));
    }
    ladder.push(plan.batch);
    ladder.sort();
    ladder.dedup();
    let (mut ok, mut bad) = (0usize, None);
    for b in ladder {
        if measure(b, &mut points) {
            ok = b;
        } else {
            bad = Some(b);
            break;
        }
    }
    if let Some(mut hi) = bad {
        let mut lo = ok;
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if measure(mid, &mut points) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        ok = lo;
    }
    points.sort_by_key(|p| p.batch);
    let worst = points.iter().filter(|p| p.batch <= plan.batch).filter_map(|p| p.error).fold(0.0f64, |a, e| a.max(e.abs()));
    Sweep {
        largest_fitting: ok,
        chosen_share: if ok > 0 { plan.batch as f64 / ok as f64 } else { 0.0 },
        worst_error_to_chosen: worst,
        points,
    }
}

/// `--soak`: batches at the chosen size through the agent's path. With `--memory-limit` on a
/// GPU that has more free memory than the limit, the rest is taken first by a ballast
/// allocation, so that the soak runs with only the limit free, as on the emulated box.
fn soak(
    det: &yolo_edge::detector::Detector,
    batch: usize,
    n: usize,
    max_s: f64,
    limit: Option<u64>,
) -> anyhow::Result<(planner::Soak, u64)> {
    let dev = det.device();
    let mut ballast_bytes = 0u64;
    let ballast = match (limit, dev.is_cuda()) {
        (Some(limit), true) => {
            let free = devmem::device_memory(dev)?.free;
            ballast_bytes = free.saturating_sub(limit);
            (ballast_bytes > 0).then(|| candle_core::Tensor::zeros(ballast_bytes as usize, candle_core::DType::U8, dev)).transpose()?
        }
        _ => None,
    };
    let r = DetectorProber::new(det).soak(batch, n, max_s).map_err(|e| anyhow::anyhow!("soak: {e:?}"));
    drop(ballast);
    Ok((r?, ballast_bytes))
}

pub fn run(a: PlanArgs) -> anyhow::Result<ExitCode> {
    a.tuning.install()?;
    let cfg = PlannerConfig {
        memory_limit: a.memory_limit.map(|b| b.0),
        memory_fraction: a.memory_fraction,
        max_batch: a.max_batch,
        probe_batches: a.probe_batches.clone(),
        rungs: false,
    };
    cfg.validate()?;
    if let Some(&(w, h)) = a.shapes.iter().find(|&&(w, h)| w.max(h) > a.imgsz) {
        anyhow::bail!("--shapes {w}x{h} is larger than --imgsz {}: a letterbox at that size makes none", a.imgsz);
    }
    yolo_edge::env::configure_compute_cache();
    let dev = device::parse_device(&a.device)?;
    let dtype = device::parse_dtype(&a.dtype, &dev)?;
    let t0 = Instant::now();
    let (name, det) = super::common::load_detector(&a.model, &dev, dtype, a.imgsz, a.seed)?;
    let st = startup::warm_up(&det, t0.elapsed().as_secs_f64() * 1e3).context("first forward pass")?;
    // the budget is what is free with the model loaded and its kernels warm
    let meter = PeakMeter::new(&dev);
    meter.trim()?;
    let mem = devmem::device_memory(&dev)?;
    let budget = Budget::new(mem, &cfg);
    let t1 = Instant::now();
    // measured as the agent runs its passes: on CUDA, replayed graphs (`--cuda-graphs off`: eager)
    det.use_graphs(true);
    // as the agent plans: every rung of the graph ladder measured where passes replay graphs
    let cfg = PlannerConfig { rungs: det.replays_graphs(), ..cfg };
    let plan = planner::plan(&mut DetectorProber::new(&det), budget, &cfg)?;
    let plan_ms = t1.elapsed().as_secs_f64() * 1e3;
    let telemetry = MemoryTelemetry::new(&plan, devmem::device_memory(&dev)?, meter.usage()?);
    // the sweep and the soak run the agent's path as the agent does after its plan: a ladder of
    // graphs up to the planned batch
    det.set_graph_ladder(plan.batch);
    let sw = a.sweep.then(|| sweep(&det, &plan, a.sweep_repeats.max(1)));
    let limit = cfg.memory_limit;
    let soaked = if a.soak > 0 { Some(soak(&det, plan.batch, a.soak, a.soak_seconds, limit)?) } else { None };
    let shaped = shapes(&det, &plan, &a.shapes);
    let soak_json = soaked.as_ref().map(|(k, ballast)| {
        serde_json::json!({"batch": k.batch, "passes": k.passes, "oom": k.oom, "seconds": k.seconds, "peak": k.peak,
            "within_budget": k.peak <= plan.budget.bytes, "ballast": ballast, "stages": k.stages})
    });
    if a.json {
        let v = serde_json::json!({"model": name, "device": device::device_name(&dev), "dtype": device::dtype_name(dtype), "imgsz": a.imgsz, "config": cfg, "plan": plan, "telemetry": telemetry, "startup": st, "plan_ms": plan_ms, "sweep": sw, "soak": soak_json, "shapes": shaped});
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("model        {name} on {} in {} at {}x{}", device::device_name(&dev), device::dtype_name(dtype), a.imgsz, a.imgsz);
        println!(
            "budget       {:.1} MiB (free {:.1} MiB of {:.1} MiB, {:?}, bound by {}; limit {}; fraction {})",
            plan.budget.bytes as f64 / MIB,
            plan.budget.free as f64 / MIB,
            plan.budget.total as f64 / MIB,
            plan.budget.source,
            plan.budget.limit,
            cfg.memory_limit.map_or("none".into(), |l| format!("{:.1} MiB", l as f64 / MIB)),
            cfg.memory_fraction
        );
        println!("memory model {:.1} MiB fixed + {:.2} MiB per image", plan.fit.fixed / MIB, plan.fit.per_image / MIB);
        println!(
            "batch        {} (max {}): predicted peak {:.1} MiB, verified {:.1} MiB",
            plan.batch,
            plan.max_batch,
            plan.predicted_peak as f64 / MIB,
            plan.verified_peak as f64 / MIB
        );
        println!("steps");
        for s in &plan.steps {
            println!(
                "  {:>6} batch {:>4}: predicted {:>9} measured {:>9}  {}",
                s.purpose,
                s.batch,
                s.predicted.map_or("-".into(), |p| format!("{:.1}", p as f64 / MIB)),
                s.measured.map_or("-".into(), |p| format!("{:.1}", p as f64 / MIB)),
                s.outcome
            );
        }
        println!("reasons");
        for r in &plan.reasons {
            println!("  - {r}");
        }
        if let Some(sw) = &sw {
            println!("sweep (budget {:.1} MiB)", plan.budget.bytes as f64 / MIB);
            for p in &sw.points {
                let rung = if p.runs_as != p.batch { format!(" (runs as {})", p.runs_as) } else { String::new() };
                println!(
                    "  batch {:>4}{rung}: predicted {:>9.1} measured {:>9} error {:>7}  {}",
                    p.batch,
                    p.predicted as f64 / MIB,
                    p.measured.map_or("-".into(), |m| format!("{:.1}", m as f64 / MIB)),
                    p.error.map_or("-".into(), |e| format!("{:+.1}%", e * 100.0)),
                    if p.oom {
                        "out of memory"
                    } else if p.fits {
                        "fits"
                    } else {
                        "over budget"
                    }
                );
            }
            println!(
                "  largest batch that fits: {} (chosen {} = {:.0}%); worst error up to the chosen batch {:.1}%",
                sw.largest_fitting,
                plan.batch,
                sw.chosen_share * 100.0,
                sw.worst_error_to_chosen * 100.0
            );
        }
        for r in &shaped {
            let d = &r.decision;
            let mib = |b: Option<u64>| b.map_or("-".into(), |b| format!("{:.1} MiB", b as f64 / MIB));
            println!(
                "shape        {}x{} ({:.2} of the square): estimate {} (as {} square, predicted {:.1} MiB), taken {}, measured {}{}{}",
                d.estimate.width,
                d.estimate.height,
                d.estimate.area_ratio,
                d.estimate.batch,
                d.estimate.square_equivalent,
                d.estimate.predicted_peak as f64 / MIB,
                d.batch,
                mib(r.measured),
                r.error.map_or(String::new(), |e| format!(" (prediction {:+.1}%)", e * 100.0)),
                if r.within_budget == Some(false) { ", OVER the budget" } else { "" }
            );
            for t in &d.tried {
                println!("  tried batch {:>4}: {}", t.batch, t.error.clone().unwrap_or_else(|| mib(t.peak)));
            }
        }
        if let Some((k, ballast)) = &soaked {
            let held = if *ballast > 0 {
                format!(", {:.0} MiB held by a ballast so that only the limit is free", *ballast as f64 / MIB)
            } else {
                String::new()
            };
            println!(
                "soak         {} passes at batch {} in {:.1} s: {} out of memory; peak {:.1} MiB ({} the budget of {:.1} MiB){held}",
                k.passes,
                k.batch,
                k.seconds,
                k.oom,
                k.peak as f64 / MIB,
                if k.peak <= plan.budget.bytes { "within" } else { "OVER" },
                plan.budget.bytes as f64 / MIB
            );
            let s = &k.stages;
            println!(
                "  one batch, stage by stage (median of {}): pictures to input {:.1} ms, network {:.1} ms, candidates to the host {:.1} ms",
                s.batches, s.upload_ms, s.model_ms, s.candidates_ms
            );
        }
        println!(
            "planned in {plan_ms:.0} ms (startup: load {:.0} ms, first forward {:.1} ms, second {:.1} ms)",
            st.load_ms, st.first_forward_ms, st.second_forward_ms
        );
    }
    Ok(ExitCode::SUCCESS)
}
