//! The model's f32 convolution on the CPU, on raw slices: GEMM straight into the NCHW output ->
//! bias + SiLU (+ residual) in one pass while the output is still in cache. The result is
//! wrapped in a `Tensor` once.
//!
//! Going through candle's element-wise ops instead costs a full pass over memory per op (bias add,
//! SiLU, residual add, concat), each behind candle's spinning barrier pool, and candle's `conv2d`
//! re-lays out input and kernel on every call. Here:
//! - the GEMM runs on the packed-weight micro-kernels ([`cpukernel`]) where the CPU has AVX2 or
//!   AVX-512; their right-hand side is read in place from the input for stride-1 1x1 and 3x3
//!   convolutions whose output is as large as their input (an indirect convolution,
//!   [`InPlace`]: no copy), for stride-2 3x3 ones from the input rows of the tile split into
//!   their four phases (a copy as large as those rows, read the same way), else from an im2col
//!   copy of the tile written in the kernel's panels;
//! - without AVX2 the `gemm` crate runs it: im2col (skipped for 1x1, which reads each picture's
//!   `(C, H*W)` block as the GEMM's right-hand side) -> GEMM -> epilogue;
//! - several inputs of a 1x1 convolution are a concatenation that is never materialised: each one
//!   is a slice of the weight's columns, accumulated into the same output (ELAN, RepCSP, SPPELAN);
//! - inputs that are channel slices (`narrow` on dim 1) of a contiguous tensor are read in place;
//! - the output is cut into tiles of output pixels (of one picture, all channels) sized so that
//!   the tile's im2col columns stay in L2; each tile runs (im2col ->) single-threaded GEMM ->
//!   epilogue while its data is in cache, and tiles (of all pictures of the batch) are spread over
//!   rayon's threads: no synchronisation inside a layer, no batch transposes;
//! - the im2col (or phase) buffer is reused per thread instead of being allocated per call.

use std::cell::RefCell;

use candle_core::{bail, DType, Device, Result, Storage, Tensor};
use gemm::{gemm, Parallelism};

use crate::backend::cpu::kernel::{self as cpukernel, silu, Epilogue, InPlace, Isa, PackedWeights, KC, MR, NR};
use rayon::prelude::*;

/// The per-picture view of a `(B, C, H, W)` f32 CPU tensor whose pictures are each contiguous
/// (contiguous tensors and channel slices of them).
struct Images<'a> {
    data: &'a [f32],
    start: usize,
    batch_stride: usize,
    len: usize,
}

impl Images<'_> {
    fn image(&self, i: usize) -> &[f32] {
        let s = self.start + i * self.batch_stride;
        &self.data[s..s + self.len]
    }
}

/// `x` itself when each picture is one contiguous block, else a contiguous copy.
fn image_major(x: &Tensor) -> Result<Tensor> {
    let (_, c, h, w) = x.dims4()?;
    let st = x.stride();
    if st[3] == 1 && st[2] == w && st[1] == h * w || c * h * w <= 1 {
        Ok(x.clone())
    } else {
        x.contiguous()
    }
}

fn f32_slice(storage: &Storage) -> Result<&[f32]> {
    match storage {
        Storage::Cpu(s) => s.as_slice::<f32>(),
        _ => bail!("cpuconv: tensor is not on the CPU"),
    }
}

thread_local! {
    /// im2col buffer of this thread, grown as needed and kept between calls.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's scratch buffer of at least `len` elements (contents unspecified).
/// The buffer is taken out of the thread-local for the call, so a re-entrant call (rayon work
/// stealing) just gets a fresh one.
fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let mut buf = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    let r = f(&mut buf[..len]);
    SCRATCH.with(|s| *s.borrow_mut() = buf);
    r
}

/// Geometry of one convolution.
#[derive(Clone, Copy, Debug)]
struct Geom {
    ci: usize,
    h: usize,
    w: usize,
    co: usize,
    k: usize,
    s: usize,
    p: usize,
    oh: usize,
    ow: usize,
}

impl Geom {
    fn is_pointwise(&self) -> bool {
        self.k == 1 && self.s == 1 && self.p == 0
    }
}

