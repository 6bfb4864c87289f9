//! The detector: a loaded model plus its batched pre/post-processing. Letterboxed u8 pixels
//! are uploaded as they are and normalised on the device; only per-anchor best scores, classes
//! and boxes come back to the host for NMS.

pub mod warmup;

use std::path::Path;

use candle_core::{DType, Device, Tensor};

use crate::backend::Uploader;
use crate::model::{BuildOptions, ModelError, ModelInfo, YoloV9};
use crate::vision::postprocess::{self, Candidate, Detection, Thresholds};
use crate::vision::preprocess::Letterboxed;
use crate::weights::Checkpoint;

/// After a capture or launch runs out of memory, passes run eagerly for this long before a
/// graph is tried again (memory pressure from other tenants is usually temporary).
#[cfg(feature = "cuda")]
const GRAPH_RETRY_AFTER_OOM: std::time::Duration = std::time::Duration::from_secs(60);

/// A detector's captured batch-1 CUDA graph, whether it gave up on graphs (any failure other than
/// running out of memory), and when it may try again after running out of memory.
#[cfg(feature = "cuda")]
#[derive(Default)]
struct Graphs {
    kept: Option<crate::backend::GraphedForward>,
    failed: bool,
    retry_at: Option<std::time::Instant>,
}

#[cfg(feature = "cuda")]
impl Graphs {
    /// Drops every graph (and its memory) after `e`: for a while when it ran out of memory, for
    /// good otherwise.
    fn give_up(&mut self, what: &str, e: &candle_core::Error) {
        self.kept = None;
        if crate::backend::oom::is_oom(e) {
            self.retry_at = Some(std::time::Instant::now() + GRAPH_RETRY_AFTER_OOM);
            tracing::warn!(error = %e, retry_s = GRAPH_RETRY_AFTER_OOM.as_secs(), "CUDA graph {what} ran out of memory; passes run eagerly until the retry");
        } else {
            self.failed = true;
            tracing::warn!(error = %e, "CUDA graph {what} failed; passes run eagerly from now on");
        }
    }
}

pub struct Detector {
    model: YoloV9,
    imgsz: usize,
    uploader: Uploader,
    /// Batch-1 passes on CUDA replay one captured graph ([`Detector::use_graphs`]).
    graphs: std::sync::atomic::AtomicBool,
    #[cfg(feature = "cuda")]
    graph: std::sync::Mutex<Graphs>,
}

impl Detector {
    /// Loads a checkpoint (`.pt` or `.safetensors`) onto `device` in `dtype`.
    pub fn load(path: &Path, device: &Device, dtype: DType, imgsz: Option<usize>) -> Result<Self, ModelError> {
        let ck = Checkpoint::load(path)?;
        let model = YoloV9::from_checkpoint(&ck, &BuildOptions::new(device.clone(), dtype))?;
        let imgsz = imgsz.unwrap_or(model.info().imgsz);
        if imgsz == 0 || imgsz % 32 != 0 {
            return Err(ModelError::Architecture(format!("imgsz {imgsz} is not a positive multiple of 32")));
        }
        Ok(Self::from_model(model, imgsz))
    }

    pub fn from_model(model: YoloV9, imgsz: usize) -> Self {
        Self {
            model,
            imgsz,
            uploader: Uploader::default(),
            graphs: false.into(),
            #[cfg(feature = "cuda")]
            graph: std::sync::Mutex::new(Graphs::default()),
        }
    }

    /// Lets batch-1 passes on CUDA run as one captured CUDA graph when `[tuning] cuda_graphs` is
    /// on (off by default, so that the planner measures the eager passes). A capture or launch that fails is
    /// logged and the detector goes on eagerly: for good, or for a minute after running out of
    /// memory. No effect on the CPU.
    pub fn use_graphs(&self, on: bool) {
        self.graphs.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn info(&self) -> &ModelInfo {
        self.model.info()
    }
    pub fn model(&self) -> &YoloV9 {
        &self.model
    }
    pub fn imgsz(&self) -> usize {
        self.imgsz
    }
    pub fn device(&self) -> &Device {
        self.model.device()
    }
    pub fn dtype(&self) -> DType {
        self.model.dtype()
    }

    /// Stacks letterboxed pictures, all of one input shape, into the normalised network input
    /// `(B, 3, H, W)` on the device.
    pub fn input(&self, batch: &[&Letterboxed]) -> candle_core::Result<Tensor> {
        let _arena = crate::backend::serve_arena(self.device());
        let Some(first) = batch.first() else { candle_core::bail!("empty batch") };
        let (w, h) = (first.geometry.in_w as usize, first.geometry.in_h as usize);
        let mut parts = Vec::with_capacity(batch.len());
        for lb in batch {
            let (lw, lh) = (lb.geometry.in_w as usize, lb.geometry.in_h as usize);
            if (lw, lh) != (w, h) || lb.pixels.len() != w * h * 3 || w.max(h) > self.imgsz || w % 32 != 0 || h % 32 != 0 {
                candle_core::bail!(
                    "picture letterboxed to {lw}x{lh} ({} bytes) in a batch of {w}x{h}; the model runs at multiples of 32 up to {}",
                    lb.pixels.len(),
                    self.imgsz
                );
            }
            parts.push(lb.pixels.as_slice());
        }
        let x = self.uploader.upload(&parts, (batch.len(), h, w, 3), self.device())?;
        // u8 -> dtype and /255 on the device, NHWC -> NCHW: on CUDA one kernel
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            return crate::backend::normalize_input(&x, self.dtype());
        }
        x.to_dtype(self.dtype())?.permute((0, 3, 1, 2))?.contiguous()? / 255.0
    }

