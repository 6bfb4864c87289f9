//! One forward pass replayed as a CUDA graph: a forward is a few hundred small kernel launches,
//! and up to batches of a few dozen pictures the host's launch rate, not the GPU, sets the
//! latency.
//!
//! A graph is captured once per (batch, input shape) on the inference thread, after two warm
//! passes have planned every cuDNN convolution, built the head's anchors and filled candle's
//! cache of small host uploads (the layout arguments of its strided kernels, which cannot be
//! copied inside a capture). Its input and output live in fixed buffers (the pass's head writes
//! the output buffer itself): a call copies the batch into the input buffer (a smaller batch into
//! its first pictures: the rest of the pass computes pictures nobody reads), launches the graph
//! and returns a copy of the output rows it asked for, so a caller may keep the result across
//! calls ([`GraphedForward::run`]), or lends those rows in place until the next launch
//! ([`GraphedForward::launch`]).
//!
//! Memory: the capture allocates in the arena's graph region, which every graph of the process
//! shares (`crate::backend::arena`, [`serve_graph`](crate::backend::arena::serve_graph)), so the
//! graphs of a whole ladder of batch sizes together hold the memory of the largest. Without the
//! arena the pass's activations live in CUDA's graph memory pool, which
//! `crate::backend::devmem` adds to the stream pool's figures.
//!
//! Anything that fails (capture, instantiation, launch) is an error the caller answers by
//! running the pass eagerly (the detector then stops using graphs; after running out of memory,
//! for a minute).

use candle_core::cuda_backend::cudarc::driver::{sys, CudaGraph};
use candle_core::{Device, Tensor};

pub struct GraphedForward {
    /// Fixed input buffer `(B, 3, H, W)` the graph reads.
    input: Tensor,
    /// Fixed output buffer `(B, 4 + nc, A)` the graph writes.
    output: Tensor,
    graph: CudaGraph,
    /// The capturing thread: the graph's kernels read layout arguments from candle's
    /// thread-local upload cache, and candle's stream is that thread's per-thread stream, so
    /// the graph is only launched there.
    thread: std::thread::ThreadId,
    /// Keeps the arena's graph region mapped while this graph may replay over it.
    _hold: crate::backend::arena::GraphHold,
}

// SAFETY: `CudaGraph` holds raw driver handles and is not thread safe. A `GraphedForward` is
// only used behind the detector's mutex, so no two threads touch the graph at once, and `run`
// refuses to launch it from any thread but the one that captured it.
unsafe impl Send for GraphedForward {}

fn derr(what: &str) -> impl Fn(candle_core::cuda_backend::cudarc::driver::DriverError) -> candle_core::Error + '_ {
    move |e| candle_core::Error::Msg(format!("CUDA graph {what}: {e}"))
}

