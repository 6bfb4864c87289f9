//! `yolo-edge bench`: throughput, latency and peak device memory against batch size, model only
//! (a normalised batch tensor on the device in, the raw output read where the pass leaves it, the
//! device synchronised before the clock stops: as PyTorch's `model(x)` is timed) and end
//! to end (JPEG files in, detections out), per model and dtype; OOM is a table entry, not a
//! crash. Writes bench.md, bench.csv, bench.json and bench.png into `--out` (bench.csv and
//! bench.json after every row, so that a run cut short keeps the rows it finished).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use candle_core::Tensor;
use clap::Args;
use rayon::prelude::*;

use super::common;
use yolo_edge::backend::device;
use yolo_edge::backend::devmem::{self, PeakMeter};
use yolo_edge::bench::report::{self, E2eCost, Row, Status};
use yolo_edge::detector::warmup as startup;
use yolo_edge::detector::Detector;
use yolo_edge::vision::feed::{self, Feed, FeedOptions, Picture, StageTimes};
use yolo_edge::vision::postprocess::Thresholds;
use yolo_edge::vision::preprocess;

#[derive(Args)]
pub struct BenchArgs {
    /// Checkpoints (.pt/.safetensors) or `random:yolov9t|s|m|c|e` (seeded random weights).
    #[arg(long, value_delimiter = ',')]
    model: Vec<String>,
    /// Shorthand for random-weight models: t,s,m,c,e.
    #[arg(long, value_delimiter = ',')]
    variants: Vec<String>,
    /// auto, cpu or cuda:N
    #[arg(long, default_value = "auto")]
    device: String,
    /// Comma-separated dtypes (f16, f32).
    #[arg(long, default_value = "f16")]
    dtype: String,
    /// Comma-separated batch sizes, or `auto` (powers of two up to --max-batch, until OOM).
    #[arg(long, default_value = "1,8,32")]
    batches: String,
    #[arg(long, default_value_t = 256)]
    max_batch: usize,
    /// model, e2e or both (comma-separated).
    #[arg(long, default_value = "model")]
    mode: String,
    /// Images for the end-to-end mode (files or folders; reused cyclically to fill a batch).
    #[arg(long, value_delimiter = ',')]
    images: Vec<PathBuf>,
    #[arg(long, default_value_t = 640, value_parser = super::common::parse_imgsz)]
    imgsz: usize,
    /// Model-mode input as WxH (multiples of 32, at most imgsz a side), e.g. 640x384 for the rect
    /// letterbox of a 16:9 frame; default imgsz x imgsz.
    #[arg(long, value_parser = super::common::parse_input_shape)]
    input: Option<(usize, usize)>,
    /// Untimed runs before timing each batch.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Timed runs per batch (p50 and p99 reported); fewer for large batches: max(3, min(iters,
    /// 1000 / batch)).
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Seed of random-weight models.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output folder.
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
    /// After timing each batch, one more pass with every convolution, epilogue, concat and
    /// upsample timed (on CUDA by events on the stream, without synchronising): where the time
    /// goes (stderr and OUT/profile.csv).
    #[arg(long)]
    profile: bool,
    /// How end-to-end pictures fit the network input: rect (the reference's `predict` default)
    /// or square.
    #[arg(long, default_value = "rect")]
    fit: preprocess::Fit,
    #[command(flatten)]
    jpeg: common::JpegArgs,
    /// Chart title (default: device and date-free description).
    #[arg(long)]
    title: Option<String>,
    #[command(flatten)]
    tuning: super::common::TuningArgs,
}