    /// The reference's raw output `(B, 4 + nc, anchors)` for a batch.
    pub fn raw(&self, batch: &[&Letterboxed]) -> candle_core::Result<Tensor> {
        self.forward(&self.input(batch)?)
    }

    /// The network on a normalised input `(B, 3, S, S)`: at batch 1 on CUDA with graphs on
    /// ([`Detector::use_graphs`]), one graph launch; otherwise the model's eager pass.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let _arena = crate::backend::serve_arena(self.device());
        #[cfg(feature = "cuda")]
        if let Some(y) = self.graphed(x) {
            return Ok(y);
        }
        self.model.forward(x)
    }

    #[cfg(feature = "cuda")]
    fn graphed(&self, x: &Tensor) -> Option<Tensor> {
        use crate::backend::GraphedForward;
        let b = x.dim(0).ok()?;
        if b != 1
            || !self.graphs.load(std::sync::atomic::Ordering::Relaxed)
            || !x.device().is_cuda()
            || !crate::backend::tuning::get().cuda_graphs
        {
            return None;
        }
        let mut g = self.graph.lock().ok()?;
        if g.failed || g.retry_at.is_some_and(|t| std::time::Instant::now() < t) {
            return None;
        }
        g.retry_at = None;
        if !g.kept.as_ref().is_some_and(|gf| gf.fits(x)) {
            // a graph for another shape or thread goes (with its memory) before the new capture
            g.kept = None;
            match GraphedForward::capture(|t| self.model.forward(t), x) {
                Ok(gf) => {
                    tracing::info!(shape = ?x.dims(), graph_pool_mib = crate::backend::devmem::graph_pool_reserved(x.device()) >> 20, "batch-1 pass captured as a CUDA graph");
                    g.kept = Some(gf);
                }
                Err(e) => {
                    g.give_up("capture", &e);
                    return None;
                }
            }
        }
        let run = g.kept.as_ref().map(|gf| gf.run(x))?;
        match run {
            Ok(y) => Some(y),
            Err(e) => {
                g.give_up("launch", &e);
                None
            }
        }
    }

    /// Candidates above `conf` for every picture of a raw output, in anchor order. On CUDA the
    /// best class and the threshold run on the device and only the survivors come back;
    /// elsewhere one copy of boxes, best score and class per anchor, filtered here.
    pub fn candidates(&self, raw: &Tensor, conf: f32) -> candle_core::Result<Vec<Vec<Candidate>>> {
        let _arena = crate::backend::serve_arena(raw.device());
        #[cfg(feature = "cuda")]
        if let Some(r) = crate::backend::device_candidates(raw, conf) {
            return r;
        }
        let (b, no, a) = raw.dims3()?;
        let nc = no - 4;
        let scores = raw.narrow(1, 4, nc)?;
        let best = scores.max_keepdim(1)?;
        let cls = scores.argmax_keepdim(1)?.to_dtype(raw.dtype())?;
        let packed = Tensor::cat(&[raw.narrow(1, 0, 4)?, best, cls], 1)?.to_dtype(DType::F32)?.to_device(&Device::Cpu)?;
        let v = packed.flatten_all()?.to_vec1::<f32>()?;
        Ok((0..b)
            .map(|i| {
                let o = i * 6 * a;
                (0..a)
                    .filter(|&j| v[o + 4 * a + j] > conf)
                    .map(|j| Candidate {
                        xywh: [v[o + j], v[o + a + j], v[o + 2 * a + j], v[o + 3 * a + j]],
                        score: v[o + 4 * a + j],
                        class_id: v[o + 5 * a + j] as usize,
                    })
                    .collect()
            })
            .collect())
    }

    /// Detections for a batch of letterboxed pictures, in each picture's original pixels.
    pub fn detect(&self, batch: &[&Letterboxed], th: &Thresholds) -> candle_core::Result<Vec<Vec<Detection>>> {
        if batch.is_empty() {
            return Ok(vec![]);
        }
        let raw = self.raw(batch)?;
        let cands = self.candidates(&raw, th.conf)?;
        let names = &self.info().names;
        let finish = |(c, lb): (Vec<Candidate>, &&Letterboxed)| postprocess::finish(c, th, &lb.geometry, names);
        if batch.len() == 1 {
            return Ok(cands.into_iter().zip(batch).map(finish).collect());
        }
        // NMS per picture on rayon's pool: a crowded scene (or an untrained model: every anchor
        // a candidate) costs milliseconds per picture, which would add up serially
        use rayon::prelude::*;
        Ok(cands.into_par_iter().zip(batch.par_iter()).map(finish).collect())
    }
}
