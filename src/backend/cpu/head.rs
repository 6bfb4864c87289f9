//! The detection head's decode on the CPU in f32, in one pass over the branch outputs: the DFL
//! expectation (softmax over each side's bins, weighted by the projection), the box around each
//! anchor in input pixels, and the class sigmoids, written straight into the raw output
//! `(B, 4 + nc, A)`. Candle's ops made the same arithmetic in a dozen passes with a libm `exp`
//! per value: a tenth of yolov9t's pass on two cores (BENCHMARKS.md, CPU).
//!
//! The arithmetic is the reference's, in its order (softmax as `exp(x - max) / sum`, the
//! expectation summed over the bins in order, `((x1 + x2) * 0.5) * stride`); `exp` is the
//! polynomial of [`super::kernel::exp`] (relative error about 1e-7), which vectorises.
//!
//! May use: the standard library, rayon.

use rayon::prelude::*;

use super::kernel::exp;

/// One level's branch outputs, channels-first and flattened: `boxes` `(B, 4 * reg, n)` and
/// `classes` `(B, nc, n)`, contiguous, for `n = grid_h * grid_w` anchors `stride` pixels apart.
pub struct Level<'a> {
    pub boxes: &'a [f32],
    pub classes: &'a [f32],
    pub grid_w: usize,
    pub anchors: usize,
    pub stride: f32,
}

/// Anchors decoded per block: each side's bins of a block stay in L1.
const BLOCK: usize = 256;

/// The raw output `(B, 4 + nc, A)` of `levels` (`A` their anchors, in level order) for a batch of
/// `b` pictures, `nc` classes and the DFL projection `proj` (one weight per bin).
pub fn decode(levels: &[Level<'_>], b: usize, nc: usize, proj: &[f32]) -> Result<Vec<f32>, String> {
    let reg = proj.len();
    let a: usize = levels.iter().map(|l| l.anchors).sum();
    for (i, l) in levels.iter().enumerate() {
        if l.grid_w == 0 || l.anchors % l.grid_w != 0 || l.boxes.len() != b * 4 * reg * l.anchors || l.classes.len() != b * nc * l.anchors {
            return Err(format!(
                "head decode: level {i} has {} box and {} class values for {b} pictures of {} anchors ({} wide), {reg} bins, {nc} classes",
                l.boxes.len(),
                l.classes.len(),
                l.anchors,
                l.grid_w
            ));
        }
    }
    let rows = 4 + nc;
    let mut out = vec![0f32; b * rows * a];
    if out.is_empty() {
        return Ok(out);
    }
    // boxes: per picture, its four rows
    out.par_chunks_mut(rows * a).enumerate().for_each(|(p, pic)| {
        let (boxes, _) = pic.split_at_mut(4 * a);
        let mut scratch = vec![0f32; reg * BLOCK];
        let mut offset = 0;
        for l in levels {
            let src = &l.boxes[p * 4 * reg * l.anchors..][..4 * reg * l.anchors];
            let mut k0 = 0;
            while k0 < l.anchors {
                let n = BLOCK.min(l.anchors - k0);
                decode_boxes(&Block { src, level: l, proj, k0, n, a, offset }, &mut scratch, boxes);
                k0 += n;
            }
            offset += l.anchors;
        }
    });
    // classes: every (picture, class) row on its own
    out.par_chunks_mut(a).enumerate().filter(|(r, _)| r % rows >= 4).for_each(|(r, row)| {
        let (p, c) = (r / rows, r % rows - 4);
        let mut offset = 0;
        for l in levels {
            let src = &l.classes[(p * nc + c) * l.anchors..][..l.anchors];
            sigmoid_row(src, &mut row[offset..offset + l.anchors]);
            offset += l.anchors;
        }
    });
    Ok(out)
}

/// Anchors `k0..k0 + n` of `level`, whose box values of one picture are `src`, for the rows of
/// a picture `a` wide from column `offset` (the level's first anchor).
struct Block<'a> {
    src: &'a [f32],
    level: &'a Level<'a>,
    proj: &'a [f32],
    k0: usize,
    n: usize,
    a: usize,
    offset: usize,
}