fn parse_batches(s: &str, max_batch: usize) -> anyhow::Result<Vec<usize>> {
    if s.trim() == "auto" {
        return Ok(std::iter::successors(Some(1usize), |b| b.checked_mul(2)).take_while(|&b| b <= max_batch).collect());
    }
    let mut v =
        s.split(',').map(|t| t.trim().parse::<usize>().with_context(|| format!("batch `{t}`"))).collect::<anyhow::Result<Vec<_>>>()?;
    anyhow::ensure!(v.iter().all(|&b| b >= 1), "batch sizes must be at least 1");
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

fn collect_images(inputs: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in inputs {
        if p.is_dir() {
            let mut v: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("reading {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| {
                    f.extension()
                        .and_then(|e| e.to_str())
                        .is_some_and(|e| matches!(e.to_ascii_lowercase().as_str(), "jpg" | "jpeg" | "png" | "bmp" | "webp"))
                })
                .collect();
            v.sort();
            out.extend(v);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// What one timed batch run needs.
enum Work<'a> {
    Model(Tensor),
    /// `prepared`: the time spent preparing the files ([`feed::prepare`]), summed over runs.
    E2e {
        files: Vec<&'a PathBuf>,
        th: Thresholds,
        feed: FeedOptions,
        prepared: std::cell::Cell<Duration>,
    },
}

/// Device memory in use outside this process's pool and arena (bytes), with the detector's
/// graphs dropped and the pool trimmed: libraries' own allocations. `None` off CUDA.
fn outside_allocator(det: &Detector, meter: &PeakMeter) -> Option<u64> {
    if !det.device().is_cuda() {
        return None;
    }
    det.drop_graphs();
    meter.trim().ok()?;
    let mem = devmem::device_memory(det.device()).ok()?;
    let reserved = meter.usage().ok()?.reserved;
    Some(mem.total.saturating_sub(mem.free).saturating_sub(reserved))
}

fn run_once(det: &Detector, w: &Work) -> candle_core::Result<usize> {
    match w {
        Work::Model(x) => {
            let n = det.forward_with(x, |y| y.dim(0))?;
            det.device().synchronize()?;
            Ok(n)
        }
        Work::E2e { files, th, feed, prepared } => {
            let t0 = Instant::now();
            // one batch alone, from the files to the detections: the latency a picture sees (one
            // file is read on this thread: handing it to the pool would only add a wake-up)
            let prepare = |p: &&PathBuf| feed::prepare(p, feed).0;
            let pictures: Result<Vec<Picture>, _> = match files.as_slice() {
                [one] => std::iter::once(one).map(prepare).collect(),
                _ => files.par_iter().map(prepare).collect(),
            };
            let pictures = pictures.map_err(|e| candle_core::Error::Msg(e.to_string()))?;
            prepared.set(prepared.get() + t0.elapsed());
            let refs: Vec<&Picture> = pictures.iter().collect();
            let mut n = 0;
            for d in det.detect_pictures(&refs, th, &feed.limits)? {
                n += d.map_err(|e| candle_core::Error::Msg(e.to_string()))?.len();
            }
            Ok(n)
        }
    }
}

/// One forward pass with per-operation timing (a replay of a graph captured for it where graphs
/// are on, else an eager pass); prints the table to stderr and appends it to `out/profile.csv`
/// (model, batch, op, calls, ms, share of the pass). The graphs captured before are dropped,
/// and so is the one captured here, before the events its nodes record.
fn profile_pass(det: &Detector, work: &Work, name: &str, batch: usize, out: &Path) -> candle_core::Result<()> {
    use yolo_edge::backend::profile;
    det.drop_graphs();
    det.device().synchronize()?;
    let pass = profile::DeviceTimer::new(det.device())?;
    profile::enable(det.device());
    let timed = (|| {
        if det.replays_graphs() {
            // the capture records each op's events as nodes of the graph, which every replay
            // records again: the profile is of the timed replay below
            run_once(det, work)?;
        }
        let t0 = Instant::now();
        pass.start()?;
        run_once(det, work)?;
        pass.mark_stop()?;
        Ok::<_, candle_core::Error>(t0)
    })();
    let profile = profile::take();
    let wall = timed.as_ref().map_or(0.0, |t0| t0.elapsed().as_secs_f64() * 1e3);
    let on_device = match &timed {
        Ok(_) => pass.read(),
        Err(_) => Ok(None),
    };
    det.drop_graphs();
    let ops = profile.into_ops();
    timed?;
    let on_device = on_device?;
    let total = on_device.unwrap_or(wall);
    let timed: f64 = ops.iter().map(|o| o.2).sum();
    match on_device {
        Some(d) => eprintln!("profile {name} batch {batch}: {d:.2} ms on the device (CUDA events around each op), {wall:.2} ms wall"),
        None => eprintln!("profile {name} batch {batch}: {wall:.2} ms with synchronisation"),
    }
    let mut csv = String::new();
    for (op, n, ms) in ops.iter().chain(std::iter::once(&("other (untimed ops; launches)".to_string(), 0, (total - timed).max(0.0)))) {
        eprintln!("  {op:<40} {n:>5} calls {ms:>9.2} ms {:>5.1}%", 100.0 * ms / total);
        csv.push_str(&format!("{name},{batch},{op},{n},{ms:.3},{:.4}\n", ms / total));
    }
    let _ = std::fs::create_dir_all(out);
    let path = out.join("profile.csv");
    let header = if path.exists() { "" } else { "model,batch,op,calls,ms,share\n" };
    use std::io::Write;
    let _ = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(format!("{header}{csv}").as_bytes()));
    Ok(())
}

/// Files streamed through the decode feed into the detector, batch after batch, as `detect`
/// and the agent run them: at least `iters` batches and 4 windows of the feed (so that filling
/// it is a small part of the time). Returns pictures per second and the host's cost per picture.
fn stream_e2e(
    det: &Detector,
    images: &[PathBuf],
    batch: usize,
    iters: usize,
    fit: preprocess::Fit,
    jpeg_on_device: bool,
) -> candle_core::Result<(f64, E2eCost)> {
    let window = batch * rayon::current_num_threads().div_ceil(batch);
    let n = (batch * iters).max(4 * window).div_ceil(batch) * batch;
    let paths: Vec<PathBuf> = images.iter().cycle().take(n).cloned().collect();
    let th = Thresholds::default();
    let o = FeedOptions { batch, imgsz: det.imgsz() as u32, fit, jpeg_on_device, ..FeedOptions::default() };
    let mut stages = StageTimes::default();
    let (mut detect_s, mut wait_s, mut pictures) = (0.0, 0.0, 0usize);
    let t0 = Instant::now();
    #[cfg(feature = "cuda")]
    let _ = det.take_jpeg_profile(); // from here on
    let feed = Feed::spawn(paths, o).map_err(candle_core::Error::wrap)?;
    let mut waiting = Instant::now();
    det.each_decoded(feed, &o.limits, |items, decoded| -> candle_core::Result<()> {
        wait_s += waiting.elapsed().as_secs_f64();
        let mut ok = Vec::with_capacity(items.len());
        for it in &items {
            stages += it.times;
            match &it.picture {
                Ok(p) => ok.push(p),
                Err(e) => candle_core::bail!("{}: {e}", it.path.display()),
            }
        }
        let td = Instant::now();
        for (r, it) in det.detect_pictures_decoded(&ok, decoded, &th, &o.limits)?.into_iter().zip(&items) {
            r.map_err(|e| candle_core::Error::Msg(format!("{}: {e}", it.path.display())))?;
        }
        detect_s += td.elapsed().as_secs_f64();
        pictures += items.len();
        waiting = Instant::now();
        Ok(())
    })?;
    let wall = t0.elapsed().as_secs_f64();
    #[cfg(feature = "cuda")]
    if let Some(p) = det.take_jpeg_profile().filter(|p| p.pictures > 0) {
        eprintln!("  nvJPEG batch {batch}, {} decoders set up: {p}", det.device_jpeg_decoders());
    }
    let per = |d: f64| d * 1e3 / pictures.max(1) as f64;
    let feed_s = stages.total().as_secs_f64();
    Ok((
        pictures as f64 / wall,
        E2eCost {
            read_ms: per(stages.read.as_secs_f64()),
            decode_ms: per(stages.decode.as_secs_f64()),
            letterbox_ms: per(stages.letterbox.as_secs_f64()),
            detect_ms: per(detect_s),
            wait_ms: per(wait_s),
            feed_cores: feed_s / wall,
            pictures,
        },
    ))
}

/// Times one (model, dtype, mode, batch); errors become rows.
#[allow(clippy::too_many_arguments)]
fn bench_batch(
    det: &Detector,
    meter: &PeakMeter,
    name: &str,
    mode: &str,
    batch: usize,
    images: &[PathBuf],
    a: &BenchArgs,
    jpeg_on_device: bool,
) -> Row {
    let mut row = Row {
        model: name.into(),
        dtype: device::dtype_name(det.dtype()).into(),
        mode: mode.into(),
        batch,
        status: Status::Ok,
        latency_ms: None,
        p99_ms: None,
        min_ms: None,
        max_ms: None,
        device_p50_ms: None,
        device_p99_ms: None,
        images_per_s: None,
        peak_mib: None,
        iters: 0,
        error: None,
        e2e: None,
    };
    let iters = a.iters.min(1000 / batch).max(3);
    // each batch size is measured alone: the graphs of smaller batches would hold their memory
    det.drop_graphs();
    let _ = meter.trim();
    let mut stream = None;
    let r = (|| -> candle_core::Result<(Vec<f64>, Vec<f64>, u64)> {
        let (w, h) = a.input.unwrap_or((det.imgsz(), det.imgsz()));
        // the batch input counts (as in PyTorch's max_memory_allocated), its f32 staging does not
        let (work, input_bytes) = if mode == "model" {
            let x = Tensor::rand(0f32, 1f32, (batch, 3, h, w), det.device())?.to_dtype(det.dtype())?;
            let n = (x.elem_count() * x.dtype().size_in_bytes()) as u64;
            (Work::Model(x), n)
        } else {
            let feed = FeedOptions { batch, imgsz: det.imgsz() as u32, fit: a.fit, jpeg_on_device, ..FeedOptions::default() };
            let files = images.iter().cycle().take(batch).collect();
            (Work::E2e { files, th: Thresholds::default(), feed, prepared: Default::default() }, 0)
        };
        let base = meter.usage().map_err(candle_core::Error::wrap)?.used.saturating_sub(input_bytes);
        // the first pass at a new shape plans it (cuDNN's algorithm search, whose scratch is
        // freed again; a graph capture), then the warm-up; the memory is measured on one more
        // pass, the steady state that every later batch of this size needs (what the planner
        // measures too)
        for _ in 0..a.warmup.max(1) {
            run_once(det, &work)?;
        }
        meter.reset().map_err(candle_core::Error::wrap)?;
        run_once(det, &work)?;
        let peak = meter.usage().map_err(candle_core::Error::wrap)?.used_high.saturating_sub(base);
        let timer = yolo_edge::backend::profile::DeviceTimer::new(det.device())?;
        let (mut t, mut on_device) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
        #[cfg(feature = "cuda")]
        let _ = det.take_jpeg_profile(); // the timed runs' own
        let _ = det.take_step_profile();
        if let Work::E2e { prepared, .. } = &work {
            prepared.set(Duration::ZERO);
        }
        for _ in 0..iters {
            det.device().synchronize()?;
            let t0 = Instant::now();
            timer.start()?;
            run_once(det, &work)?;
            let dt = timer.stop()?;
            t.push(t0.elapsed().as_secs_f64() * 1e3);
            on_device.extend(dt);
        }
        #[cfg(feature = "cuda")]
        if let Some(p) = det.take_jpeg_profile().filter(|p| p.pictures > 0) {
            eprintln!("  nvJPEG batch {batch}, timed runs (one batch at a time, the device idle before each): {p}");
        }
        let step = det.take_step_profile();
        if step.passes > 0 {
            eprintln!("  detection step, batch {batch}, timed runs: {step}");
        }
        if let Work::E2e { prepared, .. } = &work {
            let ms = prepared.get().as_secs_f64() * 1e3 / (iters * batch).max(1) as f64;
            let what = if jpeg_on_device { "read, headers checked" } else { "read, decoded and letterboxed on the host" };
            eprintln!("  e2e batch {batch}, timed runs: the files {what}: {ms:.3} ms a picture");
        }
        if mode == "e2e" {
            stream = Some(stream_e2e(det, images, batch, iters, a.fit, jpeg_on_device)?);
        }
        if a.profile {
            profile_pass(det, &work, name, batch, &a.out)?;
        }
        Ok((t, on_device, peak))
    })();
    match r {
        Ok((mut t, mut on_device, peak)) => {
            let med = report::median(&mut t).unwrap_or(f64::NAN);
            row.latency_ms = Some(med);
            row.p99_ms = report::percentile(&mut t, 99.0);
            row.min_ms = t.first().copied();
            row.max_ms = t.last().copied();
            row.device_p50_ms = report::median(&mut on_device);
            row.device_p99_ms = report::percentile(&mut on_device, 99.0);
            row.images_per_s = Some(batch as f64 * 1e3 / med);
            if let Some((ips, cost)) = stream {
                row.images_per_s = Some(ips);
                row.e2e = Some(cost);
            }
            row.peak_mib = Some(peak as f64 / (1024.0 * 1024.0));
            row.iters = t.len();
        }
        Err(e) => {
            row.status = if yolo_edge::backend::oom::is_oom(&e) { Status::Oom } else { Status::Error };
            row.error = Some(e.to_string().lines().next().unwrap_or("").chars().take(300).collect());
            let _ = meter.trim();
        }
    }
    row
}

pub fn run(a: BenchArgs) -> anyhow::Result<ExitCode> {
    a.tuning.install()?;
    if let Some((w, h)) = a.input {
        anyhow::ensure!(w.max(h) <= a.imgsz, "--input {w}x{h} is larger than --imgsz {}", a.imgsz);
    }
    anyhow::ensure!(a.max_batch >= 1, "--max-batch must be at least 1");
    let cache = yolo_edge::env::configure_compute_cache();
    let dev = device::parse_device(&a.device)?;
    let dtypes = a.dtype.split(',').map(|d| device::parse_dtype(d, &dev)).collect::<Result<Vec<_>, _>>()?;
    let batches = parse_batches(&a.batches, a.max_batch)?;
    let modes: Vec<&str> = a.mode.split(',').map(str::trim).collect();
    anyhow::ensure!(modes.iter().all(|m| matches!(*m, "model" | "e2e")), "--mode takes model, e2e or both");
    let mut specs = a.model.clone();
    specs.extend(a.variants.iter().map(|v| format!("random:yolov9{}", v.trim().trim_start_matches("yolov9"))));
    anyhow::ensure!(!specs.is_empty(), "give --model and/or --variants");
    let images = collect_images(&a.images)?;
    anyhow::ensure!(!modes.contains(&"e2e") || !images.is_empty(), "--mode e2e needs --images");
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let meter = PeakMeter::new(&dev);
    let mem0 = devmem::device_memory(&dev)?;
    let cpu_kernel = dev.is_cpu().then(yolo_edge::backend::cpu_kernel_name);
    eprintln!(
        "device {} free {:.0} MiB of {:.0} MiB ({:?}, bound by {}); compute cache {:?}{}",
        device::device_name(&dev),
        mem0.free as f64 / 1048576.0,
        mem0.total as f64 / 1048576.0,
        mem0.source,
        mem0.limit,
        cache,
        cpu_kernel.map(|k| format!("; convolution kernel {k}")).unwrap_or_default()
    );
    let mut rows = Vec::new();
    let mut starts = Vec::new();
    // bench.csv and bench.json after every row: a run cut short keeps the rows already done
    let write_rows = |rows: &[Row], starts: &[serde_json::Value]| -> anyhow::Result<()> {
        report::write(&a.out.join("bench.csv"), &report::csv(rows))?;
        let json = serde_json::json!({"device": device::device_name(&dev), "cpu_kernel": cpu_kernel, "memory_at_start": mem0, "imgsz": a.imgsz, "startup": starts, "rows": rows});
        report::write(&a.out.join("bench.json"), &serde_json::to_string_pretty(&json)?)?;
        Ok(())
    };
    for spec in &specs {
        for &dtype in &dtypes {
            let t0 = Instant::now();
            let (name, det) = common::load_detector(spec, &dev, dtype, a.imgsz, a.seed)?;
            dev.synchronize()?;
            let load_ms = t0.elapsed().as_secs_f64() * 1e3;
            let st = startup::warm_up(&det, load_ms).context("first forward pass")?;
            eprintln!(
                "{name} {}: load {:.0} ms, first forward {:.1} ms, second {:.1} ms",
                device::dtype_name(dtype),
                st.load_ms,
                st.first_forward_ms,
                st.second_forward_ms
            );
            starts.push(serde_json::json!({"model": name, "dtype": device::dtype_name(dtype), "startup": st}));
            // passes on CUDA replay a graph captured for each batch, as in the agent
            // (`--cuda-graphs off`: eager)
            det.use_graphs(true);
            let outside_before = modes.contains(&"e2e").then(|| outside_allocator(&det, &meter)).flatten();
            let jpeg_on_device = modes.contains(&"e2e") && a.jpeg.setup(&det)?;
            for mode in &modes {
                for &b in &batches {
                    let row = bench_batch(&det, &meter, &name, mode, b, &images, &a, jpeg_on_device);
                    eprintln!(
                        "  {name} {} {mode} batch {b}: {:?} {} ms {} img/s {} MiB {}",
                        row.dtype,
                        row.status,
                        row.latency_ms.map_or("-".into(), |v| format!("{v:.2}")),
                        row.images_per_s.map_or("-".into(), |v| format!("{v:.1}")),
                        row.peak_mib.map_or("-".into(), |v| format!("{v:.0}")),
                        row.error.as_deref().unwrap_or("")
                    );
                    let stop = row.status == Status::Oom;
                    rows.push(row);
                    write_rows(&rows, &starts)?;
                    if stop {
                        break; // larger batches would fail too
                    }
                }
            }
            if jpeg_on_device {
                if let (Some(before), Some(after)) = (outside_before, outside_allocator(&det, &meter)) {
                    eprintln!(
                        "  nvJPEG's own device memory after the e2e rows: {:+.1} MiB (its decoders' state and buffers, outside the pool, the arena and any plan's budget)",
                        (after as f64 - before as f64) / 1048576.0
                    );
                }
            }
            drop(det);
            let _ = meter.trim();
        }
    }
    let md = report::markdown(&rows) + &report::e2e_markdown(&rows);
    report::write(&a.out.join("bench.md"), &md)?;
    write_rows(&rows, &starts)?;
    let title = a.title.clone().unwrap_or_else(|| {
        let (w, h) = a.input.unwrap_or((a.imgsz, a.imgsz));
        format!("yolo-edge bench on {}, {w}x{h}", device::device_name(&dev))
    });
    if let Err(e) = report::chart(&rows, &title, &a.out.join("bench.png")) {
        eprintln!("warning: {e}");
    }
    println!("{md}");
    let failed = rows.iter().any(|r| r.status == Status::Error);
    Ok(if failed { ExitCode::from(super::exit::PARTIAL) } else { ExitCode::SUCCESS })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_parse() {
        assert_eq!(parse_batches("8,1,8,32", 256).unwrap(), vec![1, 8, 32]);
        assert_eq!(parse_batches("auto", 20).unwrap(), vec![1, 2, 4, 8, 16]);
        assert!(parse_batches("0", 4).is_err());
        assert!(parse_batches("x", 4).is_err());
    }
}
