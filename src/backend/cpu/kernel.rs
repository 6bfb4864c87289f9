//! The f32 GEMM micro-kernels of the CPU convolution (AVX-512, else AVX2 + FMA, chosen at run
//! time) and the layouts they read:
//! - weights packed once at load time ([`PackedWeights`]): blocks of [`MR`] output channels,
//!   each stored `k`-major (`MR` values per `k`), zero rows padding the last block, so the
//!   per-call weight re-packing of a generic GEMM disappears;
//! - the right-hand side either as the im2col columns of a tile, written straight in panels of
//!   [`NR`] pixels (`NR` values per `k`) by `cpuconv`, so the kernels read both operands
//!   contiguously; or, for stride-1 1x1 and 3x3 convolutions whose output is as large as their
//!   input, as the input itself ([`InPlace`], an indirect convolution): a reduction row of a
//!   panel is then `NR` consecutive input values at one offset from the panel's first pixel, and
//!   the lanes whose tap falls into the padding are masked off (AVX-512 mask registers, AVX2
//!   masked loads), which reads them as the zeros that im2col writes.
//!
//! A call computes `MR` channels of the NCHW output over [`Isa::panels`] panels: the AVX2
//! kernel one panel (`MR x NR` in 12 ymm registers; the last block of a layer with fewer
//! channels runs a 4- or 2-row variant), the AVX-512 kernel two (`MR x 2NR` in 12 zmm
//! registers, twice the multiply-adds per instruction; masked loads and stores for a partial
//! block).

use candle_core::{bail, DType, Result, Tensor};

/// Output channels per kernel block.
pub const MR: usize = 6;
/// Pixels per im2col panel (two 8-lane vectors, or one 16-lane vector).
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

/// The instruction sets the kernels are written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub enum Isa {
    /// AVX2 + FMA: `MR x NR` per call.
    Avx2,
    /// AVX-512 (foundation), with AVX2 + FMA as every such CPU has: `MR x 2NR` per call.
    Avx512,
}

impl Isa {
    /// The widest kernel this CPU runs, `None` where it has neither (the `gemm` crate's path).
    pub fn detect() -> Option<Isa> {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                let avx512 = std::arch::is_x86_feature_detected!("avx512f");
                return Some(if avx512 { Isa::Avx512 } else { Isa::Avx2 });
            }
        }
        None
    }

    /// Pixel panels one call of this kernel covers.
    pub fn panels(self) -> usize {
        match self {
            Isa::Avx2 => 1,
            Isa::Avx512 => 2,
        }
    }
}

/// Whether this CPU runs one of the kernels (so it has AVX2 and FMA at least).
pub fn available() -> bool {
    Isa::detect().is_some()
}

/// The convolution kernel this CPU runs, as `bench` reports it: `avx512`, `avx2`, or `gemm` (the
/// `gemm` crate, where neither runs).
pub fn name() -> &'static str {
    match Isa::detect() {
        Some(Isa::Avx512) => "avx512",
        Some(Isa::Avx2) => "avx2",
        None => "gemm",
    }
}

/// What the last reduction pass applies before storing: `act(v + bias[i]) (+ res[i * ldc + j])`
/// (`res` laid out like the output block). Read by the x86 kernels only.
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub struct Epilogue {
    pub bias: *const f32,
    pub act: bool,
    pub res: Option<*const f32>,
}

/// `exp(x)` for `x` clamped to `-87..=88` as a polynomial (Cephes `expf`, relative error ~1e-7)
/// that vectorises, unlike the libm call.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    let fx = (x * std::f32::consts::LOG2_E + 0.5).floor();
    let r = x - fx * 0.693_359_4 - fx * -2.121_944_4e-4;
    let y = ((((1.987_569_2e-4 * r + 1.398_2e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 1.666_666_5e-1) * r + 0.5;
    let y = y * r * r + r + 1.0;
    y * f32::from_bits(((fx as i32 + 127) as u32) << 23)
}

/// SiLU, `v / (1 + exp(-v))`, with the polynomial [`exp`].
#[inline(always)]
pub fn silu(v: f32) -> f32 {
    v / (1.0 + exp(-v))
}

/// [`silu`] on 8 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn silu8(v: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let s = _mm256_set1_ps;
    let x = _mm256_max_ps(_mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), v), s(88.0)), s(-87.0));
    let fx = _mm256_floor_ps(_mm256_fmadd_ps(x, s(std::f32::consts::LOG2_E), s(0.5)));
    let r = _mm256_fnmadd_ps(fx, s(-2.121_944_4e-4), _mm256_fnmadd_ps(fx, s(0.693_359_4), x));
    let mut y = _mm256_fmadd_ps(s(1.987_569_2e-4), r, s(1.398_2e-3));
    y = _mm256_fmadd_ps(y, r, s(8.333_452e-3));
    y = _mm256_fmadd_ps(y, r, s(4.166_579_6e-2));
    y = _mm256_fmadd_ps(y, r, s(1.666_666_5e-1));
    y = _mm256_fmadd_ps(y, r, s(0.5));
    y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r), s(1.0));
    let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23));
    _mm256_div_ps(v, _mm256_add_ps(s(1.0), _mm256_mul_ps(y, pow2)))
}