/// im2col of output rows `rows` of one picture's channel `x` (`(H, W)`) into `cols`
/// (`(k*k, rows.len()*OW)`, in the weight's `(ki, kj)` order), every element written (zeros for
/// the padding).
fn im2col_channel(x: &[f32], cols: &mut [f32], g: &Geom, rows: std::ops::Range<usize>) {
    let (h, w, k, s, ow) = (g.h, g.w, g.k, g.s, g.ow);
    let p = g.p as isize;
    let nb = rows.len() * ow;
    for ki in 0..k {
        for kj in 0..k {
            let row = &mut cols[(ki * k + kj) * nb..(ki * k + kj + 1) * nb];
            // output columns whose input column `ox*s + kj - p` is inside 0..w
            let dx = kj as isize - p;
            let ox0 = if dx >= 0 { 0 } else { ((-dx) as usize).div_ceil(s).min(ow) };
            let ox1 = if (w as isize) > dx { ((w as isize - dx - 1) as usize / s + 1).min(ow) } else { 0 };
            for (r, oy) in rows.clone().enumerate() {
                let out = &mut row[r * ow..(r + 1) * ow];
                let iy = (oy * s + ki) as isize - p;
                if iy < 0 || iy >= h as isize || ox0 >= ox1 {
                    out.fill(0.0);
                    continue;
                }
                let src = &x[iy as usize * w..(iy as usize + 1) * w];
                out[..ox0].fill(0.0);
                out[ox1..].fill(0.0);
                let first = ((ox0 * s) as isize + dx) as usize;
                if s == 1 {
                    out[ox0..ox1].copy_from_slice(&src[first..first + (ox1 - ox0)]);
                } else {
                    for (o, v) in out[ox0..ox1].iter_mut().zip(src[first..].iter().step_by(s)) {
                        *o = *v;
                    }
                }
            }
        }
    }
}

/// `row = act(row + b) (+ res)` over one output channel of one picture.
#[inline(always)]
fn epilogue_row_generic(row: &mut [f32], b: f32, act: bool, res: Option<&[f32]>) {
    match (act, res) {
        (true, None) => row.iter_mut().for_each(|v| *v = silu(*v + b)),
        (true, Some(r)) => row.iter_mut().zip(r).for_each(|(v, r)| *v = silu(*v + b) + r),
        (false, None) => row.iter_mut().for_each(|v| *v += b),
        (false, Some(r)) => row.iter_mut().zip(r).for_each(|(v, r)| *v = *v + b + r),
    }
}

/// The same loop compiled for AVX2 + FMA (8 lanes; the crate's baseline target is SSE2).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn epilogue_row_avx2(row: &mut [f32], b: f32, act: bool, res: Option<&[f32]>) {
    epilogue_row_generic(row, b, act, res)
}

fn epilogue_row(row: &mut [f32], b: f32, act: bool, res: Option<&[f32]>) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports the features the function is compiled for (checked just above).
        return unsafe { epilogue_row_avx2(row, b, act, res) };
    }
    epilogue_row_generic(row, b, act, res)
}

/// The output buffer of one layer, shared by its tiles.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every tile writes a disjoint set of elements (its own pixel columns of its own picture).
unsafe impl Send for OutPtr {}
// SAFETY: as for Send: tiles never write the same element, and nothing reads while they write.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// # Safety
    /// `off` must stay inside the allocation.
    unsafe fn add(self, off: usize) -> Self {
        // SAFETY: the caller keeps `off` inside the allocation.
        Self(unsafe { self.0.add(off) })
    }
}

/// One tile: output rows `rows` of one picture, all channels. im2col of just those pixels (kept
/// in cache), GEMM(s) into the tile's columns of `dst` (the picture's `(CO, OH*OW)` block), then
/// the epilogue on the tile while it is still in cache. Single-threaded: tiles are the unit of
/// parallelism.
#[allow(clippy::too_many_arguments)]
fn conv_tile(
    parts: &[(&[f32], usize)],
    wt: &[f32],
    bias: &[f32],
    g: &Geom,
    act: bool,
    res: Option<&[f32]>,
    dst: OutPtr,
    rows: std::ops::Range<usize>,
) {
    let n = g.oh * g.ow;
    let (p0, p1) = (rows.start * g.ow, rows.end * g.ow);
    let nb = p1 - p0;
    let kdim = g.ci * g.k * g.k;
    // SAFETY: `dst` points at a picture's CO * n elements and p0 < p1 <= n (this and the
    // pointer arithmetic below stay inside them).
    let tile = unsafe { dst.0.add(p0) };
    let run_gemm = |k: usize, lhs: &[f32], rhs: &[f32], rhs_rs: usize, accumulate: bool| {
        assert!(rhs.len() >= (k - 1) * rhs_rs + nb && lhs.len() >= (g.co - 1) * kdim + k);
        // SAFETY: dst is CO rows of `nb` values `n` apart (this tile's columns, written by no
        // other tile), lhs is CO rows of `k` values `kdim` apart (columns of the weight matrix),
        // rhs is `k` rows of `nb` values `rhs_rs` apart; the slices cover those extents (asserted
        // above). With `accumulate == false`, gemm writes dst without reading it.
        unsafe {
            gemm(
                g.co,
                nb,
                k,
                tile,
                1,
                n as isize,
                accumulate,
                lhs.as_ptr(),
                1,
                kdim as isize,
                rhs.as_ptr(),
                1,
                rhs_rs as isize,
                1.0,
                1.0,
                false,
                false,
                false,
                Parallelism::None,
            )
        }
    };
    if g.is_pointwise() {
        let mut c0 = 0;
        for (i, (x, c)) in parts.iter().enumerate() {
            run_gemm(*c, &wt[c0..], &x[p0..], n, i > 0);
            c0 += c;
        }
    } else {
        let (x, plane, taps) = (parts[0].0, g.h * g.w, g.k * g.k * nb);
        with_scratch(kdim * nb, |cols| {
            for (c, out) in cols.chunks_mut(taps).enumerate() {
                im2col_channel(&x[c * plane..(c + 1) * plane], out, g, rows.clone());
            }
            run_gemm(kdim, wt, cols, nb, false);
        });
    }
    for (c, &b) in bias.iter().enumerate().take(g.co) {
        // SAFETY: this tile's columns of channel c, fully written by the GEMM above.
        let row = unsafe { std::slice::from_raw_parts_mut(tile.add(c * n), nb) };
        epilogue_row(row, b, act, res.map(|r| &r[c * n + p0..c * n + p1]));
    }
}

