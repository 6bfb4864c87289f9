//! Score filtering on CUDA: the best class per anchor and the threshold run on the device
//! (`kernels/candidates.cu`), and only the anchors that pass come back to the host.
//!
//! Copying every anchor of every picture back (6 floats x 8400 anchors, 200 KB per
//! picture) back to scan it on the host took 67 ms of a 171-picture yolov9t batch,
//! longer than the network's 61 ms (`plan --soak` stage times).

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{DType, Device, Storage, Tensor};

use crate::vision::postprocess::{self, Candidate};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/candidates.ptx"));
const MODULE: &str = "yolo_edge_candidates";
/// Floats per survivor: x, y, w, h, score, class, picture, anchor.
const ROW: usize = postprocess::DEVICE_ROW;

/// Candidates above `conf` for every picture of a raw output `(B, 4 + nc, A)` on a CUDA device,
/// each picture's in anchor order; `None` when `raw` is not on a CUDA device.
pub fn candidates(raw: &Tensor, conf: f32) -> Option<candle_core::Result<Vec<Vec<Candidate>>>> {
    let Device::Cuda(dev) = raw.device() else { return None };
    Some(run(dev, raw, conf))
}

fn run(dev: &candle_core::CudaDevice, raw: &Tensor, conf: f32) -> candle_core::Result<Vec<Vec<Candidate>>> {
    let (b, no, a) = raw.dims3()?;
    if no < 5 {
        candle_core::bail!("candidates: raw output has {no} rows, fewer than 4 box rows and one class");
    }
    let total = b * a;
    if total == 0 {
        return Ok(vec![Vec::new(); b]);
    }
    if raw.elem_count() > u32::MAX as usize || total * ROW > u32::MAX as usize {
        candle_core::bail!("candidates: {b} pictures x {a} anchors is more than one launch indexes");
    }
    let raw = raw.contiguous()?;
    let (storage, layout) = raw.storage_and_layout();
    let Storage::Cuda(cs) = &*storage else { candle_core::bail!("candidates: raw output is not on the CUDA device") };
    let count = dev.alloc_zeros::<u32>(1)?;
    // SAFETY: only the first `count` rows are written by the kernel, and only those are read.
    let out = unsafe { dev.alloc::<f32>(total * ROW)? };
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
            builder.arg(&count);
            // SAFETY: argument list matches `kernels/candidates.cu`; the input holds b*no*a
            // elements from its offset (contiguous), the output b*a rows.
            unsafe { builder.launch(cfg) }.w()?;
        }};
    }
    match raw.dtype() {
        DType::F16 => launch!(half::f16, "select_f16"),
        DType::F32 => launch!(f32, "select_f32"),
        dt => candle_core::bail!("candidates: unsupported dtype {dt:?}"),
    }
    drop(storage);
    let n = (dev.clone_dtoh(&count)?[0] as usize).min(total);
    let rows = if n > 0 { dev.clone_dtoh(&out.slice(..n * ROW))? } else { Vec::new() };
    Ok(postprocess::candidates_from_rows(&rows, b, a))
}
