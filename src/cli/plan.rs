//! `yolo-edge plan`: picks the batch size from the device's memory and explains the decision
//! (budget, fixed and per-image cost, predicted vs verified peak, chosen batch), as text or JSON.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::Args;

use yolo_edge::devmem::{self, PeakMeter};
use yolo_edge::planner::{self, Budget, DetectorProber, MemoryTelemetry, PlannerConfig, MIB};
use yolo_edge::{device, startup};

#[derive(Args)]
pub struct PlanArgs {
    /// Checkpoint (.pt/.safetensors) or `random:yolov9t|s|m|c|e`.
    #[arg(long)]
    model: String,
    #[arg(long, default_value = "auto")]
    device: String,
    #[arg(long, default_value = "auto")]
    dtype: String,
    #[arg(long, default_value_t = 640)]
    imgsz: usize,
    /// Cap below the device's free memory, e.g. 8GiB.
    #[arg(long)]
    memory_limit: Option<String>,
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
}

pub fn run(a: PlanArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(a.imgsz > 0 && a.imgsz % 32 == 0, "--imgsz must be a positive multiple of 32");
    let cfg = PlannerConfig {
        memory_limit: a.memory_limit.as_deref().map(planner::parse_bytes).transpose()?,
        memory_fraction: a.memory_fraction,
        max_batch: a.max_batch,
        probe_batches: a.probe_batches.clone(),
    };
    cfg.validate()?;
    startup::configure_compute_cache();
    let dev = device::parse_device(&a.device)?;
    let dtype = device::parse_dtype(&a.dtype, &dev)?;
    let t0 = Instant::now();
    let (name, det) = super::bench::load(&a.model, &dev, dtype, a.imgsz, a.seed)?;
    let st = startup::warm_up(&det, t0.elapsed().as_secs_f64() * 1e3).context("first forward pass")?;
    // the budget is what is free with the model loaded and its kernels warm
    let meter = PeakMeter::new(&dev);
    meter.trim()?;
    let mem = devmem::device_memory(&dev)?;
    let budget = Budget::new(mem, &cfg);
    let t1 = Instant::now();
    let plan = planner::plan(&mut DetectorProber::new(&det), budget, &cfg)?;
    let plan_ms = t1.elapsed().as_secs_f64() * 1e3;
    let telemetry = MemoryTelemetry::new(&plan, devmem::device_memory(&dev)?, meter.usage()?);
    if a.json {
        let v = serde_json::json!({"model": name, "device": device::device_name(&dev), "dtype": device::dtype_name(dtype), "imgsz": a.imgsz, "config": cfg, "plan": plan, "telemetry": telemetry, "startup": st, "plan_ms": plan_ms});
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("model        {name} on {} in {} at {}x{}", device::device_name(&dev), device::dtype_name(dtype), a.imgsz, a.imgsz);
        println!("budget       {:.1} MiB (free {:.1} MiB of {:.1} MiB, {:?}; limit {}; fraction {})", plan.budget.bytes as f64 / MIB, plan.budget.free as f64 / MIB, plan.budget.total as f64 / MIB, plan.budget.source, cfg.memory_limit.map_or("none".into(), |l| format!("{:.1} MiB", l as f64 / MIB)), cfg.memory_fraction);
        println!("memory model {:.1} MiB fixed + {:.2} MiB per image", plan.fit.fixed / MIB, plan.fit.per_image / MIB);
        println!("batch        {} (max {}): predicted peak {:.1} MiB, verified {:.1} MiB", plan.batch, plan.max_batch, plan.predicted_peak as f64 / MIB, plan.verified_peak as f64 / MIB);
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
        println!("planned in {plan_ms:.0} ms (startup: load {:.0} ms, first forward {:.1} ms, second {:.1} ms)", st.load_ms, st.first_forward_ms, st.second_forward_ms);
    }
    Ok(ExitCode::SUCCESS)
}
