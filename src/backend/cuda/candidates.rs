//! Score filtering on CUDA: the best class per anchor and the threshold run on the device
//! (`kernels/candidates.cu`), and only the anchors that pass come back to the host.
//!
//! Copying every anchor of every picture back (6 floats x 8400 anchors, 200 KB per
//! picture) back to scan it on the host took 67 ms of a 171-picture yolov9t batch,
//! longer than the network's 61 ms (`plan --soak` stage times).

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{DType, Device, Storage, Tensor};

use crate::vision::postprocess;

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/candidates.ptx"));
const MODULE: &str = "yolo_edge_candidates";
/// Floats per survivor: x, y, w, h, score, class, picture, anchor.
const ROW: usize = postprocess::DEVICE_ROW;
/// Survivor rows copied back with the count, in one copy (32 KiB): more than most batches at
/// the usual thresholds have. A batch with more takes a second copy for the rest.
const FIRST_ROWS: usize = 1024;

/// The anchors of a batch that passed the device's score filter, as the device wrote them.
pub struct SurvivorRows {
    /// A header row, then a row per survivor.
    copied: Vec<f32>,
}

impl SurvivorRows {
    /// Rows of [`postprocess::DEVICE_ROW`] floats in the order the device appended them
    /// ([`postprocess::candidates_from_rows`] makes the per-picture lists).
    pub fn rows(&self) -> &[f32] {
        self.copied.get(ROW..).unwrap_or_default()
    }
}

/// The anchors above `conf` of a raw output `(B, 4 + nc, A)` on a CUDA device; `None` when `raw`
/// is not on a CUDA device.
pub fn candidate_rows(raw: &Tensor, conf: f32) -> Option<candle_core::Result<SurvivorRows>> {
    let Device::Cuda(dev) = raw.device() else { return None };
    Some(run(dev, raw, conf))
}

fn run(dev: &candle_core::CudaDevice, raw: &Tensor, conf: f32) -> candle_core::Result<SurvivorRows> {
    let (b, no, a) = raw.dims3()?;
    if no < 5 {
        candle_core::bail!("candidates: raw output has {no} rows, fewer than 4 box rows and one class");
    }
    let total = b * a;
    if total == 0 {
        return Ok(SurvivorRows { copied: Vec::new() });
    }
    if raw.elem_count() > u32::MAX as usize || (total + 1) * ROW > u32::MAX as usize {
        candle_core::bail!("candidates: {b} pictures x {a} anchors is more than one launch indexes");
    }
    let raw = raw.contiguous()?;
    let (storage, layout) = raw.storage_and_layout();
    let Storage::Cuda(cs) = &*storage else { candle_core::bail!("candidates: raw output is not on the CUDA device") };
    let stream = dev.cuda_stream();
    // one header row (its first word counts the survivors), then a row per survivor
    // SAFETY: the header is zeroed below, and of the rows only the first `count` (written by the
    // kernel) are read.
    let mut out = unsafe { dev.alloc::<f32>((total + 1) * ROW)? };
    stream.memset_zeros(&mut out.slice_mut(..ROW)).w()?;
    let blocks = total.div_ceil(256).clamp(1, 1 << 16) as u32;
    let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let (bu, nou, au) = (b as u32, no as u32, a as u32);
    macro_rules! launch {
        ($t:ty, $name:literal) => {{
            let func = dev.get_or_load_custom_func($name, MODULE, PTX)?;
            let rv = cs.as_cuda_slice::<$t>()?.slice(layout.start_offset()..);
            let mut builder = func.builder();
            builder.arg(&rv);
            builder.arg(&bu);
            builder.arg(&nou);
            builder.arg(&au);
            builder.arg(&conf);
            builder.arg(&out);
            // SAFETY: argument list matches `kernels/candidates.cu`; the input holds b*no*a
            // elements from its offset (contiguous), the output a header and b*a rows.
            unsafe { builder.launch(cfg) }.w()?;
        }};
    }
    match raw.dtype() {
        DType::F16 => launch!(half::f16, "select_f16"),
        DType::F32 => launch!(f32, "select_f32"),
        dt => candle_core::bail!("candidates: unsupported dtype {dt:?}"),
    }
    drop(storage);
    // the count and the first rows in one copy; a crowded batch takes a second for the rest
    let first = total.min(FIRST_ROWS);
    let mut rows = dev.clone_dtoh(&out.slice(..(1 + first) * ROW))?;
    let n = (rows[0].to_bits() as usize).min(total);
    rows.truncate((1 + n.min(first)) * ROW);
    if n > first {
        rows.extend(dev.clone_dtoh(&out.slice((1 + first) * ROW..(1 + n) * ROW))?);
    }
    Ok(SurvivorRows { copied: rows })
}

/// The device filter against a plain host filter over raw outputs made on the host, f32 and
/// f16, at thresholds that let none, a few hundred (one copy), thousands (a second copy) and
/// every anchor through; a line per case into `report`. Returns the candidates that differ in
/// any field (0 expected: both sides compare the same values). For `yolo-edge jpeg-selfcheck`.
pub fn selfcheck(dev: &candle_core::CudaDevice, report: &mut String) -> candle_core::Result<u64> {
    use std::fmt::Write;
    // three pictures of yolov9t's 640x384 anchors, 80 classes
    let (b, nc, a) = (3usize, 80usize, 5040usize);
    let no = 4 + nc;
    // pseudo-random values in [0, 1), quantised to 1/4096 so that classes tie now and then (145
    // anchors' best score is shared); thresholds 1, 0.9995, 0.99 and -1 pass 0, 580, 8216 and
    // 15120 anchors
    let values: Vec<f32> = (0..b * no * a)
        .map(|i| {
            let mut v = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            v ^= v >> 31;
            v = v.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            ((v >> 40) % 4096) as f32 / 4096.0
        })
        .collect();
    let host = Tensor::from_vec(values, (b, no, a), &Device::Cpu)?;
    let mut wrong = 0u64;
    writeln!(report, "device score filter against the host's ({b} pictures x {a} anchors, {nc} classes; expected 0 differing)").ok();
    writeln!(report, "{:<6} {:>10} {:>11} {:>9}", "dtype", "conf", "candidates", "differing").ok();
    for dtype in [DType::F32, DType::F16] {
        let raw = host.to_dtype(dtype)?;
        let v = raw.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let on_device = raw.to_device(&Device::Cuda(dev.clone()))?;
        for conf in [1.0f32, 0.9995, 0.99, -1.0] {
            let want = postprocess::candidates_on_host(&v, (b, no, a), conf);
            let got = postprocess::candidates_from_rows(run(dev, &on_device, conf)?.rows(), b, a);
            let mut differing = 0u64;
            for (g, w) in got.iter().zip(&want) {
                differing += g.iter().zip(w).filter(|(x, y)| x != y).count() as u64 + g.len().abs_diff(w.len()) as u64;
            }
            differing += got.len().abs_diff(want.len()) as u64;
            let count: usize = want.iter().map(Vec::len).sum();
            writeln!(report, "{:<6} {conf:>10} {count:>11} {differing:>9}", format!("{dtype:?}").to_lowercase()).ok();
            wrong += differing;
        }
    }
    Ok(wrong)
}
