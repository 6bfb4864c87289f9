//! Pooling on the CPU in f32 over contiguous channels-first planes, one plane per rayon task:
//! the average of 2x2 windows at stride 1 (ADown) and the max of `k x k` windows padded by
//! `k / 2` (SPPELAN, ADown), separably (a row pass, then a column pass). Candle's pooling walks
//! every window element by element.
//!
//! Both give exactly what PyTorch gives: the average sums the window row by row and scales by
//! 1/4 (as `avg_pool2d` with `count_include_pad`), and a max does not depend on the order.
//!
//! May use: the standard library, rayon.

use rayon::prelude::*;

/// Planes per rayon task at least: a plane of a deep layer is a few hundred values.
const MIN_PLANES: usize = 8;

/// `avg_pool2d(x, 2, stride 1, padding 0)` of `planes` planes of `h x w` (`x` contiguous): planes
/// of `(h - 1) x (w - 1)`.
pub fn avg_2x2_s1(x: &[f32], planes: usize, h: usize, w: usize) -> Result<Vec<f32>, String> {
    if h < 2 || w < 2 || x.len() != planes * h * w {
        return Err(format!("avg pool 2x2: {} values for {planes} planes of {h}x{w}", x.len()));
    }
    let (oh, ow) = (h - 1, w - 1);
    let mut out = vec![0f32; planes * oh * ow];
    out.par_chunks_mut(oh * ow).zip(x.par_chunks(h * w)).with_min_len(MIN_PLANES).for_each(|(o, p)| {
        for y in 0..oh {
            let (r0, r1) = (&p[y * w..][..w], &p[(y + 1) * w..][..w]);
            for (xo, v) in o[y * ow..][..ow].iter_mut().enumerate() {
                *v = (((r0[xo] + r0[xo + 1]) + r1[xo]) + r1[xo + 1]) * 0.25;
            }
        }
    });
    Ok(out)
}

/// The output size of a `k`-wide pool at stride `s` padded by `k / 2` on both sides.
fn pooled(n: usize, k: usize, s: usize) -> usize {
    (n + 2 * (k / 2) - k) / s + 1
}

/// `max_pool2d(x, k, stride s, padding k / 2)` (padding that never wins) of `planes` planes of
/// `h x w` (`x` contiguous); returns the planes and their height and width.
pub fn max_padded(x: &[f32], planes: usize, h: usize, w: usize, k: usize, s: usize) -> Result<(Vec<f32>, usize, usize), String> {
    if k == 0 || s == 0 || h == 0 || w == 0 || x.len() != planes * h * w {
        return Err(format!("max pool {k}x{k}/{s}: {} values for {planes} planes of {h}x{w}", x.len()));
    }
    let (oh, ow, p) = (pooled(h, k, s), pooled(w, k, s), k / 2);
    // the window of output `o` along a side of `n`: `lo..hi` clipped to the side
    let window = move |o: usize, n: usize| ((o * s).saturating_sub(p), (o * s + k - p).min(n));
    let mut out = vec![0f32; planes * oh * ow];
    out.par_chunks_mut(oh * ow).zip(x.par_chunks(h * w)).with_min_len(MIN_PLANES).for_each(|(o, plane)| {
        // rows first: every input row pooled along x, then the columns of those along y
        let mut rows = vec![0f32; h * ow];
        for y in 0..h {
            let r = &plane[y * w..][..w];
            for (xo, v) in rows[y * ow..][..ow].iter_mut().enumerate() {
                let (lo, hi) = window(xo, w);
                *v = r[lo..hi].iter().copied().fold(f32::NEG_INFINITY, f32::max);
            }
        }
        for yo in 0..oh {
            let (lo, hi) = window(yo, h);
            let dst = &mut o[yo * ow..][..ow];
            dst.copy_from_slice(&rows[lo * ow..][..ow]);
            for y in lo + 1..hi {
                for (d, &v) in dst.iter_mut().zip(&rows[y * ow..][..ow]) {
                    *d = d.max(v);
                }
            }
        }
    });
    Ok((out, oh, ow))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plane(planes: usize, h: usize, w: usize) -> Vec<f32> {
        (0..planes * h * w).map(|i| ((i * 7919) % 97) as f32 - 48.5).collect()
    }

    #[test]
    fn average_is_the_window_sum_over_four() {
        let (planes, h, w) = (3, 5, 4);
        let x = plane(planes, h, w);
        let got = avg_2x2_s1(&x, planes, h, w).unwrap();
        for p in 0..planes {
            for y in 0..h - 1 {
                for xo in 0..w - 1 {
                    let at = |yy: usize, xx: usize| x[(p * h + yy) * w + xx];
                    let want = (((at(y, xo) + at(y, xo + 1)) + at(y + 1, xo)) + at(y + 1, xo + 1)) * 0.25;
                    assert_eq!(got[(p * (h - 1) + y) * (w - 1) + xo], want);
                }
            }
        }
        assert!(avg_2x2_s1(&x, planes, h, w + 1).is_err());
        assert!(avg_2x2_s1(&x[..3], 3, 1, 1).is_err());
    }

    #[test]
    fn max_is_the_brute_force_window_max() {
        for (h, w, k, s) in [(7, 9, 5, 1), (8, 6, 3, 2), (7, 7, 3, 2), (1, 1, 5, 1), (4, 5, 1, 1)] {
            let planes = 2;
            let x = plane(planes, h, w);
            let (got, oh, ow) = max_padded(&x, planes, h, w, k, s).unwrap();
            let p = k / 2;
            assert_eq!((oh, ow), ((h + 2 * p - k) / s + 1, (w + 2 * p - k) / s + 1));
            for pl in 0..planes {
                for yo in 0..oh {
                    for xo in 0..ow {
                        let mut want = f32::NEG_INFINITY;
                        for dy in 0..k {
                            for dx in 0..k {
                                let (yy, xx) = ((yo * s + dy) as isize - p as isize, (xo * s + dx) as isize - p as isize);
                                if (0..h as isize).contains(&yy) && (0..w as isize).contains(&xx) {
                                    want = want.max(x[(pl * h + yy as usize) * w + xx as usize]);
                                }
                            }
                        }
                        assert_eq!(got[(pl * oh + yo) * ow + xo], want, "{h}x{w} k{k} s{s} at {yo},{xo}");
                    }
                }
            }
        }
    }
}
