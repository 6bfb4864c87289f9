//! Detections from raw candidates: confidence filter, class-aware NMS and mapping back to the
//! original picture, with the reference's defaults and semantics (`ultralytics.utils.ops.non_max_suppression`,
//! `multi_label=False`, `agnostic=False`).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::vision::preprocess::LetterboxGeometry;

/// Offset that separates classes for class-aware NMS (the reference's `max_wh`).
const MAX_WH: f32 = 7680.0;
/// Most boxes that enter NMS (the reference's `max_nms`).
pub const MAX_NMS: usize = 30_000;

/// Thresholds of the detection step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Thresholds {
    pub conf: f32,
    pub iou: f32,
    pub max_det: usize,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self { conf: 0.25, iou: 0.7, max_det: 300 }
    }
}

/// One detected object, in original-image pixels (also an element of the `detections` array of
/// the agent's `Detections` message).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Detection {
    /// Index into the model's class names (`model.classes` of the agent's `Info` message).
    pub class_id: usize,
    /// The class name.
    pub label: String,
    /// Class score after NMS, 0 to 1.
    pub confidence: f32,
    /// The box `[x1, y1, x2, y2]` in pixels of the original picture (top-left origin).
    #[serde(rename = "box")]
    pub bbox: [f32; 4],
}

/// A candidate that passed the confidence filter, in network-input pixels (xywh centre form).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub xywh: [f32; 4],
    pub score: f32,
    pub class_id: usize,
}

/// Floats per candidate row that the device filter returns: x, y, w, h, score, class, picture,
/// anchor (`src/backend/cuda/kernels/candidates.cu`).
pub const DEVICE_ROW: usize = 8;

/// Per-picture candidate lists, each in anchor order (as the host filter yields them), from the
/// device filter's rows, which come in whatever order the device appended them. A row naming a
/// picture outside `0..pictures` or an anchor outside `0..anchors` is dropped, as is a second
/// row for the same anchor; a trailing partial row is ignored.
pub fn candidates_from_rows(rows: &[f32], pictures: usize, anchors: usize) -> Vec<Vec<Candidate>> {
    use rayon::prelude::*;
    // each anchor of a picture has at most one row: placing row numbers at (picture, anchor)
    // orders them without a sort, in time linear in the rows and the anchors (an untrained model,
    // or a low threshold, makes every anchor of every picture a candidate: a million rows for a
    // large batch)
    const NONE: u32 = u32::MAX;
    let slots = match pictures.checked_mul(anchors) {
        Some(n) if n > 0 => n,
        _ => return vec![Vec::new(); pictures],
    };
    let mut at = vec![NONE; slots];
    // rows placed per picture: each list is allocated once, at its size
    let mut placed = vec![0usize; pictures];
    for (i, r) in rows.chunks_exact(DEVICE_ROW).enumerate() {
        let (pic, anchor) = (r[6] as usize, r[7] as usize);
        if pic < pictures && anchor < anchors && i < NONE as usize {
            let slot = &mut at[pic * anchors + anchor];
            if *slot == NONE {
                *slot = i as u32;
                placed[pic] += 1;
            }
        }
    }
    let list = |(slots, &n): (&[u32], &usize)| -> Vec<Candidate> {
        let mut list = Vec::with_capacity(n);
        list.extend(slots.iter().filter(|&&i| i != NONE).map(|&i| {
            let r = &rows[i as usize * DEVICE_ROW..][..DEVICE_ROW];
            Candidate { xywh: [r[0], r[1], r[2], r[3]], score: r[4], class_id: r[5] as usize }
        }));
        list
    };
    if pictures == 1 {
        // a batch of one (the latency path) is not worth waking the pool
        return vec![list((&at, &placed[0]))];
    }
    at.par_chunks(anchors).zip(placed.par_iter()).map(list).collect()
}

/// Kept boxes a lane group holds: one AVX-512 register of f32, two AVX2 registers, four SSE or
/// NEON registers.
const LANES: usize = 16;

