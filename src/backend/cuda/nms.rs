//! The detection step's NMS on CUDA (`kernels/nms.cu`): the score filter, the score order and the
//! class-aware greedy pass run on the device, and only the kept boxes come back to the host
//! (at most `max_det` rows a picture instead of every candidate).
//!
//! The answers are [`postprocess::nms`]'s: the same candidates (best class above `conf`, finite
//! score), the same order (score descending, ties by anchor, the best [`postprocess::MAX_NMS`]),
//! the same IoU in the same f32 operations, the same stop at `max_det`. On the H100's host an
//! untrained c's 5040 candidates cost 0.31-0.46 ms of NMS at batch 1 (BENCHMARKS.md, GPU, "Kept
//! boxes by class id on the card"); here the host waits for the pass anyway. The device's time
//! has not been measured yet.
//!
//! Work and memory are bounded by the batch: rows, ranks and order take 40 bytes an anchor of each
//! picture, the kept rows 32 bytes for each of `max_det`. The order costs a comparison for every
//! pair of a picture's candidates (an untrained model at batch 256 at 640x640: 18 billion).

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{DType, Device, Storage, Tensor};

use crate::vision::postprocess::{self, Candidate, Thresholds};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/nms.ptx"));
const MODULE: &str = "yolo_edge_nms";
/// Floats per kept row: x, y, w, h, score, class, picture, place.
const ROW: usize = postprocess::KEPT_ROW;
/// Floats per candidate row of a picture's segment (`kernels/nms.cu`'s `ROW`).
const CANDIDATE_ROW: usize = 8;
/// The most boxes a picture keeps on the device (`kernels/nms.cu`'s `MAX_KEPT`); a larger
/// `max_det` is the host's.
pub const MAX_KEPT: usize = 1024;
/// Threads of a `suppress` block (`SUPPRESS_THREADS`) and of a `rank` block (`RANK_TILE`).
const SUPPRESS_THREADS: u32 = 1024;
const RANK_TILE: usize = 128;
const RANK_SLICE: usize = 1024;
/// Kept rows copied back with the count, in one copy (32 KiB): a batch of three pictures at the
/// default `max_det`. A batch with more takes a second copy for the rest.
const FIRST_ROWS: usize = 1024;

/// Whether the device takes the NMS of `raw`'s pictures at these thresholds: a CUDA device, a
/// `max_det` of at most [`MAX_KEPT`], and anchor and picture numbers its rows hold exactly.
pub fn takes(raw: &Tensor, th: &Thresholds) -> bool {
    matches!(raw.device(), Device::Cuda(_)) && th.max_det <= MAX_KEPT && raw.dims3().is_ok_and(|(b, _, a)| a < 1 << 24 && b < 1 << 24)
}

/// Each picture's kept candidates, best first, of a raw output `(B, 4 + nc, A)` on a CUDA device;
/// `None` where the device does not take it ([`takes`]).
pub fn kept(raw: &Tensor, th: &Thresholds) -> Option<candle_core::Result<Vec<Vec<Candidate>>>> {
    let Device::Cuda(dev) = raw.device() else { return None };
    if !takes(raw, th) {
        return None;
    }
    Some(run(dev, raw, th, postprocess::MAX_NMS).map(|rows| {
        let b = raw.dims3().map_or(0, |(b, _, _)| b);
        postprocess::kept_from_rows(&rows, b)
    }))
}