/// Writes `out[i] = x_row[(ox0 + i) * s + dx]` for one input row `x_row` (`None`: a padding
/// row), zero outside `valid` (the output columns whose input column is inside the row).
fn fill_segment(out: &mut [f32], x_row: Option<&[f32]>, ox0: usize, s: usize, dx: isize, valid: (usize, usize)) {
    let Some(src) = x_row else {
        out.fill(0.0);
        return;
    };
    let len = out.len();
    let (a, b) = (valid.0.clamp(ox0, ox0 + len) - ox0, valid.1.clamp(ox0, ox0 + len) - ox0);
    if a >= b {
        out.fill(0.0);
        return;
    }
    let first = (((ox0 + a) * s) as isize + dx) as usize;
    if s == 1 && a == 0 && b == NR {
        // the common case: a whole panel row inside the picture, copied with a fixed size
        if let (Ok(o), Some(Ok(v))) = (<&mut [f32; NR]>::try_from(&mut *out), src.get(first..first + NR).map(<&[f32; NR]>::try_from)) {
            *o = *v;
            return;
        }
    }
    out[..a].fill(0.0);
    out[b..].fill(0.0);
    if s == 1 {
        out[a..b].copy_from_slice(&src[first..first + (b - a)]);
    } else {
        for (o, v) in out[a..b].iter_mut().zip(src[first..].iter().step_by(s)) {
            *o = *v;
        }
    }
}

/// im2col of output pixels `p0..p1` (flattened `oy * OW + ox`) of one picture's channel `x`
/// (`(H, W)`) into the kernel's panels `cols` (`NR` pixels per panel, `kdim x NR` values each),
/// at reduction rows `k_base..k_base + k*k`. Pixels past `p1` in the last panel are left as they
/// are (their results are never stored).
fn im2col_panels(x: &[f32], cols: &mut [f32], g: &Geom, k_base: usize, kdim: usize, p0: usize, p1: usize) {
    let (h, w, k, s, ow) = (g.h, g.w, g.k, g.s, g.ow);
    let p = g.p as isize;
    for ki in 0..k {
        for kj in 0..k {
            let kr = k_base + ki * k + kj;
            let dx = kj as isize - p;
            // output columns ox with 0 <= ox*s + dx < w
            let lo = if dx >= 0 { 0 } else { ((-dx) as usize).div_ceil(s) };
            let hi = if (w as isize) > dx { ((w as isize - dx - 1) as usize / s + 1).min(ow) } else { 0 };
            let (mut q, mut oy, mut ox) = (p0, p0 / ow, p0 % ow);
            while q < p1 {
                let row_end = (q + ow - ox).min(p1);
                let iy = (oy * s + ki) as isize - p;
                let x_row = if iy >= 0 && iy < h as isize { Some(&x[iy as usize * w..(iy as usize + 1) * w]) } else { None };
                // split the row's pixels at panel boundaries
                let mut r = q;
                while r < row_end {
                    let (panel, off) = ((r - p0) / NR, (r - p0) % NR);
                    let len = (NR - off).min(row_end - r);
                    let at = panel * kdim * NR + kr * NR + off;
                    fill_segment(&mut cols[at..at + len], x_row, ox + (r - q), s, dx, (lo, hi));
                    r += len;
                }
                (q, oy, ox) = (row_end, oy + 1, 0);
            }
        }
    }
}

