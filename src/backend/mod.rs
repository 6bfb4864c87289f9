//! The acceleration layer: everything that makes the model fast on a device, and nothing about
//! YOLOv9 itself.
//!
//! - [`device`]: device and dtype selection; [`devmem`]: what a device has free and what this
//!   process used at its peak; [`hostmem`]: host memory under every cgroup limit above this
//!   process, and which limit binds (read from a root folder tests can fake); [`oom`]:
//!   recognising (and, for tests, injecting) out-of-memory.
//! - [`conv`]: the convolution entry point the model calls, dispatching per device and shape to
//!   [`cpu`] (raw-slice im2col + packed AVX2 GEMM) or [`cuda`] (cuDNN plans, fused kernels).
//! - [`upload`]: pictures to the device through pinned staging; `GpuJpeg` (CUDA): JPEG files
//!   decoded by nvJPEG and letterboxed on the device, the pictures it cannot take handed back to
//!   the host decoder; [`arena`]: deterministic placement of a pass's activations (CUDA);
//!   [`profile`]: opt-in per-operation timing; [`fusion_cache`]: the fused-convolution
//!   decisions kept between processes.
//! - [`tuning`]: the operator-tunable settings of this layer, with their defaults.
//!
//! The model and the detector use this layer through the names re-exported below; the
//! per-device modules `cpu` and `cuda` are private to it.
//!
//! May use: candle, cudarc, libloading (nvJPEG, loaded at run time), the standard library, and
//! `vision`'s plain types and host preprocessing (the device letterbox matches it). Never imports
//! the model, the detector or anything above them: the model calls down into this layer, not the
//! other way round.

pub mod arena;
pub mod conv;
mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
pub mod device;
pub mod devmem;
pub mod fusion_cache;
pub mod hostmem;
pub mod oom;
pub mod profile;
pub mod tuning;
pub mod upload;

pub use arena::serve as serve_arena;
pub use conv::{conv2d, cudnn_takes};
/// The model's fused f32 convolution on the CPU (im2col + packed GEMM + bias/SiLU/residual).
pub use cpu::conv::conv2d as cpu_fused_conv2d;
pub use cpu::head::{decode as cpu_head_decode, Level as CpuHeadLevel};
pub use cpu::kernel::{name as cpu_kernel_name, PackedWeights};
pub use cpu::pool::{avg_2x2_s1 as cpu_avg_pool_2x2_s1, max_padded as cpu_max_pool_padded};
/// `f` of the values of f32 CPU tensors, for the CPU kernels above.
pub use cpu::{is_cpu_f32, with_f32 as with_cpu_f32};
/// Channels-last convolution through a cuDNN plan (`None`: cuDNN cannot run this shape).
#[cfg(feature = "cudnn")]
pub use cuda::cudnn::conv2d as cudnn_conv2d;
/// Channels-last f16 convolution with its epilogue (bias, SiLU, residual, the write into a
/// concatenation) as one cuDNN kernel where that pays (`None`: not fused; the caller runs the
/// convolution and its epilogue).
#[cfg(feature = "cudnn")]
pub use cuda::cudnn_fused::{conv_bias_act as cudnn_conv_bias_act, ConvParams as CudnnConvParams, Out as CudnnOut};
#[cfg(feature = "cuda")]
pub use cuda::{
    candidates::candidate_rows as device_candidate_rows,
    epilogue::{bias_act, bias_act_into, bias_act_wide},
    fuse::add_upsampled,
    graph::GraphedForward,
    head::decode_level,
    input::normalize as normalize_input,
    nhwc,
    nms::{kept as device_nms, takes as device_nms_takes, verify as verify_device_nms},
    pool::pool as pool_nhwc,
};
#[cfg(feature = "cuda")]
pub use cuda::{
    jpeg::{Fallback, GpuJpeg, JpegError, JpegProfile, NvjpegStatus},
    jpeg_selfcheck::{jpeg_selfcheck, SelfCheck},
};
pub use upload::Uploader;
