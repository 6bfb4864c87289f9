//! The f32 GEMM micro-kernel of the CPU convolution (AVX2 + FMA, chosen at run time) and the
//! layouts it reads:
//! - weights packed once at load time ([`PackedWeights`]): blocks of [`MR`] output channels,
//!   each stored `k`-major (`MR` values per `k`), zero rows padding the last block, so the
//!   per-call weight re-packing of a generic GEMM disappears;
//! - the im2col columns of a tile, written straight in panels of [`NR`] pixels (`NR` values per
//!   `k`) by `cpuconv`, so the kernel reads both operands contiguously.
//!
//! The kernel computes an `MR x NR` block of the NCHW output (`MR` channels, `NR` consecutive
//! pixels) in 12 AVX registers; the last block of a layer with fewer channels runs a 4- or
//! 2-row variant.

use candle_core::{bail, DType, Result, Tensor};

/// Output channels per kernel block.
pub const MR: usize = 6;
/// Pixels per kernel block (two 8-lane vectors).
pub const NR: usize = 16;
/// Reduction depth per pass over the output (keeps a weight block in L1/L2).
pub const KC: usize = 256;

/// A `(CO, CI, k, k)` f32 weight re-laid out for the kernel: `blocks` of `MR` channels, each
/// `kdim x MR` (`kdim = CI * k * k`, the weight's own `(ci, ki, kj)` order).
pub struct PackedWeights {
    pub co: usize,
    pub ci: usize,
    pub k: usize,
    pub kdim: usize,
    data: Vec<f32>,
}

impl std::fmt::Debug for PackedWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedWeights({}x{}x{}x{})", self.co, self.ci, self.k, self.k)
    }
}

impl PackedWeights {
    /// Packs an f32 CPU weight `(CO, CI, k, k)`.
    pub fn new(weight: &Tensor) -> Result<Self> {
        let (co, ci, k, k2) = weight.dims4()?;
        if k != k2 || weight.dtype() != DType::F32 || !weight.device().is_cpu() {
            bail!("PackedWeights: need a square f32 CPU weight, got {:?} {:?}", weight.dims(), weight.dtype());
        }
        let kdim = ci * k * k;
        let w = weight.flatten_all()?.to_vec1::<f32>()?;
        let blocks = co.div_ceil(MR);
        let mut data = vec![0f32; blocks * kdim * MR];
        for (o, row) in w.chunks_exact(kdim).enumerate() {
            let blk = &mut data[(o / MR) * kdim * MR..(o / MR + 1) * kdim * MR];
            for (kk, v) in row.iter().enumerate() {
                blk[kk * MR + o % MR] = *v;
            }
        }
        Ok(Self { co, ci, k, kdim, data })
    }

    /// Channel block `cb`, reduction rows `k0..` (`MR` values per row).
    pub fn block(&self, cb: usize, k0: usize) -> &[f32] {
        &self.data[cb * self.kdim * MR + k0 * MR..(cb + 1) * self.kdim * MR]
    }

    pub fn blocks(&self) -> usize {
        self.co.div_ceil(MR)
    }
}

/// Whether this CPU runs the AVX2 kernel.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `c[i * ldc + j] (+)= sum_k a[k * MR + i] * b[k * NR + j]` for `i < M` (`M <= MR`), `j < NR`:
/// `2 * M` accumulators, two loads of `b` and `M` broadcasts of `a` per `k` (`M = 6`: the
/// classic 6x16 AVX2 shape, 15 of the 16 registers).
///
/// # Safety
/// AVX2 and FMA must be available ([`available`]); `a` holds `kc * MR` values, `b` `kc * NR`,
/// and `c` is writable at `i * ldc + j` for `i < M`, `j < NR`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel<const M: usize>(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); 2]; M];
    for k in 0..kc {
        let b0 = _mm256_loadu_ps(b.add(k * NR));
        let b1 = _mm256_loadu_ps(b.add(k * NR + 8));
        for (i, row) in acc.iter_mut().enumerate() {
            let av = _mm256_broadcast_ss(&*a.add(k * MR + i));
            row[0] = _mm256_fmadd_ps(av, b0, row[0]);
            row[1] = _mm256_fmadd_ps(av, b1, row[1]);
        }
    }
    for (i, row) in acc.iter().enumerate() {
        for (j, v) in row.iter().enumerate() {
            let p = c.add(i * ldc + j * 8);
            let v = if accumulate { _mm256_add_ps(_mm256_loadu_ps(p), *v) } else { *v };
            _mm256_storeu_ps(p, v);
        }
    }
}