/// One tile through `isa`'s packed-weight kernel (which this CPU runs): output pixels `p0..p1`
/// of one picture, all channels, in `KC`-deep passes of the kernel over (pixel blocks x channel
/// block), the epilogue fused into the last pass's stores. The right-hand side is read in place
/// from the inputs where `in_place` is given (stride 1, output as large as the input, 1x1 or
/// 3x3); with `phases` (stride-2 3x3 with padding 1, even sides, one input part) from the rows
/// of the input's phases that the tile reads, split into this thread's scratch (as many values
/// as those input rows); else from an im2col copy of every input part in this thread's scratch
/// (panels, the kernel's contiguous layout).
#[allow(clippy::too_many_arguments)]
fn conv_tile_packed(
    isa: Isa,
    in_place: Option<&InPlace>,
    phases: bool,
    parts: &[(&[f32], usize)],
    pw: &PackedWeights,
    bias: &[f32],
    g: &Geom,
    act: bool,
    res: Option<&[f32]>,
    dst: OutPtr,
    p0: usize,
    p1: usize,
) {
    let n = g.oh * g.ow;
    let kdim = pw.kdim;
    let step = isa.panels();
    // `run(k0, kc, q, nv, cb, epi)` for every pass (reduction rows k0..k0 + kc), pixel block
    // (pixels q..q + nv) and channel block cb, in that loop order
    let passes = |run: &mut dyn FnMut(usize, usize, usize, usize, usize, Option<Epilogue>)| {
        for k0 in (0..kdim).step_by(KC) {
            let kc = KC.min(kdim - k0);
            for q in (p0..p1).step_by(step * NR) {
                let nv = (step * NR).min(p1 - q);
                for cb in 0..pw.blocks() {
                    let c0 = cb * MR;
                    // the last pass adds bias, SiLU and residual before storing
                    let epi =
                        (k0 + kc == kdim).then(|| Epilogue { bias: bias[c0..].as_ptr(), act, res: res.map(|r| r[c0 * n + q..].as_ptr()) });
                    run(k0, kc, q, nv, cb, epi);
                }
            }
        }
    };
    let read_in_place = |src: &InPlace| {
        let mut masks = src.masks(p0, 0);
        passes(&mut |k0, kc, q, nv, cb, epi| {
            if cb == 0 {
                masks = src.masks(q, nv);
            }
            let (c0, mv) = (cb * MR, MR.min(g.co - cb * MR));
            // SAFETY: this CPU runs `isa`'s kernel (detected by the caller); the block is
            // channels c0.. (mv of them) x pixels q..q+nv of this picture, inside its CO x n
            // block and written by no other tile; bias has CO values and the residual is shaped
            // like the output.
            unsafe { cpukernel::block_in_place(isa, kc, pw.block(cb, k0), src, k0, &masks, dst.0.add(c0 * n + q), n, k0 > 0, mv, epi) };
        });
    };
    if let Some(src) = in_place {
        return read_in_place(src);
    }
    if let (true, [(x, c)]) = (phases, parts) {
        // phase rows from the one above the tile's first output row to its last
        let rows = (p0 / g.ow).saturating_sub(1)..(p1 - 1) / g.ow + 1;
        return with_scratch(c * 4 * rows.len() * g.ow, |buf| {
            split_phases(x, *c, g.h, g.w, rows.clone(), buf);
            let src = InPlace::phases(buf, *c, g.oh, g.ow, rows).expect("the scratch holds the tile's phase rows");
            read_in_place(&src);
        });
    }
    let (kk, plane) = (g.k * g.k, g.h * g.w);
    let panels = (p1 - p0).div_ceil(NR);
    with_scratch(panels * kdim * NR, |cols| {
        let mut k_base = 0;
        for (x, c) in parts {
            for ch in 0..*c {
                im2col_panels(&x[ch * plane..(ch + 1) * plane], cols, g, k_base + ch * kk, kdim, p0, p1);
            }
            k_base += c * kk;
        }
        passes(&mut |k0, kc, q, nv, cb, epi| {
            let j = (q - p0) / NR;
            let panel = |j: usize| &cols[j * kdim * NR + k0 * NR..j * kdim * NR + (k0 + kc) * NR];
            let pair = [panel(j), if nv > NR { panel(j + 1) } else { &[] }];
            let b = &pair[..nv.div_ceil(NR)];
            let (c0, mv) = (cb * MR, MR.min(g.co - cb * MR));
            // SAFETY: this CPU runs `isa`'s kernel (detected by the caller); the block is
            // channels c0.. (mv of them) x pixels q..q+nv of this picture, inside its
            // CO x n block and written by no other tile; bias has CO values and the
            // residual is shaped like the output.
            unsafe { cpukernel::block(isa, kc, pw.block(cb, k0), b, dst.0.add(c0 * n + q), n, k0 > 0, mv, nv, epi) };
        });
    });
}

/// Rows `rows` of the four phases of each of the `channels` `h x w` planes of `x` (`h`, `w`
/// even), written to `out` as [`InPlace::phases`] reads them: plane `c * 4 + py * 2 + px`, rows
/// `rows` of the pixels `(2y + py, 2x + px)`.
fn split_phases(x: &[f32], channels: usize, h: usize, w: usize, rows: std::ops::Range<usize>, out: &mut [f32]) {
    let ow = w / 2;
    let plane = rows.len() * ow;
    for (src, dst) in x.chunks_exact(h * w).take(channels).zip(out.chunks_exact_mut(4 * plane)) {
        let (even, odd) = dst.split_at_mut(2 * plane);
        for (py, phase) in [(0, even), (1, odd)] {
            let (p0, p1) = phase.split_at_mut(plane);
            for (r, y) in rows.clone().enumerate() {
                let row = &src[(2 * y + py) * w..][..w];
                let (d0, d1) = (&mut p0[r * ow..][..ow], &mut p1[r * ow..][..ow]);
                for ((pair, a), b) in row.chunks_exact(2).zip(d0).zip(d1) {
                    (*a, *b) = (pair[0], pair[1]);
                }
            }
        }
    }
}