impl GraphedForward {
    /// Captures the pass `forward` (a model's forward pass) for batches of `batch` pictures
    /// shaped like those of `x` (at most `batch`: the rest of the captured input is zeros, as a
    /// partial batch is padded up to a rung of the ladder); it runs twice eagerly first, to warm
    /// everything up. `forward(x, out)` with `out` a buffer shaped and typed like its result
    /// writes the result there (the captured pass writes the graph's output buffer); a pass that
    /// returns some other tensor is copied into it. The padding is written into the buffers the
    /// passes read, never a padded copy beside them: a partial batch's capture needs no more
    /// memory than a full one's.
    pub fn capture(
        forward: impl Fn(&Tensor, Option<&Tensor>) -> candle_core::Result<Tensor>,
        x: &Tensor,
        batch: usize,
    ) -> candle_core::Result<Self> {
        let Device::Cuda(dev) = x.device() else { candle_core::bail!("CUDA graphs need a CUDA device") };
        let b = x.dim(0)?;
        if b == 0 || b > batch {
            candle_core::bail!("CUDA graph for batches of {batch} captured from {b} pictures");
        }
        // `x`'s pictures in a buffer of `batch`, zeros after them
        let padded = || -> candle_core::Result<Tensor> {
            if b == batch {
                return x.contiguous()?.copy();
            }
            let mut dims = x.dims().to_vec();
            dims[0] = batch;
            let t = Tensor::zeros(dims, x.dtype(), x.device())?;
            t.slice_set(&x.contiguous()?, 0, 0)?;
            Ok(t)
        };
        let dev = dev.clone();
        let stream = dev.cuda_stream();
        let _cache = dev.enable_cuda_graph_htod_cache();
        // the warm passes run eagerly while the memory other graphs replay over is given back,
        // so that the two never need the device at once
        let msg = |what: &'static str| move |e: String| candle_core::Error::Msg(format!("CUDA graph: {what}: {e}"));
        crate::backend::arena::park_graph_region(x.device()).map_err(msg("giving the graph region back"))?;
        let warm = (|| {
            let input = padded()?;
            forward(&input, None)?;
            let y = forward(&input, None)?;
            let out = (y.dims().to_vec(), y.dtype());
            drop((input, y));
            stream.synchronize().map_err(derr("warm-up"))?;
            // the warm passes' activations, cached in the stream pool or mapped in the arena,
            // would otherwise sit beside the graph's own copy of them
            crate::backend::devmem::PeakMeter::new(x.device()).trim().map_err(|e| msg("trimming the pool")(e.to_string()))?;
            Ok::<_, candle_core::Error>(out)
        })();
        let unparked = crate::backend::arena::unpark_graph_region(x.device()).map_err(msg("the graph region"));
        let (out_dims, out_dtype) = warm?;
        unparked?;
        // the captured pass, its input and its output take addresses in the graph region, which
        // eager passes never use
        let region = crate::backend::arena::serve_graph(x.device());
        let input = padded()?;
        let output = Tensor::zeros(out_dims, out_dtype, x.device())?;
        stream.synchronize().map_err(derr("warm-up"))?;
        // a profiled pass (`bench --profile`) times the captured pass, whose events become
        // nodes of the graph, not the warm passes
        crate::backend::profile::forget_spans();
        stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(derr("begin capture"))?;
        // the capture must be ended whatever happens inside it, or the stream stays unusable
        let captured =
            forward(&input, Some(&output))
                .and_then(|y| if y.id() == output.id() { Ok(()) } else { output.slice_set(&y.contiguous()?, 0, 0) });
        let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
        drop(region);
        // the region's blocks go back for the next capture to reuse; only the graph's own input
        // and output may have been live (anything else would be overwritten by another graph)
        let live = crate::backend::arena::release_graph_region(x.device());
        captured?;
        let graph =
            graph.map_err(derr("end capture"))?.ok_or_else(|| candle_core::Error::Msg("CUDA graph capture recorded nothing".into()))?;
        if let Some(n) = live.filter(|&n| n != 2) {
            candle_core::bail!("CUDA graph capture left {n} blocks live in the graph region, not its input and output alone");
        }
        graph.upload().map_err(derr("upload"))?;
        let _hold = crate::backend::arena::hold_graph_region(x.device());
        Ok(Self { input, output, graph, thread: std::thread::current().id(), _hold })
    }

    /// The batch size it was captured for.
    pub fn batch(&self) -> usize {
        self.input.dims().first().copied().unwrap_or(0)
    }

    /// Whether this graph can run `x`: captured for pictures shaped and typed like those of `x`,
    /// for at least as many, on this thread.
    pub fn fits(&self, x: &Tensor) -> bool {
        x.dims().first().is_some_and(|&b| b >= 1 && b <= self.batch())
            && x.dims().get(1..) == self.input.dims().get(1..)
            && x.dtype() == self.input.dtype()
            && x.device().same_device(self.input.device())
            && std::thread::current().id() == self.thread
    }

    /// The forward pass of `x` (at most the captured batch of pictures shaped like the captured
    /// input's) by one graph launch: a copy of the output rows of `x`'s pictures.
    pub fn run(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.launch(x)?.copy()
    }

    /// Like [`run`](Self::run), without the copy: the output rows are a view of the graph's
    /// output buffer, which the next launch of any graph overwrites (graphs share their memory).
    /// Use it before launching again; copy what must outlive that.
    pub fn launch(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if std::thread::current().id() != self.thread {
            candle_core::bail!("CUDA graph captured on another thread");
        }
        if !self.fits(x) {
            candle_core::bail!("CUDA graph captured for {:?}, given {:?}", self.input.dims(), x.dims());
        }
        let b = x.dim(0)?;
        self.input.slice_set(&x.contiguous()?, 0, 0)?;
        self.graph.launch().map_err(derr("launch"))?;
        if b == self.batch() {
            Ok(self.output.clone())
        } else {
            self.output.narrow(0, 0, b)
        }
    }
}