/// The kept boxes of one class, as columns in lane groups (class-offset xyxy and area), so that
/// the overlap test of a candidate against all of them runs in SIMD lanes. The last group's
/// lanes past `len` hold zeros and are masked out.
#[derive(Default)]
struct KeptBoxes {
    x1: Vec<[f32; LANES]>,
    y1: Vec<[f32; LANES]>,
    x2: Vec<[f32; LANES]>,
    y2: Vec<[f32; LANES]>,
    area: Vec<[f32; LANES]>,
    len: usize,
}

impl KeptBoxes {
    fn push(&mut self, b: &[f32; 4]) {
        let (g, l) = (self.len / LANES, self.len % LANES);
        if l == 0 {
            for col in [&mut self.x1, &mut self.y1, &mut self.x2, &mut self.y2, &mut self.area] {
                col.push([0.0; LANES]);
            }
        }
        self.x1[g][l] = b[0];
        self.y1[g][l] = b[1];
        self.x2[g][l] = b[2];
        self.y2[g][l] = b[3];
        self.area[g][l] = area(b);
        self.len += 1;
    }

    /// Whether any kept box overlaps `b` by more than `iou`: the reference's IoU
    /// (`inter / (area_a + area_b - inter + 1e-9)`, the same f32 operations in the same order),
    /// a lane group at a time, with the widest vectors the CPU has.
    fn overlaps(&self, b: &[f32; 4], iou: f32) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU supports the feature the function is compiled for (checked just above).
                return unsafe { self.overlaps_avx512(b, iou) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: as above.
                return unsafe { self.overlaps_avx2(b, iou) };
            }
        }
        self.overlaps_lanes(b, iou)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    fn overlaps_avx512(&self, b: &[f32; 4], iou: f32) -> bool {
        self.overlaps_lanes(b, iou)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn overlaps_avx2(&self, b: &[f32; 4], iou: f32) -> bool {
        self.overlaps_lanes(b, iou)
    }

    /// [`Self::overlaps`] in plain arithmetic over fixed-width groups, which the compiler turns
    /// into vector instructions of the calling function's features (every operation is IEEE's,
    /// so the lanes give what a scalar loop gives).
    ///
    /// The sides are compared with `if k < s { k } else { s }` (one vector instruction, where
    /// `f32::min` needs a compare and a blend beside it to return the operand that is not NaN).
    /// The answers are `f32::min`'s and `f32::max`'s: a NaN side `k` of a kept box fails the
    /// compare and gives `b`'s side `s`, and where `b` has a NaN side its area is NaN, so every
    /// lane's IoU is NaN and overlaps nothing either way.
    #[inline(always)]
    fn overlaps_lanes(&self, b: &[f32; 4], iou: f32) -> bool {
        let min = |k: f32, s: f32| if k < s { k } else { s };
        let max = |k: f32, s: f32| if k > s { k } else { s };
        let area_b = area(b);
        let full = self.len / LANES;
        for (g, ((((x1, y1), x2), y2), area_a)) in self.x1.iter().zip(&self.y1).zip(&self.x2).zip(&self.y2).zip(&self.area).enumerate() {
            let mut hits = 0u32;
            for l in 0..LANES {
                let iw = max(min(x2[l], b[2]) - max(x1[l], b[0]), 0.0);
                let ih = max(min(y2[l], b[3]) - max(y1[l], b[1]), 0.0);
                let inter = iw * ih;
                hits |= u32::from(inter / (area_a[l] + area_b - inter + 1e-9) > iou) << l;
            }
            // the last group's lanes past `len` are not boxes
            let boxes = if g < full { u32::MAX } else { (1 << (self.len % LANES)) - 1 };
            if hits & boxes != 0 {
                return true;
            }
        }
        false
    }
}

/// Class ids below this have their kept boxes in a table indexed by id (a model's ids are
/// `0..nc`); ids above it, which only a broken model gives, in a map.
const DENSE_CLASSES: usize = 4096;

/// The kept boxes of each class.
#[derive(Default)]
struct KeptByClass {
    dense: Vec<KeptBoxes>,
    sparse: HashMap<usize, KeptBoxes>,
}