/// Pixels per tile of the packed path: im2col panels of about 256 KiB (half of L2), a whole
/// number of kernel blocks (`NR` pixels a panel, `panels` panels a block), and at least two tiles
/// per thread over the batch.
fn tile_pixels(kdim: usize, n: usize, b: usize, threads: usize, panels: usize) -> usize {
    let mut per_pic = n.div_ceil(((1usize << 16) / kdim).clamp(NR, 4096));
    per_pic = per_pic.max((2 * threads).div_ceil(b));
    (n.div_ceil(per_pic)).div_ceil(panels * NR) * panels * NR
}

/// Output rows per tile: im2col columns of about 512 KiB (L2), but at least two tiles per thread.
fn tile_rows(g: &Geom, b: usize, threads: usize) -> usize {
    let kdim = (g.ci * g.k * g.k).max(g.co);
    let cols = ((1usize << 17) / kdim).clamp(256, 8192);
    let mut rows = (cols / g.ow).clamp(1, g.oh);
    let want = 2 * threads;
    if b * g.oh.div_ceil(rows) < want {
        rows = (b * g.oh).div_ceil(want).clamp(1, g.oh);
    }
    rows
}

/// `act(conv2d(cat(inputs, 1), weight) + bias) (+ residual)` for f32 CPU tensors, groups 1,
/// NCHW. Several inputs (a channel concatenation) only for 1x1 stride-1 unpadded convolutions.
/// `weight` is `(CO, CI, k, k)`, `bias` `(CO)`, `residual` (if any) shaped like the output.
/// With `packed` (the same weight, packed at load time) and an AVX2 or AVX-512 CPU, the convolution runs on
/// the packed-weight kernel ([`cpukernel`]), else on the `gemm` crate.
#[allow(clippy::too_many_arguments)]
pub fn conv2d(
    inputs: &[&Tensor],
    weight: &Tensor,
    packed: Option<&PackedWeights>,
    bias: &Tensor,
    stride: usize,
    padding: usize,
    act: bool,
    residual: Option<&Tensor>,
) -> Result<Tensor> {
    fused(inputs, weight, packed, bias, stride, padding, act, residual, Isa::detect(), true)
}