/// [`silu`] on 16 lanes (the same operations as [`silu8`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn silu16(v: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let s = _mm512_set1_ps;
    let x = _mm512_max_ps(_mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), v), s(88.0)), s(-87.0));
    let fx = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(_mm512_fmadd_ps(x, s(std::f32::consts::LOG2_E), s(0.5)));
    let r = _mm512_fnmadd_ps(fx, s(-2.121_944_4e-4), _mm512_fnmadd_ps(fx, s(0.693_359_4), x));
    let mut y = _mm512_fmadd_ps(s(1.987_569_2e-4), r, s(1.398_2e-3));
    y = _mm512_fmadd_ps(y, r, s(8.333_452e-3));
    y = _mm512_fmadd_ps(y, r, s(4.166_579_6e-2));
    y = _mm512_fmadd_ps(y, r, s(1.666_666_5e-1));
    y = _mm512_fmadd_ps(y, r, s(0.5));
    y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r), s(1.0));
    let pow2 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127))));
    _mm512_div_ps(v, _mm512_add_ps(s(1.0), _mm512_mul_ps(y, pow2)))
}

/// `c[i * ldc + j] (+)= sum_k a[k * MR + i] * B(k, j)` for `i < M` (`M <= MR`), `j < NR`:
/// `2 * M` accumulators, two loads of `B` and `M` broadcasts of `a` per `k` (`M = 6`: the
/// classic 6x16 AVX2 shape, 15 of the 16 registers). `B(k, j)` is `b[k * NR + j]` (a packed
/// panel), or with `IN_PLACE` the input value that `g` names, `g.addr[k] + g.at + j`, where lane
/// `j` of `lanes[g.taps[k]]` (`g.masks[0]` as vector masks) is set, zero elsewhere (the
/// masked-off lanes are not read).
///
/// # Safety
/// AVX2 and FMA must be available ([`available`]); `a` holds `kc * MR` values; `b` `kc * NR`
/// (packed), or `g.addr` and `g.taps` `kc` values, `lanes` 16 masks and every unmasked lane is
/// readable (in place); `c` is writable at `i * ldc + j` for `i < M`, `j < NR`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel<const M: usize, const IN_PLACE: bool>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    g: &Gather,
    lanes: *const [std::arch::x86_64::__m256i; 2],
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    epi: Option<Epilogue>,
) {
    // SAFETY: the caller guarantees AVX2/FMA, the extents of `a`, `b` (or `g` and `lanes`), `c`
    // and the epilogue pointers, and that every unmasked in-place lane is readable (see
    // # Safety); every offset below stays inside them, and a masked-off lane is not accessed.
    unsafe {
        use std::arch::x86_64::*;
        let mut acc = [[_mm256_setzero_ps(); 2]; M];
        for k in 0..kc {
            let (b0, b1) = if IN_PLACE {
                let l = &*lanes.add((*g.taps.add(k) & 15) as usize);
                let p = (*g.addr.add(k)).wrapping_add(g.at);
                (_mm256_maskload_ps(p, l[0]), _mm256_maskload_ps(p.wrapping_add(8), l[1]))
            } else {
                (_mm256_loadu_ps(b.add(k * NR)), _mm256_loadu_ps(b.add(k * NR + 8)))
            };
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*a.add(k * MR + i));
                row[0] = _mm256_fmadd_ps(av, b0, row[0]);
                row[1] = _mm256_fmadd_ps(av, b1, row[1]);
            }
        }
        for (i, row) in acc.iter().enumerate() {
            for (j, v) in row.iter().enumerate() {
                let p = c.add(i * ldc + j * 8);
                let mut v = if accumulate { _mm256_add_ps(_mm256_loadu_ps(p), *v) } else { *v };
                if let Some(e) = epi {
                    v = _mm256_add_ps(v, _mm256_broadcast_ss(&*e.bias.add(i)));
                    if e.act {
                        v = silu8(v);
                    }
                    if let Some(r) = e.res {
                        v = _mm256_add_ps(v, _mm256_loadu_ps(r.add(i * ldc + j * 8)));
                    }
                }
                _mm256_storeu_ps(p, v);
            }
        }
    }
}