/// The boxes of `blk` into the picture's four rows `out`, at column `offset + k`; `e` is
/// scratch for the exponentials of a block (`reg * BLOCK` values).
fn decode_boxes(blk: &Block<'_>, e: &mut [f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::kernel::available() {
        // SAFETY: AVX2 and FMA are available (checked just above); the body is safe code.
        return unsafe { decode_boxes_avx2(blk, e, out) };
    }
    decode_boxes_portable(blk, e, out)
}

/// [`decode_boxes_portable`] compiled for AVX2 + FMA, where its loops vectorise.
///
/// # Safety
/// AVX2 and FMA must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn decode_boxes_avx2(blk: &Block<'_>, e: &mut [f32], out: &mut [f32]) {
    decode_boxes_portable(blk, e, out)
}

#[inline(always)]
fn decode_boxes_portable(blk: &Block<'_>, e: &mut [f32], out: &mut [f32]) {
    let &Block { src, level: l, proj, k0, n, a, offset } = blk;
    let reg = proj.len();
    let mut dist = [[0f32; BLOCK]; 4];
    let mut max = [0f32; BLOCK];
    let mut sum = [0f32; BLOCK];
    for (side, d) in dist.iter_mut().enumerate() {
        let bin = |j: usize| &src[(side * reg + j) * l.anchors + k0..][..n];
        max[..n].copy_from_slice(bin(0));
        for j in 1..reg {
            for (m, &v) in max[..n].iter_mut().zip(bin(j)) {
                *m = m.max(v);
            }
        }
        sum[..n].fill(0.0);
        for j in 0..reg {
            let ej = &mut e[j * BLOCK..][..n];
            for ((x, &v), &m) in ej.iter_mut().zip(bin(j)).zip(&max[..n]) {
                *x = exp(v - m);
            }
            for (s, &x) in sum[..n].iter_mut().zip(ej.iter()) {
                *s += x;
            }
        }
        d[..n].fill(0.0);
        for (j, &w) in proj.iter().enumerate() {
            for ((acc, &x), &s) in d[..n].iter_mut().zip(&e[j * BLOCK..][..n]).zip(&sum[..n]) {
                *acc += (x / s) * w;
            }
        }
    }
    let s = l.stride;
    let (cx, rest) = out.split_at_mut(a);
    let (cy, rest) = rest.split_at_mut(a);
    let (bw, bh) = rest.split_at_mut(a);
    let [d0, d1, d2, d3] = &dist;
    let sides = d0[..n].iter().zip(&d1[..n]).zip(d2[..n].iter().zip(&d3[..n]));
    for (k, ((&left, &top), (&right, &bottom))) in sides.enumerate() {
        let anchor = k0 + k;
        let ax = (anchor % l.grid_w) as f32 + 0.5;
        let ay = (anchor / l.grid_w) as f32 + 0.5;
        let (x1, y1) = (ax - left, ay - top);
        let (x2, y2) = (ax + right, ay + bottom);
        let col = offset + anchor;
        cx[col] = ((x1 + x2) * 0.5) * s;
        cy[col] = ((y1 + y2) * 0.5) * s;
        bw[col] = (x2 - x1) * s;
        bh[col] = (y2 - y1) * s;
    }
}

/// `1 / (1 + exp(-x))` of each value of `src` into `out`.
fn sigmoid_row(src: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::kernel::available() {
        // SAFETY: AVX2 and FMA are available (checked just above); the body is safe code.
        return unsafe { sigmoid_row_avx2(src, out) };
    }
    sigmoid_row_portable(src, out)
}

/// # Safety
/// AVX2 and FMA must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn sigmoid_row_avx2(src: &[f32], out: &mut [f32]) {
    sigmoid_row_portable(src, out)
}

