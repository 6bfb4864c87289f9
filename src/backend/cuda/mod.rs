//! The CUDA path of the acceleration layer: convolutions through cuDNN plans ([`cudnn`], with
//! feature `cudnn`; with their epilogue in one kernel where that pays: [`cudnn_fused`]), the
//! project's fused kernels (`kernels/*.cu`, compiled to PTX by `build.rs`:
//! conv [`epilogue`], CBFuse [`fuse`], channels-last [`pool`]ing and data movement ([`nhwc`]),
//! [`head`] decode, network [`input`] normalisation, score [`candidates`], the detection step's [`nms`]), one forward pass replayed as a CUDA
//! [`graph`], and JPEG pictures to the network input on the GPU ([`jpeg`]: nvJPEG decoding, then
//! the device [`letterbox`]; [`jpeg_selfcheck`] checks both on the machine that has the GPU).
//!
//! May use: candle's CUDA backend, cudarc, libloading (nvJPEG), [`super`]'s device-memory
//! modules, and `vision::preprocess` (the host letterbox the device one matches).

pub mod candidates;
#[cfg(feature = "cudnn")]
pub mod cudnn;
#[cfg(feature = "cudnn")]
pub mod cudnn_fused;
pub mod epilogue;
pub mod fuse;
pub mod graph;
pub mod head;
pub mod input;
pub mod jpeg;
pub mod jpeg_selfcheck;
pub mod letterbox;
pub mod nhwc;
pub mod nms;
pub mod pool;

/// The launch shape of the project's grid-stride kernels: `block` threads per block and enough
/// blocks for one thread per work unit, at most 2^20 (each thread then loops over the rest).
pub(crate) fn grid(units: usize, block: u32) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
    let blocks = units.div_ceil(block as usize).clamp(1, 1 << 20) as u32;
    candle_core::cuda_backend::cudarc::driver::LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}