/// [`conv2d`] on the packed kernel of `isa` (which this CPU must run; `None`: the `gemm` crate),
/// with its in-place reading allowed or not (the tests compare both).
#[allow(clippy::too_many_arguments)]
fn fused(
    inputs: &[&Tensor],
    weight: &Tensor,
    packed: Option<&PackedWeights>,
    bias: &Tensor,
    stride: usize,
    padding: usize,
    act: bool,
    residual: Option<&Tensor>,
    isa: Option<Isa>,
    in_place: bool,
) -> Result<Tensor> {
    let (co, ci, k, k2) = weight.dims4()?;
    let Some(first) = inputs.first() else { bail!("cpuconv: no input") };
    let (b, _, h, w) = first.dims4()?;
    if k != k2 || stride == 0 || h + 2 * padding < k || w + 2 * padding < k {
        bail!("cpuconv: weight {:?} does not fit input {:?} (stride {stride}, padding {padding})", weight.dims(), first.dims());
    }
    let g = Geom { ci, h, w, co, k, s: stride, p: padding, oh: (h + 2 * padding - k) / stride + 1, ow: (w + 2 * padding - k) / stride + 1 };
    if inputs.len() > 1 && !g.is_pointwise() {
        bail!("cpuconv: several inputs need a 1x1 stride-1 convolution");
    }
    let mut chans = Vec::with_capacity(inputs.len());
    for x in inputs {
        let (bx, c, hx, wx) = x.dims4()?;
        if (bx, hx, wx) != (b, h, w) || x.dtype() != DType::F32 || !x.device().is_cpu() {
            bail!("cpuconv: input {:?} {:?} does not match {:?} f32 CPU", x.dims(), x.dtype(), first.dims());
        }
        chans.push(c);
    }
    if chans.iter().sum::<usize>() != ci {
        bail!("cpuconv: inputs have {chans:?} channels, weight {:?}", weight.dims());
    }
    if let Some(r) = residual {
        if r.dims() != [b, co, g.oh, g.ow] || r.dtype() != DType::F32 {
            bail!("cpuconv: residual {:?} does not match output {:?}", r.dims(), [b, co, g.oh, g.ow]);
        }
    }
    let xs = inputs.iter().map(|x| image_major(x)).collect::<Result<Vec<_>>>()?;
    let guards: Vec<_> = xs.iter().map(|x| x.storage_and_layout()).collect();
    let views = guards
        .iter()
        .zip(&chans)
        .map(|((s, l), &c)| Ok(Images { data: f32_slice(s)?, start: l.start_offset(), batch_stride: l.stride()[0], len: c * h * w }))
        .collect::<Result<Vec<_>>>()?;
    let bs = bias.contiguous()?;
    let (bg, bl) = bs.storage_and_layout();
    let bv = &f32_slice(&bg)?[bl.start_offset()..bl.start_offset() + co];
    let res = residual.map(image_major).transpose()?;
    let res_guard = res.as_ref().map(|r| r.storage_and_layout());
    let res_view = match &res_guard {
        Some((s, l)) => Some(Images { data: f32_slice(s)?, start: l.start_offset(), batch_stride: l.stride()[0], len: co * g.oh * g.ow }),
        None => None,
    };

    if let Some(pw) = packed {
        if (pw.co, pw.ci, pw.k) != (co, ci, k) {
            bail!("cpuconv: packed weight {pw:?} is not the weight {:?}", weight.dims());
        }
    }
    let out_len = co * g.oh * g.ow;
    let threads = rayon::current_num_threads();
    let mut out: Vec<f32> = Vec::with_capacity(b * out_len);
    let base = OutPtr(out.as_mut_ptr());
    let parts_of = |i: usize| -> Vec<(&[f32], usize)> { views.iter().zip(&chans).map(|(v, &c)| (v.image(i), c)).collect() };
    let run_tiles = |count: usize, run: &(dyn Fn(usize) + Sync)| {
        if threads > 1 && count > 1 {
            (0..count).into_par_iter().for_each(run);
        } else {
            (0..count).for_each(run);
        }
    };
    match (packed, isa) {
        (Some(pw), Some(isa)) => {
            let n = g.oh * g.ow;
            let nb = tile_pixels(pw.kdim, n, b, threads, isa.panels());
            let tiles = n.div_ceil(nb);
            let reads_in_place = in_place && g.s == 1 && (g.oh, g.ow) == (h, w);
            let reads_phases = in_place && views.len() == 1 && (g.s, k, g.p) == (2, 3, 1) && h % 2 == 0 && w % 2 == 0;
            let sources: Vec<Option<InPlace>> =
                (0..b).map(|i| if reads_in_place { InPlace::new(&parts_of(i), h, w, k) } else { None }).collect();
            run_tiles(b * tiles, &|j: usize| {
                let (i, t) = (j / tiles, j % tiles);
                // SAFETY: picture i's block lies inside the allocation of b * out_len elements.
                let dst = unsafe { base.add(i * out_len) };
                conv_tile_packed(
                    isa,
                    sources[i].as_ref(),
                    reads_phases,
                    &parts_of(i),
                    pw,
                    bv,
                    &g,
                    act,
                    res_view.as_ref().map(|r| r.image(i)),
                    dst,
                    t * nb,
                    ((t + 1) * nb).min(n),
                );
            });
        }
        _ => {
            let wt = weight.contiguous()?;
            let (wgd, wl) = wt.storage_and_layout();
            let wv = &f32_slice(&wgd)?[wl.start_offset()..wl.start_offset() + co * ci * k * k];
            let rows = tile_rows(&g, b, threads);
            let tiles = g.oh.div_ceil(rows);
            run_tiles(b * tiles, &|j: usize| {
                let (i, t) = (j / tiles, j % tiles);
                // SAFETY: picture i's block lies inside the allocation of b * out_len elements.
                let dst = unsafe { base.add(i * out_len) };
                conv_tile(&parts_of(i), wv, bv, &g, act, res_view.as_ref().map(|r| r.image(i)), dst, t * rows..((t + 1) * rows).min(g.oh));
            });
        }
    }
    // SAFETY: the tiles cover every (picture, channel, pixel) and each wrote all of its elements.
    unsafe { out.set_len(b * out_len) };
    drop((guards, res_guard, bg));
    Tensor::from_vec(out, (b, co, g.oh, g.ow), &Device::Cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
        let d = (a - b).unwrap().sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap().sqrt();
        let n = b.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap().sqrt();
        d / n.max(1e-20)
    }

    fn reference(x: &Tensor, w: &Tensor, b: &Tensor, s: usize, p: usize, act: bool) -> Tensor {
        let y = x.conv2d(w, p, s, 1, 1).unwrap().broadcast_add(&b.reshape((1, (), 1, 1)).unwrap()).unwrap();
        if act {
            y.silu().unwrap()
        } else {
            y
        }
    }

    #[test]
    fn matches_candle_conv2d() {
        let dev = Device::Cpu;
        for &(b, ci, co, h, w, k, s) in &[
            (1, 3, 8, 17, 13, 3, 2),
            (1, 5, 7, 9, 11, 3, 1),
            (3, 6, 4, 10, 10, 3, 2),
            (3, 6, 4, 10, 10, 3, 1),
            (1, 16, 12, 8, 8, 1, 1),
            (3, 16, 12, 7, 9, 1, 1),
            (2, 4, 6, 9, 8, 1, 2),
            (4, 8, 16, 12, 12, 3, 1),
            // several tiles per picture
            (3, 16, 8, 64, 40, 3, 1),
            (1, 8, 8, 70, 30, 3, 2),
            (2, 32, 16, 96, 80, 1, 1),
            // reduction deeper than one KC pass, channels not a multiple of MR, odd widths
            (1, 40, 6, 11, 13, 3, 1),
            (2, 300, 5, 7, 9, 1, 1),
            (1, 3, 1, 30, 29, 3, 2),
        ] {
            for act in [false, true] {
                let p = k / 2;
                let x = Tensor::randn(0f32, 1.0, (b, ci, h, w), &dev).unwrap();
                let wt = Tensor::randn(0f32, 0.5, (co, ci, k, k), &dev).unwrap();
                let bias = Tensor::randn(0f32, 1.0, co, &dev).unwrap();
                let want = reference(&x, &wt, &bias, s, p, act);
                let pw = PackedWeights::new(&wt).unwrap();
                for packed in [None, Some(&pw)] {
                    let got = conv2d(&[&x], &wt, packed, &bias, s, p, act, None).unwrap();
                    assert_eq!(got.dims(), want.dims());
                    let e = rel_err(&got, &want);
                    assert!(e < 1e-5, "b{b} ci{ci} co{co} {h}x{w} k{k} s{s} act{act} packed{}: rel err {e}", packed.is_some());
                }
            }
        }
    }

    #[test]
    fn channel_slices_concat_and_residual() {
        let dev = Device::Cpu;
        for b in [1, 3] {
            // input is a channel slice of a bigger tensor (non-contiguous), and a transposed copy
            let big = Tensor::randn(0f32, 1.0, (b, 10, 9, 7), &dev).unwrap();
            let xa = big.narrow(1, 2, 5).unwrap();
            let xb = Tensor::randn(0f32, 1.0, (b, 9, 7, 3), &dev).unwrap().permute((0, 3, 1, 2)).unwrap();
            assert_eq!(xb.dims(), [b, 3, 9, 7]);
            assert!(!xa.is_contiguous() || b == 1);
            let cat = Tensor::cat(&[&xa, &xb], 1).unwrap();
            let w1 = Tensor::randn(0f32, 0.5, (6, 8, 1, 1), &dev).unwrap();
            let bias = Tensor::randn(0f32, 1.0, 6, &dev).unwrap();
            let want = reference(&cat, &w1, &bias, 1, 0, true);
            let pw1 = PackedWeights::new(&w1).unwrap();
            for packed in [None, Some(&pw1)] {
                let got = conv2d(&[&xa, &xb], &w1, packed, &bias, 1, 0, true, None).unwrap();
                assert!(rel_err(&got, &want) < 1e-5);
            }

            let w3 = Tensor::randn(0f32, 0.5, (5, 5, 3, 3), &dev).unwrap();
            let bias = Tensor::randn(0f32, 1.0, 5, &dev).unwrap();
            let res = big.narrow(1, 0, 5).unwrap();
            let want = (reference(&xa, &w3, &bias, 1, 1, true) + &res).unwrap();
            let pw3 = PackedWeights::new(&w3).unwrap();
            for packed in [None, Some(&pw3)] {
                let got = conv2d(&[&xa], &w3, packed, &bias, 1, 1, true, Some(&res)).unwrap();
                assert!(rel_err(&got, &want) < 1e-5);
            }
        }
    }

    /// The packed kernel on `ins` (the channels of `x`) at `(stride, padding)` gives the same bits
    /// reading in place as through im2col, and matches candle's `conv2d` (+ `res`).
    #[allow(clippy::too_many_arguments)]
    fn same_bits_as_im2col(
        ins: &[&Tensor],
        x: &Tensor,
        wt: &Tensor,
        pw: &PackedWeights,
        bias: &Tensor,
        (stride, padding): (usize, usize),
        act: bool,
        res: Option<&Tensor>,
        isa: Isa,
        case: &str,
    ) {
        let run = |in_place| fused(ins, wt, Some(pw), bias, stride, padding, act, res, Some(isa), in_place).unwrap();
        let (got, im2col) = (run(true), run(false));
        let bits = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap().into_iter().map(f32::to_bits).collect::<Vec<_>>();
        assert!(bits(&got) == bits(&im2col), "{case}: in place and im2col differ");
        let mut want = reference(x, wt, bias, stride, padding, act);
        if let Some(r) = res {
            want = (want + r).unwrap();
        }
        let e = rel_err(&got, &want);
        assert!(e < 1e-5, "{case}: rel err {e}");
    }

    /// The packed kernel reading its input in place gives the same bits as through im2col, for
    /// the layer shapes it takes (stride 1, 1x1 or 3x3 "same"): odd widths, pictures narrower
    /// than a panel, 1- and 2-row pictures, several tiles, a reduction deeper than one pass,
    /// channel slices as inputs, concatenated 1x1 inputs, batch > 1, with and without SiLU and
    /// residual. Both also match candle's `conv2d`.
    #[test]
    fn in_place_gives_the_im2col_bits() {
        let dev = Device::Cpu;
        let mut checked = 0;
        for &(b, ci, co, h, w) in &[
            (1, 3, 8, 1, 1),
            (1, 4, 7, 1, 5),
            (2, 5, 6, 1, 37),
            (1, 6, 13, 2, 3),
            (3, 7, 5, 2, 19),
            (1, 8, 6, 3, 16),
            (2, 9, 12, 5, 7),
            (1, 16, 9, 9, 33),
            (2, 40, 14, 11, 13),
            (1, 30, 20, 40, 40),
            (3, 12, 6, 20, 20),
            (1, 8, 8, 64, 47),
            (4, 6, 7, 6, 5),
        ] {
            for k in [1, 3] {
                let big = Tensor::randn(0f32, 1.0, (b, ci + 3, h, w), &dev).unwrap();
                let x = big.narrow(1, 2, ci).unwrap();
                let wt = Tensor::randn(0f32, 0.5, (co, ci, k, k), &dev).unwrap();
                let bias = Tensor::randn(0f32, 1.0, co, &dev).unwrap();
                let res = Tensor::randn(0f32, 1.0, (b, co + 1, h, w), &dev).unwrap().narrow(1, 1, co).unwrap();
                let pw = PackedWeights::new(&wt).unwrap();
                // 1x1: the input as one part and as a concatenation of two
                let (xa, xb) = (x.narrow(1, 0, ci / 2 + 1).unwrap(), x.narrow(1, ci / 2 + 1, ci - ci / 2 - 1).unwrap());
                let inputs: Vec<Vec<&Tensor>> = if k == 1 && ci > 2 { vec![vec![&x], vec![&xa, &xb]] } else { vec![vec![&x]] };
                for ins in inputs {
                    for (act, r) in [(false, None), (true, None), (true, Some(&res))] {
                        for isa in cpukernel::tests::isas() {
                            let case = format!("{isa:?} b{b} ci{ci} co{co} {h}x{w} k{k} parts{} act{act} res{}", ins.len(), r.is_some());
                            same_bits_as_im2col(&ins, &x, &wt, &pw, &bias, (1, k / 2), act, r, isa, &case);
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked >= 90 * cpukernel::tests::isas().len(), "{checked}");
    }

    /// Stride-2 3x3 convolutions read from their input's phases give the same bits as through
    /// im2col: sides from 2 up, widths under and over a panel, several tiles, a reduction deeper
    /// than one pass, channel slices as inputs, batch > 1, with and without SiLU and residual;
    /// odd sides keep the im2col. All match candle's `conv2d`.
    #[test]
    fn phases_give_the_im2col_bits() {
        let dev = Device::Cpu;
        let mut checked = 0;
        for &(b, ci, co, h, w) in &[
            (1, 3, 8, 2, 2),
            (1, 4, 7, 2, 6),
            (2, 5, 6, 4, 38),
            (1, 6, 13, 6, 34),
            (3, 7, 5, 8, 40),
            (1, 16, 9, 10, 66),
            (2, 40, 14, 12, 14),
            (1, 30, 20, 40, 40),
            (1, 8, 8, 64, 48),
            (2, 6, 7, 7, 10),
            (1, 5, 6, 9, 9),
        ] {
            let big = Tensor::randn(0f32, 1.0, (b, ci + 3, h, w), &dev).unwrap();
            let x = big.narrow(1, 2, ci).unwrap();
            let wt = Tensor::randn(0f32, 0.5, (co, ci, 3, 3), &dev).unwrap();
            let bias = Tensor::randn(0f32, 1.0, co, &dev).unwrap();
            let (oh, ow) = ((h - 1) / 2 + 1, (w - 1) / 2 + 1);
            let res = Tensor::randn(0f32, 1.0, (b, co + 1, oh, ow), &dev).unwrap().narrow(1, 1, co).unwrap();
            let pw = PackedWeights::new(&wt).unwrap();
            for (act, r) in [(false, None), (true, None), (true, Some(&res))] {
                for isa in cpukernel::tests::isas() {
                    let case = format!("{isa:?} b{b} ci{ci} co{co} {h}x{w} act{act} res{}", r.is_some());
                    same_bits_as_im2col(&[&x], &x, &wt, &pw, &bias, (2, 1), act, r, isa, &case);
                    checked += 1;
                }
            }
        }
        assert!(checked >= 33 * cpukernel::tests::isas().len(), "{checked}");
    }

    #[test]
    fn silu_matches_libm() {
        for i in -20000..20000 {
            let v = i as f32 * 0.01;
            let want = v / (1.0 + (-v).exp());
            let got = silu(v);
            assert!((got - want).abs() <= 1e-6 * want.abs() + 1e-12, "silu({v}) = {got}, want {want}");
        }
        for v in [-1e4f32, -100.0, -88.5, 88.5, 100.0, 1e4] {
            let want = v / (1.0 + (-v).exp());
            assert!((silu(v) - want).abs() <= 1e-6 * want.abs() + 1e-30, "silu({v})");
        }
    }
}