/// The kept rows (without the header) of `raw`'s pictures, at most `max_nms` candidates of each
/// entering the pass.
fn run(dev: &candle_core::CudaDevice, raw: &Tensor, th: &Thresholds, max_nms: usize) -> candle_core::Result<Vec<f32>> {
    let (b, no, a) = raw.dims3()?;
    if no < 5 {
        candle_core::bail!("nms: raw output has {no} rows, fewer than 4 box rows and one class");
    }
    let anchors = b * a;
    if anchors == 0 {
        return Ok(Vec::new());
    }
    let per_picture = th.max_det.min(a);
    if !takes(raw, th) || raw.elem_count() > u32::MAX as usize || anchors * CANDIDATE_ROW > u32::MAX as usize {
        candle_core::bail!("nms: {b} pictures x {a} anchors (max_det {}) is more than the device pass takes", th.max_det);
    }
    let raw = raw.contiguous()?;
    let (storage, layout) = raw.storage_and_layout();
    let Storage::Cuda(cs) = &*storage else { candle_core::bail!("nms: raw output is not on the CUDA device") };
    let stream = dev.cuda_stream();
    // counts (b) then ranks (b x a), zeroed in one memset
    let mut work = dev.alloc_zeros::<u32>(b + anchors)?;
    // SAFETY: of each picture's segment the kernels read only the `counts[n]` rows `group` wrote
    // and the order entries `suppress` wrote (its ranks are a permutation of 0..counts[n]).
    let mut rows = unsafe { dev.alloc::<f32>(anchors * CANDIDATE_ROW)? };
    // SAFETY: as above.
    let mut order = unsafe { dev.alloc::<u32>(anchors)? };
    // SAFETY: the header is zeroed below; of the rows only the first `count` (written by
    // `suppress`) are read.
    let mut out = unsafe { dev.alloc::<f32>((1 + b * per_picture) * ROW)? };
    stream.memset_zeros(&mut out.slice_mut(..ROW)).w()?;
    let (bu, nou, au) = (b as u32, no as u32, a as u32);
    {
        let (mut counts, _) = work.split_at_mut(b);
        let blocks = anchors.div_ceil(256).clamp(1, 1 << 16) as u32;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        macro_rules! launch {
            ($t:ty, $name:literal) => {{
                let func = dev.get_or_load_custom_func($name, MODULE, PTX)?;
                let rv = cs.as_cuda_slice::<$t>()?.slice(layout.start_offset()..);
                let mut builder = func.builder();
                builder.arg(&rv);
                builder.arg(&bu);
                builder.arg(&nou);
                builder.arg(&au);
                builder.arg(&th.conf);
                builder.arg(&mut rows);
                builder.arg(&mut counts);
                // SAFETY: argument list matches `kernels/nms.cu`'s `group`; the input holds
                // b*no*a elements from its offset (contiguous), `rows` a*8 floats a picture and
                // `counts` b zeroed words.
                unsafe { builder.launch(cfg) }.w()?;
            }};
        }
        match raw.dtype() {
            DType::F16 => launch!(half::f16, "group_f16"),
            DType::F32 => launch!(f32, "group_f32"),
            dt => candle_core::bail!("nms: unsupported dtype {dt:?}"),
        }
    }
    drop(storage);
    let (mut counts, mut ranks) = work.split_at_mut(b);
    {
        let items = b * a.div_ceil(RANK_TILE) * a.div_ceil(RANK_SLICE);
        let cfg = LaunchConfig { grid_dim: (items.clamp(1, 4096) as u32, 1, 1), block_dim: (RANK_TILE as u32, 1, 1), shared_mem_bytes: 0 };
        let func = dev.get_or_load_custom_func("rank", MODULE, PTX)?;
        let mut builder = func.builder();
        builder.arg(&rows);
        builder.arg(&mut counts);
        builder.arg(&bu);
        builder.arg(&au);
        builder.arg(&mut ranks);
        // SAFETY: argument list matches `kernels/nms.cu`'s `rank` (RANK_TILE threads a block);
        // `rows` and `ranks` hold a*8 floats and a zeroed words a picture, `counts` b words of
        // at most a each.
        unsafe { builder.launch(cfg) }.w()?;
    }
    {
        let cfg = LaunchConfig { grid_dim: (bu, 1, 1), block_dim: (SUPPRESS_THREADS, 1, 1), shared_mem_bytes: 0 };
        let (max_nms, max_det) = (max_nms.min(u32::MAX as usize) as u32, th.max_det as u32);
        let func = dev.get_or_load_custom_func("suppress", MODULE, PTX)?;
        let mut builder = func.builder();
        builder.arg(&rows);
        builder.arg(&mut counts);
        builder.arg(&mut ranks);
        builder.arg(&au);
        builder.arg(&max_nms);
        builder.arg(&th.iou);
        builder.arg(&max_det);
        builder.arg(&mut order);
        builder.arg(&mut out);
        // SAFETY: argument list matches `kernels/nms.cu`'s `suppress` (SUPPRESS_THREADS threads,
        // one block a picture); `order` holds a words a picture, `out` a header and
        // min(max_det, a) rows a picture, max_det at most MAX_KEPT (the kernel's bound).
        unsafe { builder.launch(cfg) }.w()?;
    }
    // the count and the first rows in one copy; a large batch takes a second for the rest
    let total = b * per_picture;
    let first = total.min(FIRST_ROWS);
    let mut kept = dev.clone_dtoh(&out.slice(..(1 + first) * ROW))?;
    let n = (kept[0].to_bits() as usize).min(total);
    kept.truncate((1 + n.min(first)) * ROW);
    if n > first {
        kept.extend(dev.clone_dtoh(&out.slice((1 + first) * ROW..(1 + n) * ROW))?);
    }
    kept.drain(..ROW);
    Ok(kept)
}

/// A kept box as bits, so that NaN sides compare equal to themselves.
fn bits(c: &Candidate) -> ([u32; 4], u32, usize) {
    (c.xywh.map(f32::to_bits), c.score.to_bits(), c.class_id)
}

