//! The CPU path of the acceleration layer: the model's f32 convolution on raw slices
//! ([`conv`]), the GEMM micro-kernel with weights packed at load time ([`kernel`]), the
//! detection head's decode ([`head`]) and pooling ([`pool`]).
//!
//! May use: the standard library, rayon, gemm, candle's CPU storage.

pub mod conv;
pub mod head;
pub mod kernel;
pub mod pool;

use candle_core::{Storage, Tensor};

/// Whether `x` is an f32 tensor on the CPU, which the kernels here take.
pub fn is_cpu_f32(x: &Tensor) -> bool {
    x.device().is_cpu() && x.dtype() == candle_core::DType::F32
}

/// `f` of the values of each of `xs` (f32 tensors on the CPU, each made contiguous first, in
/// row-major order); an error of `f` becomes a candle error.
pub fn with_f32<T>(xs: &[&Tensor], f: impl FnOnce(&[&[f32]]) -> Result<T, String>) -> candle_core::Result<T> {
    let xs = xs.iter().map(|x| x.contiguous()).collect::<candle_core::Result<Vec<_>>>()?;
    let guards: Vec<_> = xs.iter().map(|x| x.storage_and_layout()).collect();
    let mut views = Vec::with_capacity(xs.len());
    for ((s, l), x) in guards.iter().zip(&xs) {
        match &**s {
            Storage::Cpu(c) => views.push(&c.as_slice::<f32>()?[l.start_offset()..][..l.shape().elem_count()]),
            _ => candle_core::bail!("an f32 CPU kernel given a tensor on {:?}", x.device()),
        }
    }
    f(&views).map_err(candle_core::Error::Msg)
}