impl KeptByClass {
    fn of(&mut self, class: usize) -> &mut KeptBoxes {
        if class < DENSE_CLASSES {
            if class >= self.dense.len() {
                self.dense.resize_with(class + 1, KeptBoxes::default);
            }
            &mut self.dense[class]
        } else {
            self.sparse.entry(class).or_default()
        }
    }
}

fn area(b: &[f32; 4]) -> f32 {
    (b[2] - b[0]) * (b[3] - b[1])
}

/// Floats per kept row that the device NMS returns: x, y, w, h, score, class, picture, place
/// among the picture's kept (`src/backend/cuda/kernels/nms.cu`).
pub const KEPT_ROW: usize = 8;

/// Per-picture kept candidates, best first, from the device NMS's rows (each picture's rows
/// together and in order). A row naming a picture outside `0..pictures` is dropped, as is a
/// trailing partial row.
pub fn kept_from_rows(rows: &[f32], pictures: usize) -> Vec<Vec<Candidate>> {
    let mut kept = vec![Vec::new(); pictures];
    for r in rows.chunks_exact(KEPT_ROW) {
        if let Some(list) = kept.get_mut(r[6] as usize) {
            list.push(Candidate { xywh: [r[0], r[1], r[2], r[3]], score: r[4], class_id: r[5] as usize });
        }
    }
    kept
}

/// A raw output `(b, 4 + nc, a)` (values in that order) whose boxes crowd one 300 x 200 region:
/// scores quantised to 1/64, so that many tie and the anchor order decides; NaN and infinite
/// scores and sides on a few anchors in every 101. The checks of the device NMS against [`nms`]
/// run on it (`backend::cuda::nms`, on the GPU; `tests/model/kernels.rs`, on the CPU).
pub fn crowded_output(b: usize, nc: usize, a: usize) -> Vec<f32> {
    let no = 4 + nc;
    let unit = |i: usize| {
        let mut v = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5851_F42D_4C95_7F2D;
        v ^= v >> 31;
        v = v.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        ((v >> 40) % 4096) as f32 / 4096.0
    };
    let mut values = vec![0f32; b * no * a];
    for n in 0..b {
        for j in 0..a {
            let at = |row: usize| (n * no + row) * a + j;
            let u = |row: usize| unit(at(row));
            values[at(0)] = 100.0 + 300.0 * u(0);
            values[at(1)] = 100.0 + 200.0 * u(1);
            values[at(2)] = 20.0 + 120.0 * u(2);
            values[at(3)] = 20.0 + 120.0 * u(3);
            for c in 0..nc {
                values[at(4 + c)] = (u(4 + c) * 64.0).floor() / 64.0;
            }
            match (j % 101, nc) {
                (1, _) => values[at(4)] = f32::NAN,
                (2, 2..) => values[at(5)] = f32::INFINITY,
                (3, _) => values[at(0)] = f32::NAN,
                (4, _) => values[at(2)] = f32::INFINITY,
                (5, 3..) => values[at(6)] = f32::NAN,
                _ => {}
            }
        }
    }
    values
}

/// Each picture's candidates, in anchor order, of a raw output's values `(b, 4 + nc, a)` on the
/// host: the anchors whose best class (the first of equal best scores, as torch's max) scores
/// above `conf`. With [`nms_of_best`], what the device NMS is checked against.
pub fn candidates_on_host(values: &[f32], (b, no, a): (usize, usize, usize), conf: f32) -> Vec<Vec<Candidate>> {
    (0..b)
        .map(|n| {
            let at = |row: usize, j: usize| values[(n * no + row) * a + j];
            (0..a)
                .filter_map(|j| {
                    let (class_id, score) =
                        (1..no.saturating_sub(4))
                            .fold((0, at(4, j)), |best, c| if at(4 + c, j) > best.1 { (c, at(4 + c, j)) } else { best });
                    (score > conf).then(|| Candidate { xywh: [at(0, j), at(1, j), at(2, j), at(3, j)], score, class_id })
                })
                .collect()
        })
        .collect()
}

/// A candidate's box as xyxy in network-input pixels.
fn xyxy(c: &Candidate) -> [f32; 4] {
    let [x, y, w, h] = c.xywh;
    [x - w / 2.0, y - h / 2.0, x + w / 2.0, y + h / 2.0]
}

