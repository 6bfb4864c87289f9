//! The acceleration layer: everything that makes the model fast on a device, and nothing about
//! YOLOv9 itself.
//!
//! - [`device`]: device and dtype selection; [`devmem`]: what a device has free and what this
//!   process used at its peak; [`oom`]: recognising (and, for tests, injecting) out-of-memory.
//! - [`conv`]: the convolution entry point the model calls, dispatching per device and shape to
//!   [`cpu`] (raw-slice im2col + packed AVX2 GEMM) or [`cuda`] (cuDNN plans, fused kernels).
//! - [`upload`]: pictures to the device through pinned staging; [`arena`]: deterministic
//!   placement of a pass's activations (CUDA); [`profile`]: opt-in per-operation timing.
//! - [`tuning`]: the operator-tunable settings of this layer, with their defaults.
//!
//! May use: candle, cudarc, the standard library. Never imports the model, the detector or
//! anything above them: the model calls down into this layer, not the other way round.

pub mod arena;
pub mod conv;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod devmem;
pub mod oom;
pub mod profile;
pub mod tuning;
pub mod upload;
