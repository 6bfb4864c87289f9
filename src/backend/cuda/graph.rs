//! One forward pass replayed as a CUDA graph: at batch 1 a forward is a few hundred small kernel
//! launches, and the host's launch rate, not the GPU, sets the latency.
//!
//! The graph is captured once per (batch, input shape) on the inference thread, after two warm
//! passes have planned every cuDNN convolution, built the head's anchors and filled candle's
//! cache of small host uploads (the layout arguments of its strided kernels, which cannot be
//! copied inside a capture). Its input and output live in fixed buffers: a call copies the
//! batch into the input buffer, launches the graph and returns a copy of the output buffer, so
//! a caller may keep the result across calls. The activations of the pass are allocated and
//! freed inside the graph, in CUDA's graph memory pool, which `crate::backend::devmem` adds to the stream
//! pool's figures (`devmem::graph_pool_reserved` reads it alone).
//!
//! Anything that fails (capture, instantiation, launch) is an error the caller answers by
//! running the pass eagerly (the detector then stops using graphs; after running out of memory,
//! for a minute).

use candle_core::cuda_backend::cudarc::driver::{sys, CudaGraph};
use candle_core::{Device, Tensor};

pub struct GraphedForward {
    /// Fixed input buffer `(B, 3, S, S)` the graph reads.
    input: Tensor,
    /// Fixed output buffer `(B, 4 + nc, A)` the graph writes.
    output: Tensor,
    graph: CudaGraph,
    /// The capturing thread: the graph's kernels read layout arguments from candle's
    /// thread-local upload cache, and candle's stream is that thread's per-thread stream, so
    /// the graph is only launched there.
    thread: std::thread::ThreadId,
}

// SAFETY: `CudaGraph` holds raw driver handles and is not thread safe. A `GraphedForward` is
// only used behind the detector's mutex, so no two threads touch the graph at once, and `run`
// refuses to launch it from any thread but the one that captured it.
unsafe impl Send for GraphedForward {}

fn derr(what: &str) -> impl Fn(candle_core::cuda_backend::cudarc::driver::DriverError) -> candle_core::Error + '_ {
    move |e| candle_core::Error::Msg(format!("CUDA graph {what}: {e}"))
}

impl GraphedForward {
    /// Captures the pass `forward` (a model's forward pass) for inputs shaped like `x`; it runs
    /// twice eagerly first, to warm everything up.
    pub fn capture(forward: impl Fn(&Tensor) -> candle_core::Result<Tensor>, x: &Tensor) -> candle_core::Result<Self> {
        let Device::Cuda(dev) = x.device() else { candle_core::bail!("CUDA graphs need a CUDA device") };
        let dev = dev.clone();
        let stream = dev.cuda_stream();
        let _cache = dev.enable_cuda_graph_htod_cache();
        let input = x.contiguous()?.copy()?;
        let output = forward(&input)?.contiguous()?.copy()?;
        output.slice_set(&forward(&input)?.contiguous()?, 0, 0)?;
        stream.synchronize().map_err(derr("warm-up"))?;
        if input.dim(0)? > 1 {
            // the warm passes' activations, cached in the stream pool, would otherwise sit beside
            // the graph's own copy of them when it is uploaded
            crate::backend::devmem::PeakMeter::new(x.device())
                .trim()
                .map_err(|e| candle_core::Error::Msg(format!("CUDA graph: trimming the pool: {e}")))?;
        }
        // the captured pass allocates in the graph's own pool, never in the arena: a graph keeps
        // the addresses it was given, and eager passes would reuse arena addresses
        let paused = crate::backend::arena::pause();
        stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(derr("begin capture"))?;
        // the capture must be ended whatever happens inside it, or the stream stays unusable
        let captured = forward(&input).and_then(|y| output.slice_set(&y.contiguous()?, 0, 0));
        let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
        drop(paused);
        captured?;
        let graph =
            graph.map_err(derr("end capture"))?.ok_or_else(|| candle_core::Error::Msg("CUDA graph capture recorded nothing".into()))?;
        graph.upload().map_err(derr("upload"))?;
        Ok(Self { input, output, graph, thread: std::thread::current().id() })
    }

    /// The batch size it was captured for.
    pub fn batch(&self) -> usize {
        self.input.dims().first().copied().unwrap_or(0)
    }

    /// Whether this graph was captured for inputs shaped and typed like `x`, on this thread.
    pub fn fits(&self, x: &Tensor) -> bool {
        x.dims() == self.input.dims()
            && x.dtype() == self.input.dtype()
            && x.device().same_device(self.input.device())
            && std::thread::current().id() == self.thread
    }

    /// The forward pass of `x` (shaped like the captured input) by one graph launch.
    pub fn run(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if std::thread::current().id() != self.thread {
            candle_core::bail!("CUDA graph captured on another thread");
        }
        self.input.slice_set(&x.contiguous()?, 0, 0)?;
        self.graph.launch().map_err(derr("launch"))?;
        self.output.copy()
    }
}