/// [`postprocess::crowded_output`] as a host tensor.
fn crowded(b: usize, nc: usize, a: usize) -> candle_core::Result<Tensor> {
    Tensor::from_vec(postprocess::crowded_output(b, nc, a), (b, 4 + nc, a), &Device::Cpu)
}

/// One case: the device's kept boxes against the host's on `raw` (on the host, in its dtype);
/// returns (candidates, kept by the host, differing kept boxes).
fn compare(dev: &candle_core::CudaDevice, raw: &Tensor, th: &Thresholds, max_nms: usize) -> candle_core::Result<(usize, usize, u64)> {
    let dims = raw.dims3()?;
    let v = raw.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let cands = postprocess::candidates_on_host(&v, dims, th.conf);
    let candidates = cands.iter().map(Vec::len).sum();
    let want: Vec<Vec<Candidate>> =
        cands.into_iter().map(|c| postprocess::nms_of_best(c, th, max_nms).into_iter().map(|(c, _)| c).collect()).collect();
    let got = postprocess::kept_from_rows(&run(dev, &raw.to_device(&Device::Cuda(dev.clone()))?, th, max_nms)?, dims.0);
    let mut differing = got.len().abs_diff(want.len()) as u64;
    for (g, w) in got.iter().zip(&want) {
        differing += g.iter().zip(w).filter(|(x, y)| bits(x) != bits(y)).count() as u64 + g.len().abs_diff(w.len()) as u64;
    }
    Ok((candidates, want.iter().map(Vec::len).sum(), differing))
}

/// A quick check that this device's NMS gives the host's answers (two crowded pictures of 1500
/// anchors at the default thresholds, f32 and f16), for a process to make once before it relies
/// on the device's NMS. `Err` says what differed, or what failed.
pub fn verify(dev: &candle_core::CudaDevice) -> Result<(), String> {
    let check = || -> candle_core::Result<Option<String>> {
        let raw = crowded(2, 5, 1500)?;
        for dtype in [DType::F32, DType::F16] {
            let (candidates, kept, differing) = compare(dev, &raw.to_dtype(dtype)?, &Thresholds::default(), postprocess::MAX_NMS)?;
            if differing > 0 {
                return Ok(Some(format!("{differing} of {kept} kept boxes differ from the host's ({dtype:?}, {candidates} candidates)")));
            }
        }
        Ok(None)
    };
    match check() {
        Ok(None) => Ok(()),
        Ok(Some(why)) => Err(why),
        Err(e) => Err(e.to_string()),
    }
}

/// The device NMS against [`postprocess::nms`] on raw outputs made on the host, f32 and f16:
/// three pictures of 5040 anchors of [`postprocess::crowded_output`] (five classes, thousands
/// of tied scores, NaN and infinite scores and sides); at thresholds and `max_det` that keep
/// none, one, hundreds and up to [`MAX_KEPT`], and once with only the best 1000 candidates
/// entering NMS. A line per case into `report`.
/// Returns the kept boxes that differ in any bit, or are missing or extra (0 expected). For
/// `yolo-edge jpeg-selfcheck`.
pub fn selfcheck(dev: &candle_core::CudaDevice, report: &mut String) -> candle_core::Result<u64> {
    use std::fmt::Write;
    let (b, nc, a) = (3usize, 5usize, 5040usize);
    let host = crowded(b, nc, a)?;
    let mut wrong = 0u64;
    writeln!(report, "device NMS against the host's ({b} pictures x {a} anchors, {nc} classes; expected 0 differing)").ok();
    writeln!(
        report,
        "{:<6} {:>5} {:>5} {:>7} {:>7} {:>11} {:>6} {:>9}",
        "dtype", "conf", "iou", "max_det", "max_nms", "candidates", "kept", "differing"
    )
    .ok();
    for dtype in [DType::F32, DType::F16] {
        let raw = host.to_dtype(dtype)?;
        for (conf, iou, max_det, max_nms) in [
            (0.25f32, 0.7f32, 300usize, postprocess::MAX_NMS),
            (0.25, 0.45, MAX_KEPT, postprocess::MAX_NMS),
            (0.001, 0.0, MAX_KEPT, postprocess::MAX_NMS),
            (0.9, 0.7, 1, postprocess::MAX_NMS),
            (-1.0, 0.5, 300, 1000),
            (0.5, 0.7, 0, postprocess::MAX_NMS),
            (2.0, 0.7, 300, postprocess::MAX_NMS),
        ] {
            let (candidates, kept, differing) = compare(dev, &raw, &Thresholds { conf, iou, max_det }, max_nms)?;
            writeln!(
                report,
                "{:<6} {conf:>5} {iou:>5} {max_det:>7} {max_nms:>7} {candidates:>11} {kept:>6} {differing:>9}",
                format!("{dtype:?}").to_lowercase()
            )
            .ok();
            wrong += differing;
        }
    }
    Ok(wrong)
}
