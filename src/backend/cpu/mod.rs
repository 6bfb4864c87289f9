//! The CPU path of the acceleration layer: the model's f32 convolution on raw slices
//! ([`conv`]) and the GEMM micro-kernel with weights packed at load time ([`kernel`]).
//!
//! May use: the standard library, rayon, gemm, candle's CPU storage.

pub mod conv;
pub mod kernel;
