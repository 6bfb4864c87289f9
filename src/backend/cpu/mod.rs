//! The CPU path of the acceleration layer: the model's f32 convolution on raw slices
//! ([`conv`]), the GEMM micro-kernel with weights packed at load time ([`kernel`]), the
//! detection head's decode ([`head`]) and pooling ([`pool`]).
//!
//! May use: the standard library, rayon, gemm, candle's CPU storage.

pub mod conv;
pub mod head;
pub mod kernel;
pub mod pool;