/// `c[i * ldc + j] (+)= sum_k a[k * MR + i] * B(k, j)` for `i < M`, `j < n`
/// (`(P - 1) * NR < n <= P * NR`): `M x P` accumulators of 16 lanes, `P` loads of `B` and `M`
/// broadcasts of `a` per `k`; the columns past `n` are masked off (never written). `B(k, j)` is
/// `b[j / NR][k * NR + j % NR]` (packed panels), or with `IN_PLACE` the input value that `g`
/// names: `g.addr[k] + g.at + j` where bit `j % NR` of `g.masks[j / NR][g.taps[k]]` is set, zero
/// elsewhere (the masked-off lanes are not read).
///
/// # Safety
/// AVX-512F must be available; `a` holds `kc * MR` values; each `b[p]` `kc * NR` (packed), or
/// `g.addr` and `g.taps` `kc` values and every unmasked lane is readable (in place); `c` is
/// writable at `i * ldc + j` for `i < M`, `j < n` (as the epilogue's residual is readable).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel512<const M: usize, const P: usize, const IN_PLACE: bool>(
    kc: usize,
    a: *const f32,
    b: [*const f32; P],
    g: &Gather,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    n: usize,
    epi: Option<Epilogue>,
) {
    // SAFETY: the caller guarantees AVX-512F, the extents of `a`, `b` (or `g`), `c` and the
    // epilogue pointers, and that every unmasked in-place lane is readable (see # Safety); every
    // unmasked offset below stays inside them, and a masked-off lane is never accessed.
    unsafe {
        use std::arch::x86_64::*;
        let mut acc = [[_mm512_setzero_ps(); P]; M];
        for k in 0..kc {
            let bv: [__m512; P] = std::array::from_fn(|p| {
                if IN_PLACE {
                    let mask = g.masks[p][(*g.taps.add(k) & 15) as usize];
                    _mm512_maskz_loadu_ps(mask, (*g.addr.add(k)).wrapping_add(g.at + p * NR))
                } else {
                    _mm512_loadu_ps(b[p].add(k * NR))
                }
            });
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*a.add(k * MR + i));
                for (r, bp) in row.iter_mut().zip(&bv) {
                    *r = _mm512_fmadd_ps(av, *bp, *r);
                }
            }
        }
        for p in 0..P {
            let cols = n.saturating_sub(p * NR).min(NR);
            let mask: __mmask16 = if cols == NR { u16::MAX } else { (1u16 << cols) - 1 };
            for (i, row) in acc.iter().enumerate() {
                let at = i * ldc + p * NR;
                let mut v = if accumulate { _mm512_add_ps(_mm512_maskz_loadu_ps(mask, c.add(at)), row[p]) } else { row[p] };
                if let Some(e) = epi {
                    v = _mm512_add_ps(v, _mm512_set1_ps(*e.bias.add(i)));
                    if e.act {
                        v = silu16(v);
                    }
                    if let Some(r) = e.res {
                        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, r.add(at)));
                    }
                }
                _mm512_mask_storeu_ps(c.add(at), mask, v);
            }
        }
    }
}

/// [`kernel512`] for `m` rows (`1..=MR`) over one panel (`n <= NR`) or two.
///
/// # Safety
/// As [`kernel512`], with `b[1]` (packed) or the second panel's lanes (in place) read only for
/// `n > NR`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn dispatch512<const IN_PLACE: bool>(
    kc: usize,
    a: *const f32,
    b: [*const f32; 2],
    g: &Gather,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    m: usize,
    n: usize,
    epi: Option<Epilogue>,
) {
    macro_rules! rows {
        ($p:literal, $b:expr) => {
            match m {
                6 => kernel512::<6, $p, IN_PLACE>(kc, a, $b, g, c, ldc, accumulate, n, epi),
                5 => kernel512::<5, $p, IN_PLACE>(kc, a, $b, g, c, ldc, accumulate, n, epi),
                4 => kernel512::<4, $p, IN_PLACE>(kc, a, $b, g, c, ldc, accumulate, n, epi),
                3 => kernel512::<3, $p, IN_PLACE>(kc, a, $b, g, c, ldc, accumulate, n, epi),
                2 => kernel512::<2, $p, IN_PLACE>(kc, a, $b, g, c, ldc, accumulate, n, epi),
                _ => kernel512::<1, $p, IN_PLACE>(kc, a, $b, g, c, ldc, accumulate, n, epi),
            }
        };
    }
    // SAFETY: forwarded from the caller; the panel count matches `n`.
    unsafe {
        if n > NR {
            rows!(2, b)
        } else {
            rows!(1, [b[0]])
        }
    }
}

/// `masks` (one panel's lanes per tap) as the vector masks of [`kernel`]'s two 8-lane loads.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn lane_masks(masks: &[u16; 16]) -> [[std::arch::x86_64::__m256i; 2]; 16] {
    use std::arch::x86_64::*;
    let bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    std::array::from_fn(|t| {
        let half = |bits: u16| _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(i32::from(bits & 255)), bit), bit);
        [half(masks[t]), half(masks[t] >> 8)]
    })
}