/// Class-aware NMS over one image's candidates; returns kept candidates as xyxy boxes in
/// network-input pixels, best first.
pub fn nms(cands: Vec<Candidate>, th: &Thresholds) -> Vec<(Candidate, [f32; 4])> {
    nms_of_best(cands, th, MAX_NMS)
}

/// [`nms`] over the best `max_nms` candidates (the device NMS's checks set it lower).
pub fn nms_of_best(cands: Vec<Candidate>, th: &Thresholds, max_nms: usize) -> Vec<(Candidate, [f32; 4])> {
    // score order, descending, ties in candidate (anchor) order, as the reference's stable
    // argsort: one key a candidate, the score's total order above its position
    let mut order: Vec<u64> = Vec::with_capacity(cands.len().min(u32::MAX as usize));
    order.extend(
        cands
            .iter()
            .take(u32::MAX as usize)
            .enumerate()
            .filter(|(_, c)| c.score > th.conf && c.score.is_finite())
            .map(|(i, c)| (u64::from(!total_order_bits(c.score)) << 32) | i as u64),
    );
    order.sort_unstable();
    order.truncate(max_nms);
    // greedy NMS in score order: a candidate survives unless a box kept before it overlaps it by
    // more than the threshold. Boxes of different classes never suppress each other (the class
    // offset above), so each candidate is compared with the kept boxes of its own class only (at
    // most max_det), and the pass stops at max_det kept: a crowded picture, or an untrained model
    // with every anchor a candidate, has thousands of candidates but needs only the first few
    // hundred visited
    let mut kept_of_class = KeptByClass::default();
    let mut kept = Vec::with_capacity(th.max_det.min(order.len()));
    for key in order {
        if kept.len() >= th.max_det {
            break;
        }
        let c = cands[(key & u64::from(u32::MAX)) as usize];
        let xyxy = xyxy(&c);
        let o = c.class_id as f32 * MAX_WH;
        let shifted = xyxy.map(|v| v + o);
        let same = kept_of_class.of(c.class_id);
        if same.overlaps(&shifted, th.iou) {
            continue;
        }
        same.push(&shifted);
        kept.push((c, xyxy));
    }
    kept
}

/// `f32::total_cmp`'s order as unsigned integers: a < b in that order iff the bits compare so.
fn total_order_bits(v: f32) -> u32 {
    let b = v.to_bits();
    if b >> 31 == 1 {
        !b
    } else {
        b | 1 << 31
    }
}

/// Full post-processing of one image: NMS, then boxes mapped to original pixels and labelled.
pub fn finish(cands: Vec<Candidate>, th: &Thresholds, geom: &LetterboxGeometry, names: &[String]) -> Vec<Detection> {
    nms(cands, th).into_iter().map(|(c, b)| detection(c, b, geom, names)).collect()
}

/// [`finish`] of candidates NMS has already kept (the device's), best first.
pub fn finish_kept(kept: Vec<Candidate>, geom: &LetterboxGeometry, names: &[String]) -> Vec<Detection> {
    kept.into_iter().map(|c| detection(c, xyxy(&c), geom, names)).collect()
}