#[inline(always)]
fn sigmoid_row_portable(src: &[f32], out: &mut [f32]) {
    for (o, &x) in out.iter_mut().zip(src) {
        *o = 1.0 / (1.0 + exp(-x));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The decode with libm's `exp`, written the plain way, for two levels and two pictures.
    #[test]
    fn matches_the_plain_arithmetic() {
        let (b, nc, reg) = (2usize, 3usize, 16usize);
        let proj: Vec<f32> = (0..reg).map(|j| j as f32).collect();
        let grids = [(4usize, 6usize, 8.0f32), (2, 3, 16.0)];
        let mut seed = 7u32;
        let mut rnd = move || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 * 16.0 - 8.0
        };
        let data: Vec<(Vec<f32>, Vec<f32>)> = grids
            .iter()
            .map(|&(h, w, _)| ((0..b * 4 * reg * h * w).map(|_| rnd()).collect(), (0..b * nc * h * w).map(|_| rnd()).collect()))
            .collect();
        let levels: Vec<Level<'_>> = grids
            .iter()
            .zip(&data)
            .map(|(&(h, w, s), (bx, cl))| Level { boxes: bx, classes: cl, grid_w: w, anchors: h * w, stride: s })
            .collect();
        let got = decode(&levels, b, nc, &proj).unwrap();
        let a: usize = grids.iter().map(|g| g.0 * g.1).sum();
        assert_eq!(got.len(), b * (4 + nc) * a);
        let mut col = 0;
        for (l, &(h, w, s)) in levels.iter().zip(&grids) {
            for k in 0..h * w {
                for p in 0..b {
                    let side = |sd: usize| {
                        let v: Vec<f32> = (0..reg).map(|j| l.boxes[((p * 4 + sd) * reg + j) * h * w + k]).collect();
                        let m = v.iter().cloned().fold(f32::MIN, f32::max);
                        let e: Vec<f32> = v.iter().map(|x| (x - m).exp()).collect();
                        let sum: f32 = e.iter().sum();
                        e.iter().zip(&proj).map(|(x, w)| x / sum * w).sum::<f32>()
                    };
                    let (ax, ay) = ((k % w) as f32 + 0.5, (k / w) as f32 + 0.5);
                    let want = [
                        (ax - side(0) + ax + side(2)) * 0.5 * s,
                        (ay - side(1) + ay + side(3)) * 0.5 * s,
                        (side(0) + side(2)) * s,
                        (side(1) + side(3)) * s,
                    ];
                    for (r, wv) in want.iter().enumerate() {
                        let g = got[(p * (4 + nc) + r) * a + col + k];
                        assert!((g - wv).abs() <= 1e-4 * wv.abs().max(1.0), "picture {p} anchor {} row {r}: {g} vs {wv}", col + k);
                    }
                    for c in 0..nc {
                        let x = l.classes[(p * nc + c) * h * w + k];
                        let wv = 1.0 / (1.0 + (-x).exp());
                        let g = got[(p * (4 + nc) + 4 + c) * a + col + k];
                        assert!((g - wv).abs() <= 1e-6, "picture {p} anchor {} class {c}: {g} vs {wv}", col + k);
                    }
                }
            }
            col += h * w;
        }
    }

    #[test]
    fn mismatched_levels_are_an_error() {
        let proj = [0.0f32, 1.0];
        let bx = vec![0f32; 4 * 2 * 6];
        let cl = vec![0f32; 6];
        let ok = Level { boxes: &bx, classes: &cl, grid_w: 3, anchors: 6, stride: 8.0 };
        assert!(decode(&[ok], 1, 1, &proj).is_ok());
        let bad = Level { boxes: &bx[1..], classes: &cl, grid_w: 3, anchors: 6, stride: 8.0 };
        assert!(decode(&[bad], 1, 1, &proj).is_err());
        let ragged = Level { boxes: &bx, classes: &cl, grid_w: 4, anchors: 6, stride: 8.0 };
        assert!(decode(&[ragged], 1, 1, &proj).is_err());
    }
}