/// [`kernel`] with the smallest supported `M >= m`, writing to `c` directly when the block is
/// whole (`m == M`, `n == NR`), else through a local block of which `m x n` is stored.
///
/// # Safety
/// As [`kernel`], with AVX2 and FMA available.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn dispatch<const IN_PLACE: bool>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    g: &Gather,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    m: usize,
    n: usize,
    epi: Option<Epilogue>,
) {
    // SAFETY: the caller guarantees what [`kernel`] requires; `tmp` holds MR x NR values and each
    // row copied back is the `n <= NR` columns of `c` that the caller made writable.
    unsafe {
        use std::arch::x86_64::_mm256_setzero_si256;
        let lanes = if IN_PLACE { lane_masks(&g.masks[0]) } else { [[_mm256_setzero_si256(); 2]; 16] };
        let run = |c: *mut f32, ldc: usize, accumulate: bool, epi: Option<Epilogue>| match m {
            5..=6 => kernel::<6, IN_PLACE>(kc, a, b, g, lanes.as_ptr(), c, ldc, accumulate, epi),
            3..=4 => kernel::<4, IN_PLACE>(kc, a, b, g, lanes.as_ptr(), c, ldc, accumulate, epi),
            _ => kernel::<2, IN_PLACE>(kc, a, b, g, lanes.as_ptr(), c, ldc, accumulate, epi),
        };
        if n == NR && matches!(m, 2 | 4 | 6) {
            return run(c, ldc, accumulate, epi);
        }
        let mut tmp = [0f32; MR * NR];
        run(tmp.as_mut_ptr(), NR, false, None);
        for i in 0..m {
            let dst = std::slice::from_raw_parts_mut(c.add(i * ldc), n);
            let src = &tmp[i * NR..i * NR + n];
            for (j, (d, s)) in dst.iter_mut().zip(src).enumerate() {
                let mut v = if accumulate { *d + s } else { *s };
                if let Some(e) = epi {
                    v += *e.bias.add(i);
                    if e.act {
                        v = silu(v);
                    }
                    if let Some(r) = e.res {
                        v += *r.add(i * ldc + j);
                    }
                }
                *d = v;
            }
        }
    }
}

/// One `m x n` block (`1 <= m <= MR`, `n <= b.len() * NR`) of `c (+)= a * b` over `kc`
/// reduction rows on `isa`'s kernel, then `epi` (on the last pass) before the store. `b` is the
/// pixel panels the block covers, at most `isa.panels()` of them, and no more than `n` needs.
///
/// # Safety
/// This CPU must run `isa` ([`Isa::detect`]); `c` must be writable at `i * ldc + j` for `i < m`,
/// `j < n`, `epi`'s bias readable at `i < m` and its residual at `i * ldc + j` (the operands'
/// extents are checked).
#[allow(clippy::too_many_arguments)]
pub unsafe fn block(
    isa: Isa,
    kc: usize,
    a: &[f32],
    b: &[&[f32]],
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    m: usize,
    n: usize,
    epi: Option<Epilogue>,
) {
    assert!(
        a.len() >= kc * MR
            && (1..=isa.panels()).contains(&b.len())
            && b.iter().all(|p| p.len() >= kc * NR)
            && (1..=MR).contains(&m)
            && (b.len() - 1) * NR < n
            && n <= b.len() * NR,
        "cpukernel: block {m}x{n} over {} panels of kc {kc}",
        b.len()
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: forwarded from the caller (see # Safety); the operand extents are asserted above.
    unsafe {
        match isa {
            Isa::Avx512 => {
                let b = [b[0].as_ptr(), b.get(1).map_or(std::ptr::null(), |p| p.as_ptr())];
                dispatch512::<false>(kc, a.as_ptr(), b, &Gather::NONE, c, ldc, accumulate, m, n, epi)
            }
            Isa::Avx2 => dispatch::<false>(kc, a.as_ptr(), b[0].as_ptr(), &Gather::NONE, c, ldc, accumulate, m, n, epi),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, kc, a, b, c, ldc, accumulate, m, n, epi);
        unreachable!("cpukernel::block without a kernel for this CPU")
    }
}

/// What the in-place kernel reads for one block (see [`kernel512`]): per reduction row the input
/// address of pixel 0's tap (`addr`; wrapping, it may lie outside the input) and the tap
/// (`taps`, the index into `masks`), the block's first pixel `at`, and per panel and tap the
/// lanes to read.
#[cfg(target_arch = "x86_64")]
struct Gather {
    addr: *const *const f32,
    taps: *const u8,
    at: usize,
    masks: [[u16; 16]; 2],
}

#[cfg(target_arch = "x86_64")]
impl Gather {
    /// The packed kernels' placeholder: nothing is read through it.
    const NONE: Gather = Gather { addr: std::ptr::null(), taps: std::ptr::null(), at: 0, masks: [[0; 16]; 2] };
}

/// The right-hand side of a stride-1 convolution whose output is as large as its input (`k` 1
/// or 3, padding `k / 2`), read in place from the input pictures instead of from an im2col copy
/// (an indirect convolution). With the pixels flattened (`q = oy * W + ox`, the same for input
/// and output), tap `(ky, kx)` of input channel `c` at pixel `q` is the input value at
/// `c * H * W + q + (ky - k / 2) * W + (kx - k / 2)`: one offset per reduction row, so a panel's
/// `NR` pixels are `NR` consecutive input values. The lanes whose tap falls into the padding
/// (where the offset wraps into the neighbouring row or channel, or out of the input) are masked
/// off and read as zero, which is what im2col writes there: both paths run the same
/// multiply-adds in the same order and give the same bits. A stride-2 3x3 convolution reads the
/// same way from its input split into phases ([`InPlace::phases`]), a copy as large as the input
/// instead of an im2col 2.25 times as large.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub struct InPlace<'a> {
    /// per reduction row (input part, channel, `ky`, `kx`: the packed weight's order), where
    /// pixel 0's tap would be, computed with wrapping arithmetic (it may point outside the input)
    addr: Vec<*const f32>,
    /// per reduction row: `ky * k + kx`
    taps: Vec<u8>,
    h: usize,
    w: usize,
    k: usize,
    /// whether taps below and right of the centre can fall into the padding (not so in the
    /// phase layout of [`InPlace::phases`])
    reach_after: bool,
    /// the output pixels whose taps read inside the input (all of them, or those of the rows a
    /// phase split holds)
    pixels: std::ops::Range<usize>,
    inputs: std::marker::PhantomData<&'a [f32]>,
}

// SAFETY: an `InPlace` only reads, through addresses derived from the shared slices it borrows
// for `'a` (as `&'a [f32]` is Send and Sync).
unsafe impl Send for InPlace<'_> {}
// SAFETY: as for Send.
unsafe impl Sync for InPlace<'_> {}

/// The lanes of one block of pixels that [`block_in_place`] reads: per panel and tap, the pixels
/// whose tap lies inside the picture (made by [`InPlace::masks`]).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub struct BlockMasks {
    at: usize,
    n: usize,
    geom: (usize, usize, usize, bool),
    masks: [[u16; 16]; 2],
}