fn detection(c: Candidate, b: [f32; 4], geom: &LetterboxGeometry, names: &[String]) -> Detection {
    Detection {
        class_id: c.class_id,
        label: names.get(c.class_id).cloned().unwrap_or_else(|| c.class_id.to_string()),
        confidence: c.score,
        bbox: geom.unletterbox(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(x: f32, y: f32, s: f32, cls: usize) -> Candidate {
        Candidate { xywh: [x, y, 10.0, 10.0], score: s, class_id: cls }
    }

    #[test]
    fn kept_rows_become_per_picture_detections_as_the_host_nms_gives_them() {
        // what the device NMS returns for three pictures: each picture's kept boxes together and
        // best first, picture 1 without any, a stray picture, and a trailing partial row
        let cands = [
            vec![cand(10.0, 10.0, 0.9, 0), cand(11.0, 10.0, 0.8, 0), cand(40.0, 40.0, 0.7, 2), cand(11.0, 10.0, 0.6, 1)],
            vec![],
            vec![Candidate { xywh: [3.0, 6.0, 3.5, 4.25], score: 0.5, class_id: 7 }],
        ];
        let th = Thresholds::default();
        let mut rows = Vec::new();
        for (pic, c) in cands.iter().enumerate() {
            for (k, (c, _)) in nms(c.clone(), &th).into_iter().enumerate() {
                rows.extend([c.xywh[0], c.xywh[1], c.xywh[2], c.xywh[3], c.score, c.class_id as f32, pic as f32, k as f32]);
            }
        }
        rows.extend([1.0, 1.0, 1.0, 1.0, 0.99, 0.0, 9.0, 0.0]);
        rows.extend([1.0, 2.0, 3.0]);
        let kept = kept_from_rows(&rows, 3);
        assert_eq!(kept.iter().map(Vec::len).collect::<Vec<_>>(), vec![3, 0, 1], "{kept:?}");
        let geom = crate::vision::preprocess::LetterboxGeometry::fit(1280, 720, 640, crate::vision::preprocess::Fit::Rect);
        let names: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        for (k, c) in kept.into_iter().zip(cands) {
            assert_eq!(finish_kept(k, &geom, &names), finish(c, &th, &geom, &names));
        }
    }

    #[test]
    fn device_rows_become_per_picture_lists_in_anchor_order() {
        // rows as the device appends them: out of order, pictures interleaved, one stray picture
        let row = |pic: f32, anchor: f32, score: f32, cls: f32| [anchor, 2.0 * anchor, 3.0, 4.0, score, cls, pic, anchor];
        let rows: Vec<f32> =
            [row(1.0, 7.0, 0.5, 2.0), row(0.0, 9.0, 0.6, 0.0), row(1.0, 3.0, 0.7, 1.0), row(5.0, 1.0, 0.9, 0.0), row(0.0, 2.0, 0.8, 3.0)]
                .concat();
        let per = candidates_from_rows(&rows, 3, 10);
        assert_eq!(per.len(), 3);
        let anchors = |l: &Vec<Candidate>| l.iter().map(|c| c.xywh[0] as usize).collect::<Vec<_>>();
        assert_eq!(anchors(&per[0]), vec![2, 9]);
        assert_eq!(anchors(&per[1]), vec![3, 7]);
        assert!(per[2].is_empty());
        assert_eq!(per[1][0], Candidate { xywh: [3.0, 6.0, 3.0, 4.0], score: 0.7, class_id: 1 });
        // a partial row at the end is ignored
        assert_eq!(candidates_from_rows(&rows[..DEVICE_ROW + 3], 3, 10)[1].len(), 1);
        // an anchor out of range, and a second row for one anchor, are dropped
        assert_eq!(candidates_from_rows(&rows, 3, 8)[0].len(), 1);
        let twice = [row(0.0, 2.0, 0.8, 3.0), row(0.0, 2.0, 0.1, 1.0)].concat();
        assert_eq!(candidates_from_rows(&twice, 1, 10)[0], vec![Candidate { xywh: [2.0, 4.0, 3.0, 4.0], score: 0.8, class_id: 3 }]);
        assert_eq!(candidates_from_rows(&rows, 3, 0), vec![Vec::new(); 3]);
    }

    #[test]
    fn suppresses_overlaps_of_same_class_only() {
        let th = Thresholds::default();
        let kept = nms(vec![cand(10.0, 10.0, 0.9, 0), cand(11.0, 10.0, 0.8, 0), cand(11.0, 10.0, 0.7, 1), cand(50.0, 50.0, 0.6, 0)], &th);
        let scores: Vec<f32> = kept.iter().map(|(c, _)| c.score).collect();
        assert_eq!(scores, vec![0.9, 0.7, 0.6]);
    }

    #[test]
    fn confidence_filter_and_max_det() {
        let th = Thresholds { conf: 0.5, iou: 0.7, max_det: 2 };
        let kept = nms((0..10).map(|i| cand(i as f32 * 100.0, 0.0, 0.4 + i as f32 * 0.05, 0)).collect(), &th);
        assert_eq!(kept.len(), 2);
        assert!(kept[0].0.score > kept[1].0.score && kept[1].0.score > 0.5);
    }

    #[test]
    fn iou_threshold_separates_overlaps() {
        let th = Thresholds { conf: 0.1, iou: 0.5, max_det: 300 };
        let a = Candidate { xywh: [5.0, 5.0, 10.0, 10.0], score: 0.9, class_id: 0 };
        // shifted by 4: IoU 60/140 = 0.43 -> both kept; shifted by 2: IoU 80/120 = 0.67 -> suppressed
        let b = Candidate { xywh: [5.0, 9.0, 10.0, 10.0], score: 0.8, class_id: 0 };
        let c = Candidate { xywh: [5.0, 7.0, 10.0, 10.0], score: 0.8, class_id: 0 };
        assert_eq!(nms(vec![a, b], &th).len(), 2);
        assert_eq!(nms(vec![a, c], &th).len(), 1);
    }

    /// The reference's IoU of two xyxy boxes.
    fn iou(a: &[f32; 4], b: &[f32; 4]) -> f32 {
        let iw = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
        let ih = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
        let inter = iw * ih;
        let area_a = (a[2] - a[0]) * (a[3] - a[1]);
        let area_b = (b[2] - b[0]) * (b[3] - b[1]);
        inter / (area_a + area_b - inter + 1e-9)
    }

    /// The greedy pass over every candidate at once, as the reference writes it
    /// (`torchvision.ops.nms` on class-offset boxes, then the first `max_det`).
    fn nms_one_pass(mut cands: Vec<Candidate>, th: &Thresholds) -> Vec<(Candidate, [f32; 4])> {
        cands.retain(|c| c.score > th.conf && c.score.is_finite());
        cands.sort_by(|a, b| b.score.total_cmp(&a.score));
        cands.truncate(MAX_NMS);
        let xyxy = |c: &Candidate| {
            let [x, y, w, h] = c.xywh;
            [x - w / 2.0, y - h / 2.0, x + w / 2.0, y + h / 2.0]
        };
        let shifted = |c: &Candidate| xyxy(c).map(|v| v + c.class_id as f32 * MAX_WH);
        let mut suppressed = vec![false; cands.len()];
        let mut keep = Vec::new();
        for i in 0..cands.len() {
            if keep.len() >= th.max_det {
                break; // the reference's `i[:max_det]`
            }
            if suppressed[i] {
                continue;
            }
            keep.push((cands[i], xyxy(&cands[i])));
            for j in i + 1..cands.len() {
                if !suppressed[j] && iou(&shifted(&cands[i]), &shifted(&cands[j])) > th.iou {
                    suppressed[j] = true;
                }
            }
        }
        keep
    }

    /// Pseudo-random numbers in [0, 1) (xorshift64), the same sequence for a seed on every run.
    fn uniform(mut seed: u64) -> impl FnMut() -> f32 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f32 / (1u64 << 53) as f32
        }
    }

    #[test]
    fn kept_list_pass_keeps_what_one_pass_over_all_keeps() {
        // crowded pictures: thousands of overlapping candidates over a few classes, score ties
        // included, at several max_det (an untrained model makes every anchor a candidate)
        let mut next = uniform(0x9e37_79b9_7f4a_7c15u64);
        for (n, classes, max_det, conf) in [
            (3000, 5, 300, 0.1),
            (2000, 80, 300, 0.1),
            // ids past the table of classes (a broken model's)
            (3000, 2 * DENSE_CLASSES, 300, 0.1),
            (8400, 1, 300, 0.1),
            (500, 2, 7, 0.1),
            (800, 3, 1, 0.1),
            (100, 1, 0, 0.1),
            (2000, 3, 300, -1.0),
        ] {
            let mut cands: Vec<Candidate> = (0..n)
                .map(|_| Candidate {
                    xywh: [next() * 200.0, next() * 200.0, 5.0 + next() * 40.0, 5.0 + next() * 40.0],
                    // ties, and below zero where the threshold is (-0.0 and 0.0 among them)
                    score: (next() * 20.0).round() / 20.0 - if conf < 0.0 { 0.5 } else { 0.0 },
                    class_id: (next() * classes as f32) as usize % classes,
                })
                .collect();
            // what a broken model can output: non-finite and inverted boxes, scores
            for (i, v) in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -30.0].into_iter().enumerate() {
                cands[7 * i].xywh[i] = v;
                cands[7 * i + 1].score = [f32::NAN, f32::INFINITY, -0.0, 0.0][i];
            }
            let th = Thresholds { conf, iou: 0.5, max_det };
            let (fast, slow) = (nms(cands.clone(), &th), nms_one_pass(cands, &th));
            assert_eq!(fast.is_empty(), max_det == 0);
            // bit for bit, NaN boxes included
            let bits = |k: &[(Candidate, [f32; 4])]| {
                k.iter().map(|(c, b)| (c.xywh.map(f32::to_bits), c.score.to_bits(), c.class_id, b.map(f32::to_bits))).collect::<Vec<_>>()
            };
            assert_eq!(bits(&fast), bits(&slow), "{n} candidates, {classes} classes, max_det {max_det}, conf {conf}");
        }
    }

    #[test]
    fn only_the_best_max_nms_candidates_enter_nms() {
        // 30005 copies of one box, then five apart from it with the lowest scores: the five are
        // past the reference's max_nms and never kept
        let mut cands: Vec<Candidate> =
            (0..MAX_NMS + 5).map(|i| Candidate { xywh: [50.0, 50.0, 20.0, 20.0], score: 0.9 - i as f32 * 1e-5, class_id: 0 }).collect();
        for (k, c) in cands.iter_mut().rev().take(5).enumerate() {
            c.xywh = [200.0 + 50.0 * k as f32, 50.0, 20.0, 20.0];
        }
        cands.reverse();
        let th = Thresholds { conf: 0.1, iou: 0.7, max_det: 300 };
        let kept = nms(cands.clone(), &th);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept, nms_one_pass(cands, &th));
    }

    #[test]
    fn lane_groups_answer_as_the_scalar_iou_on_every_vector_width() {
        let mut next = uniform(0x2545_f491_4f6c_dd1du64);
        let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 1e30];
        for n in [0usize, 1, 15, 16, 17, 33, 64] {
            let mut kept = KeptBoxes::default();
            let mut boxes = Vec::new();
            for k in 0..n {
                let (x, y) = (next() * 100.0, next() * 100.0);
                let mut b = [x, y, x + 1.0 + next() * 30.0, y + 1.0 + next() * 30.0];
                if k % 9 == 4 {
                    b[k % 4] = specials[k % specials.len()];
                }
                kept.push(&b);
                boxes.push(b);
            }
            for j in 0..200 {
                let (x, y) = (next() * 110.0 - 5.0, next() * 110.0 - 5.0);
                let mut b = [x, y, x + next() * 40.0, y + next() * 40.0];
                // special sides on the candidate too (a NaN one makes its area NaN)
                if j % 7 == 3 {
                    b[j % 4] = specials[j % specials.len()];
                }
                for thr in [-1.0, 0.0, 0.3, 0.7, f32::NAN] {
                    let want = boxes.iter().any(|a| iou(a, &b) > thr);
                    assert_eq!(kept.overlaps_lanes(&b, thr), want, "{n} kept, threshold {thr}");
                    #[cfg(target_arch = "x86_64")]
                    {
                        if std::arch::is_x86_feature_detected!("avx2") {
                            // SAFETY: AVX2 checked just above.
                            assert_eq!(unsafe { kept.overlaps_avx2(&b, thr) }, want);
                        }
                        if std::arch::is_x86_feature_detected!("avx512f") {
                            // SAFETY: AVX-512F checked just above.
                            assert_eq!(unsafe { kept.overlaps_avx512(&b, thr) }, want);
                        }
                    }
                }
            }
        }
        // the last group's lanes past the kept boxes are zeros, which a negative threshold would
        // count as overlaps: masked out (the one box here, with an infinite side, overlaps nothing)
        let mut kept = KeptBoxes::default();
        kept.push(&[f32::INFINITY, 0.0, f32::INFINITY, 10.0]);
        assert!(!kept.overlaps(&[0.0, 0.0, 10.0, 10.0], -1.0));
    }
}