/// [`kernel`] with the smallest supported `M >= m`, writing to `c` directly when the block is
/// whole (`m == M`, `n == NR`), else through a local block of which `m x n` is stored.
///
/// # Safety
/// As [`block`].
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn dispatch(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, accumulate: bool, m: usize, n: usize) {
    let run = |c: *mut f32, ldc: usize, accumulate: bool| match m {
        5..=6 => kernel::<6>(kc, a, b, c, ldc, accumulate),
        3..=4 => kernel::<4>(kc, a, b, c, ldc, accumulate),
        _ => kernel::<2>(kc, a, b, c, ldc, accumulate),
    };
    if n == NR && matches!(m, 2 | 4 | 6) {
        return run(c, ldc, accumulate);
    }
    let mut tmp = [0f32; MR * NR];
    run(tmp.as_mut_ptr(), NR, false);
    for i in 0..m {
        let dst = std::slice::from_raw_parts_mut(c.add(i * ldc), n);
        let src = &tmp[i * NR..i * NR + n];
        if accumulate {
            dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
        } else {
            dst.copy_from_slice(src);
        }
    }
}

/// One `m x n` block (`1 <= m <= MR`, `n <= NR`) of `c (+)= a * b` over `kc` reduction rows.
///
/// # Safety
/// [`available`] must be true; `a` holds `kc * MR` values, `b` `kc * NR`, and `c` is writable at
/// `i * ldc + j` for `i < m`, `j < n`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn block(kc: usize, a: &[f32], b: &[f32], c: *mut f32, ldc: usize, accumulate: bool, m: usize, n: usize) {
    debug_assert!(a.len() >= kc * MR && b.len() >= kc * NR && (1..=MR).contains(&m) && n <= NR);
    #[cfg(target_arch = "x86_64")]
    {
        dispatch(kc, a.as_ptr(), b.as_ptr(), c, ldc, accumulate, m, n)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (kc, a, b, c, ldc, accumulate, m, n);
        unreachable!("cpukernel::block without AVX2")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_matches_naive() {
        if !available() {
            return;
        }
        let kc = 37;
        let a: Vec<f32> = (0..kc * MR).map(|i| (i % 7) as f32 - 3.0).collect();
        let b: Vec<f32> = (0..kc * NR).map(|i| (i % 5) as f32 * 0.5).collect();
        for (m, n) in [(MR, NR), (5, NR), (4, NR), (3, 9), (2, NR), (MR, 7), (1, 1)] {
            for acc in [false, true] {
                let ldc = 30;
                let mut c = vec![1f32; MR * ldc];
                // SAFETY: AVX2 checked above; c has MR rows of ldc >= NR values.
                unsafe { block(kc, &a, &b, c.as_mut_ptr(), ldc, acc, m, n) };
                for i in 0..MR {
                    for j in 0..ldc {
                        let want = if i < m && j < n { (0..kc).map(|k| a[k * MR + i] * b[k * NR + j]).sum::<f32>() + if acc { 1.0 } else { 0.0 } } else { 1.0 };
                        assert_eq!(c[i * ldc + j], want, "m{m} n{n} acc{acc} at {i},{j}");
                    }
                }
            }
        }
    }
}