impl<'a> InPlace<'a> {
    /// The reduction rows of `parts` (one picture's inputs, each `(values, channels)` with at
    /// least `channels * h * w` values), `None` unless `k` is 1 or 3 and every part holds all of
    /// its channels.
    pub fn new(parts: &[(&'a [f32], usize)], h: usize, w: usize, k: usize) -> Option<Self> {
        if !(k == 1 || k == 3) || parts.iter().any(|(x, c)| x.len() < c * h * w) {
            return None;
        }
        let (pad, plane) = ((k / 2) as isize, h * w);
        let rows = parts.iter().map(|(_, c)| c * k * k).sum();
        let (mut addr, mut taps) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
        for (x, c) in parts {
            for ch in 0..*c {
                for ky in 0..k {
                    for kx in 0..k {
                        let off = (ch * plane) as isize + (ky as isize - pad) * w as isize + kx as isize - pad;
                        addr.push(x.as_ptr().wrapping_offset(off));
                        taps.push((ky * k + kx) as u8);
                    }
                }
            }
        }
        Some(Self { addr, taps, h, w, k, reach_after: true, pixels: 0..h * w, inputs: std::marker::PhantomData })
    }

    /// The reduction rows of a stride-2 3x3 convolution with padding 1 over a picture with even
    /// sides, read from its phases: `split` holds rows `rows` of `channels * 4` planes of the
    /// output's size (`oh x ow`), plane `c * 4 + py * 2 + px` holding input pixels
    /// `(2y + py, 2x + px)`. Input row `2 * oy + ky - 1` is phase row `oy - 1` of the odd phase
    /// for `ky = 0`, row `oy` of the even phase for `ky = 1` and of the odd phase for `ky = 2`
    /// (columns alike), so every tap reads one plane shifted by 0 or -1 in each direction, and
    /// only taps `ky = 0` / `kx = 0` reach the padding (above / left). Output pixels of rows
    /// `rows.start + 1..rows.end` (all of them from row 0 where `rows` starts at 0) read inside
    /// `split`. `None` unless `split` holds all the planes' rows.
    pub fn phases(split: &'a [f32], channels: usize, oh: usize, ow: usize, rows: std::ops::Range<usize>) -> Option<Self> {
        let plane = rows.len() * ow;
        if rows.end > oh || split.len() < channels * 4 * plane {
            return None;
        }
        let (mut addr, mut taps) = (Vec::with_capacity(channels * 9), Vec::with_capacity(channels * 9));
        // per kernel row / column: (phase, shift)
        let at = |k: usize| if k == 1 { (0, 0isize) } else { (1, if k == 0 { -1 } else { 0 }) };
        for ch in 0..channels {
            for ky in 0..3 {
                for kx in 0..3 {
                    let ((py, dy), (px, dx)) = (at(ky), at(kx));
                    let off = ((ch * 4 + py * 2 + px) * plane) as isize + (dy - rows.start as isize) * ow as isize + dx;
                    addr.push(split.as_ptr().wrapping_offset(off));
                    taps.push((ky * 3 + kx) as u8);
                }
            }
        }
        let first = if rows.start == 0 { 0 } else { (rows.start + 1) * ow };
        let pixels = first..rows.end * ow;
        Some(Self { addr, taps, h: oh, w: ow, k: 3, reach_after: false, pixels, inputs: std::marker::PhantomData })
    }

    /// The lanes to read for output pixels `at..at + n` (`n <= 2 * NR`, among the pixels this
    /// source reads for: the picture, or the rows of a phase split; asserted):
    /// bit `j` of panel `p`'s mask for tap `(ky, kx)` is set where pixel `q = at + p * NR + j`
    /// is one of them and its tap's input pixel `(q / W + ky - k / 2, q % W + kx - k / 2)` lies
    /// inside the picture.
    pub fn masks(&self, at: usize, n: usize) -> BlockMasks {
        assert!(
            n <= 2 * NR && at >= self.pixels.start && at + n <= self.pixels.end,
            "cpukernel: pixels {at}+{n} outside {:?} of {}x{}",
            self.pixels,
            self.h,
            self.w
        );
        // per lane (bit j: pixel at + j): in the block, and in the picture's first / last row /
        // column (where the taps reaching above / below / left / right fall into the padding)
        let (mut top, mut bottom, mut left, mut right) = (0u32, 0u32, 0u32, 0u32);
        let (mut oy, mut ox) = (at / self.w, at % self.w);
        for j in 0..n {
            let bit = 1u32 << j;
            top |= if oy == 0 { bit } else { 0 };
            bottom |= if oy + 1 == self.h { bit } else { 0 };
            left |= if ox == 0 { bit } else { 0 };
            right |= if ox + 1 == self.w { bit } else { 0 };
            ox += 1;
            if ox == self.w {
                (oy, ox) = (oy + 1, 0);
            }
        }
        let valid = if n == 32 { u32::MAX } else { (1u32 << n) - 1 };
        // with padding k / 2 (0 or 1) only tap 0 reaches above / left, only tap k - 1 below / right
        let pad = self.k / 2;
        let off = |d: usize, before: u32, after: u32| match d.cmp(&pad) {
            std::cmp::Ordering::Less => before,
            std::cmp::Ordering::Greater if self.reach_after => after,
            _ => 0,
        };
        let mut masks = [[0u16; 16]; 2];
        for ky in 0..self.k {
            for kx in 0..self.k {
                let m = valid & !off(ky, top, bottom) & !off(kx, left, right);
                masks[0][ky * self.k + kx] = m as u16;
                masks[1][ky * self.k + kx] = (m >> 16) as u16;
            }
        }
        BlockMasks { at, n, geom: (self.h, self.w, self.k, self.reach_after), masks }
    }
}

/// [`block`] with the right-hand side read in place: reduction rows `k0..k0 + kc` of `src` at
/// the `bm.n` pixels of `bm` (at most `isa.panels()` panels of them), on `isa`'s kernel.
///
/// # Safety
/// This CPU must run `isa` ([`Isa::detect`]); `c` must be writable at `i * ldc + j` for
/// `i < m`, `j < bm.n`, `epi`'s bias readable at `i < m` and its residual at `i * ldc + j` (the
/// operands' extents are checked, and what is read of the input lies inside it by construction
/// of `src` and `bm`).
#[allow(clippy::too_many_arguments)]
pub unsafe fn block_in_place(
    isa: Isa,
    kc: usize,
    a: &[f32],
    src: &InPlace,
    k0: usize,
    bm: &BlockMasks,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    m: usize,
    epi: Option<Epilogue>,
) {
    assert!(
        a.len() >= kc * MR
            && k0 + kc <= src.addr.len()
            && bm.geom == (src.h, src.w, src.k, src.reach_after)
            && (1..=MR).contains(&m)
            && (1..=isa.panels() * NR).contains(&bm.n),
        "cpukernel: in-place block {m}x{} at rows {k0}+{kc}",
        bm.n
    );
    #[cfg(target_arch = "x86_64")]
    {
        let g = Gather { addr: src.addr[k0..].as_ptr(), taps: src.taps[k0..].as_ptr(), at: bm.at, masks: bm.masks };
        // SAFETY: the CPU runs `isa` and `c`, `epi` are as the caller guarantees; `g.addr` and
        // `g.taps` hold `kc` rows (asserted). Every lane the kernel reads is inside an input part:
        // a set bit of `bm` means pixel q = at + p * NR + j < at + n <= H * W (so its row oy =
        // q / W < H) whose tap's input pixel (iy, ix) lies inside the H x W picture, and for
        // reduction row (part, channel ch, ky, kx) the lane's address is
        // addr + q = part + ch * H * W + iy * W + ix with ch < channels and the part holding
        // channels * H * W values (`InPlace::new`), or, in the phase layout, the split rows
        // + plane * R * W + (iy - r0) * W + ix, the plane's (iy, ix) = (oy + dy, ox + dx) inside
        // it with dy, dx in {-1, 0}, r0 <= iy < r0 + R for the pixels `InPlace::phases` names
        // (which `masks` asserts) and every plane's R rows inside the split; `bm` was made for
        // this geometry (asserted).
        // Masked-off lanes are not accessed.
        unsafe {
            match isa {
                Isa::Avx512 => dispatch512::<true>(kc, a.as_ptr(), [std::ptr::null(); 2], &g, c, ldc, accumulate, m, bm.n, epi),
                Isa::Avx2 => dispatch::<true>(kc, a.as_ptr(), std::ptr::null(), &g, c, ldc, accumulate, m, bm.n, epi),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, kc, a, src, k0, bm, c, ldc, accumulate, m, epi);
        unreachable!("cpukernel::block_in_place without a kernel for this CPU")
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The kernels this CPU runs (both on an AVX-512 machine, so each is checked).
    pub(crate) fn isas() -> Vec<Isa> {
        let mut v = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                v.push(Isa::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                v.push(Isa::Avx512);
            }
        }
        v
    }

    /// The block shapes `(m, n)` a kernel takes: whole and partial in both directions.
    fn shapes(isa: Isa) -> Vec<(usize, usize)> {
        let mut v = vec![(MR, NR), (5, NR), (4, NR), (3, 9), (2, NR), (MR, 7), (1, 1)];
        if isa.panels() == 2 {
            v.extend([(MR, 2 * NR), (1, 2 * NR), (5, NR + 1), (3, 27), (MR, 31)]);
        }
        v
    }

    #[test]
    fn block_matches_naive() {
        let kc = 37;
        let a: Vec<f32> = (0..kc * MR).map(|i| (i % 7) as f32 - 3.0).collect();
        let panels: Vec<Vec<f32>> = (0..2).map(|p| (0..kc * NR).map(|i| ((i + 3 * p) % 5) as f32 * 0.5).collect()).collect();
        let bv = |k: usize, j: usize| panels[j / NR][k * NR + j % NR];
        for isa in isas() {
            for (m, n) in shapes(isa) {
                let b: Vec<&[f32]> = panels.iter().take(n.div_ceil(NR)).map(Vec::as_slice).collect();
                for acc in [false, true] {
                    let ldc = 40;
                    let mut c = vec![1f32; MR * ldc];
                    // SAFETY: the CPU runs `isa`; c has MR rows of ldc >= n values.
                    unsafe { block(isa, kc, &a, &b, c.as_mut_ptr(), ldc, acc, m, n, None) };
                    for i in 0..MR {
                        for j in 0..ldc {
                            let want = if i < m && j < n {
                                (0..kc).map(|k| a[k * MR + i] * bv(k, j)).sum::<f32>() + if acc { 1.0 } else { 0.0 }
                            } else {
                                1.0
                            };
                            assert_eq!(c[i * ldc + j], want, "{isa:?} m{m} n{n} acc{acc} at {i},{j}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn epilogue_matches_scalar() {
        let kc = 5;
        let a: Vec<f32> = (0..kc * MR).map(|i| ((i * 37) % 11) as f32 * 0.7 - 3.5).collect();
        let panels: Vec<Vec<f32>> = (0..2).map(|p| (0..kc * NR).map(|i| ((i * 13 + p) % 7) as f32 * 0.9 - 2.0).collect()).collect();
        let bv = |k: usize, j: usize| panels[j / NR][k * NR + j % NR];
        let bias: Vec<f32> = (0..MR).map(|i| i as f32 - 2.5).collect();
        let ldc = 36;
        let res: Vec<f32> = (0..MR * ldc).map(|i| (i % 9) as f32 * 0.25).collect();
        for isa in isas() {
            for (m, n) in shapes(isa) {
                let b: Vec<&[f32]> = panels.iter().take(n.div_ceil(NR)).map(Vec::as_slice).collect();
                for act in [false, true] {
                    let mut c = vec![0.5f32; MR * ldc];
                    let epi = Epilogue { bias: bias.as_ptr(), act, res: Some(res.as_ptr()) };
                    // SAFETY: the CPU runs `isa`; c and res have MR rows of ldc >= n values.
                    unsafe { block(isa, kc, &a, &b, c.as_mut_ptr(), ldc, true, m, n, Some(epi)) };
                    for i in 0..MR {
                        for j in 0..ldc {
                            let got = c[i * ldc + j];
                            if i >= m || j >= n {
                                assert_eq!(got, 0.5, "{isa:?} m{m} n{n}: wrote outside the block at {i},{j}");
                                continue;
                            }
                            let v = (0..kc).map(|k| a[k * MR + i] * bv(k, j)).sum::<f32>() + 0.5 + bias[i];
                            let want = if act { silu(v) } else { v } + res[i * ldc + j];
                            assert!(
                                (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                                "{isa:?} m{m} n{n} act{act} at {i},{j}: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn both_kernels_give_the_same_bits_on_whole_blocks() {
        if isas().len() < 2 {
            return;
        }
        let kc = 300;
        let a: Vec<f32> = (0..kc * MR).map(|i| ((i * 29) % 17) as f32 * 0.13 - 1.0).collect();
        let panels: Vec<Vec<f32>> = (0..2).map(|p| (0..kc * NR).map(|i| ((i * 7 + p) % 23) as f32 * 0.07 - 0.8).collect()).collect();
        let bias: Vec<f32> = (0..MR).map(|i| i as f32 * 0.3 - 1.0).collect();
        let ldc = 2 * NR;
        let res: Vec<f32> = (0..MR * ldc).map(|i| (i % 5) as f32 * 0.1).collect();
        for act in [false, true] {
            let epi = Some(Epilogue { bias: bias.as_ptr(), act, res: Some(res.as_ptr()) });
            let mut wide = vec![0.25f32; MR * ldc];
            let mut narrow = wide.clone();
            let b: Vec<&[f32]> = panels.iter().map(Vec::as_slice).collect();
            // SAFETY: both kernels checked above; c and res have MR rows of ldc = 2 * NR values.
            unsafe {
                block(Isa::Avx512, kc, &a, &b, wide.as_mut_ptr(), ldc, true, MR, 2 * NR, epi);
                for (p, panel) in b.iter().enumerate() {
                    let epi = Some(Epilogue { bias: bias.as_ptr(), act, res: Some(res.as_ptr().add(p * NR)) });
                    block(Isa::Avx2, kc, &a, &[panel], narrow.as_mut_ptr().add(p * NR), ldc, true, MR, NR, epi);
                }
            }
            assert!(wide.iter().zip(&narrow).all(|(x, y)| x.to_bits() == y.to_bits()), "act {act}");
        }
    }

    /// `block_in_place` against the plain sums over a zero-padded input, for every block of
    /// pictures of many shapes (1x1 and 3x3, one and two input parts, narrow and short pictures,
    /// reduction rows from the middle). The inputs sit between NaNs, so a lane read outside a
    /// part (a padding tap) would show; values are small integers, so the sums are exact.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn in_place_matches_naive() {
        let mut checked = 0;
        for &(h, w) in &[(1, 1), (1, 5), (2, 3), (2, 17), (3, 16), (5, 7), (4, 32), (7, 33), (9, 40), (6, 20), (1, 70)] {
            for k in [1, 3] {
                for chans in [vec![1], vec![2], vec![3, 2]] {
                    let plane = h * w;
                    // each part between NaNs, its values small integers
                    let bufs: Vec<Vec<f32>> = chans
                        .iter()
                        .enumerate()
                        .map(|(i, &c)| {
                            let mut v = vec![f32::NAN; c * plane + 2 * (w + 2)];
                            for (j, x) in v[w + 2..w + 2 + c * plane].iter_mut().enumerate() {
                                *x = ((j * 7 + i * 3) % 9) as f32 - 4.0;
                            }
                            v
                        })
                        .collect();
                    let parts: Vec<(&[f32], usize)> = bufs.iter().zip(&chans).map(|(b, &c)| (&b[w + 2..w + 2 + c * plane], c)).collect();
                    let src = InPlace::new(&parts, h, w, k).unwrap();
                    let kdim = chans.iter().sum::<usize>() * k * k;
                    // B(row, pixel): the tap's input value, zero in the padding
                    let tap = |row: usize, q: usize| {
                        let (mut r, mut part) = (row, 0);
                        while r >= chans[part] * k * k {
                            r -= chans[part] * k * k;
                            part += 1;
                        }
                        let (ch, ky, kx) = (r / (k * k), r % (k * k) / k, r % k);
                        let (iy, ix) = ((q / w + ky).wrapping_sub(k / 2), (q % w + kx).wrapping_sub(k / 2));
                        if iy < h && ix < w {
                            parts[part].0[ch * plane + iy * w + ix]
                        } else {
                            0.0
                        }
                    };
                    let a: Vec<f32> = (0..kdim * MR).map(|i| ((i * 5) % 7) as f32 - 3.0).collect();
                    for (isa, k0) in isas().into_iter().flat_map(|isa| [(isa, 0), (isa, kdim / 2)]) {
                        let kc = kdim - k0;
                        for at in (0..plane).step_by(isa.panels() * NR) {
                            let n = (isa.panels() * NR).min(plane - at);
                            let bm = src.masks(at, n);
                            for m in [MR, 5, 1] {
                                for acc in [false, true] {
                                    let ldc = 2 * NR + 3;
                                    let mut c = vec![1f32; MR * ldc];
                                    // SAFETY: the CPU runs `isa`; c has MR rows of ldc >= n values.
                                    unsafe { block_in_place(isa, kc, &a[k0 * MR..], &src, k0, &bm, c.as_mut_ptr(), ldc, acc, m, None) };
                                    for i in 0..MR {
                                        for j in 0..ldc {
                                            let want = if i < m && j < n {
                                                (k0..kdim).map(|r| a[r * MR + i] * tap(r, at + j)).sum::<f32>()
                                                    + if acc { 1.0 } else { 0.0 }
                                            } else {
                                                1.0
                                            };
                                            assert_eq!(
                                                c[i * ldc + j],
                                                want,
                                                "{h}x{w} k{k} {chans:?} rows {k0}.. at {at} m{m} acc{acc}: {i},{j}"
                                            );
                                        }
                                    }
                                    checked += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(checked > 500 * isas().len(), "{checked} blocks");
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn vector_silu_matches_scalar() {
        use std::arch::x86_64::*;
        let have = isas();
        for i in -2000..2000 {
            let v = i as f32 * 0.1;
            let want = v / (1.0 + (-v).exp());
            let mut got = Vec::new();
            if have.contains(&Isa::Avx2) {
                let mut out = [0f32; 8];
                // SAFETY: AVX2 checked above.
                unsafe { _mm256_storeu_ps(out.as_mut_ptr(), silu8(_mm256_set1_ps(v))) };
                got.push(("silu8", out[0]));
            }
            if have.contains(&Isa::Avx512) {
                let mut out = [0f32; 16];
                // SAFETY: AVX-512F checked above.
                unsafe { _mm512_storeu_ps(out.as_mut_ptr(), silu16(_mm512_set1_ps(v))) };
                got.push(("silu16", out[0]));
            }
            for (name, got) in got {
                assert!((got - want).abs() <= 2e-6 * want.abs() + 1e-12, "{name}({v}) = {got}, want {want}");
            }
        }
    }
}
