//! Detection metrics exactly as ultralytics 8.4 computes them (`engine/validator.py`
//! `match_predictions`, `utils/metrics.py` `ap_per_class`, `compute_ap`, `smooth`): greedy
//! confidence-ordered matching at IoU 0.50:0.05:0.95, COCO 101-point interpolated AP, and
//! precision/recall at the confidence that maximises the smoothed mean F1.

use serde::Serialize;

/// Number of IoU thresholds (0.50, 0.55, ..., 0.95).
pub const NIOU: usize = 10;

/// The IoU thresholds, as the reference's `torch.linspace(0.5, 0.95, 10)` (float32) holds them.
pub fn iou_thresholds() -> [f64; NIOU] {
    std::array::from_fn(|i| (0.5f32 + 0.05f32 * i as f32) as f64)
}

/// Points of the precision-confidence and recall-confidence curves (the reference's `np.linspace(0, 1, 1000)`).
const CURVE_POINTS: usize = 1000;
const EPS: f64 = 1e-16;

/// IoU of two xyxy boxes with the reference's `box_iou` epsilon.
pub fn box_iou(a: &[f64; 4], b: &[f64; 4]) -> f64 {
    let iw = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let ih = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = iw * ih;
    let area_a = (a[2] - a[0]) * (a[3] - a[1]);
    let area_b = (b[2] - b[0]) * (b[3] - b[1]);
    inter / (area_a + area_b - inter + 1e-7)
}

/// A labelled object or a prediction of one image, xyxy in any common pixel space.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LabeledBox {
    pub class_id: usize,
    pub bbox: [f64; 4],
}

/// Which predictions of one image are true positives at each IoU threshold.
///
/// `preds` must be in descending confidence order (as NMS returns them). Each prediction, in
/// that order, claims the unclaimed ground-truth box of its class with the highest IoU
/// (first one on ties); it is correct at threshold t when that IoU is >= t.
pub fn match_predictions(preds: &[LabeledBox], gts: &[LabeledBox]) -> Vec<[bool; NIOU]> {
    let th = iou_thresholds();
    let mut correct = vec![[false; NIOU]; preds.len()];
    if gts.is_empty() {
        return correct;
    }
    let mut matched = vec![[false; NIOU]; gts.len()];
    for (j, p) in preds.iter().enumerate() {
        let ious: Vec<f64> = gts.iter().map(|g| if g.class_id == p.class_id { box_iou(&g.bbox, &p.bbox) } else { 0.0 }).collect();
        if !ious.iter().any(|&v| v >= th[0]) {
            continue;
        }
        for (t, &thr) in th.iter().enumerate() {
            // argmax over unclaimed targets (claimed ones count as IoU 0), first index on ties
            let mut k = 0;
            let mut best = f64::NEG_INFINITY;
            for (i, &v) in ious.iter().enumerate() {
                let v = if matched[i][t] { 0.0 } else { v };
                if v > best {
                    best = v;
                    k = i;
                }
            }
            if best >= thr {
                correct[j][t] = true;
                matched[k][t] = true;
            }
        }
    }
    correct
}

/// `np.interp(x, xp, fp, left, right)` with numpy's exact rules: `xp` non-decreasing, ties in
/// `xp` resolved to the last equal index, values outside the range are `left`/`right`.
pub fn interp(x: f64, xp: &[f64], fp: &[f64], left: f64, right: f64) -> f64 {
    let n = xp.len();
    if n == 0 {
        return f64::NAN;
    }
    if x.is_nan() {
        return x;
    }
    if x < xp[0] {
        return left;
    }
    if x > xp[n - 1] {
        return right;
    }
    // last j with xp[j] <= x
    let j = xp.partition_point(|&v| v <= x) - 1;
    if j == n - 1 || xp[j] == x {
        return fp[j];
    }
    let slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j]);
    let v = slope * (x - xp[j]) + fp[j];
    if v.is_nan() {
        let v2 = slope * (x - xp[j + 1]) + fp[j + 1];
        if v2.is_nan() && fp[j] == fp[j + 1] {
            return fp[j];
        }
        return v2;
    }
    v
}

/// `np.linspace(0, 1, n)`.
fn linspace01(n: usize) -> Vec<f64> {
    let step = 1.0 / (n - 1) as f64;
    (0..n).map(|i| if i == n - 1 { 1.0 } else { i as f64 * step }).collect()
}

/// COCO 101-point interpolated average precision of one precision-recall curve (points in
/// descending-confidence order), the reference's `compute_ap`: sentinels, precision envelope,
/// `np.interp` at recall 0, 0.01, ..., 1 and the trapezoidal rule.
pub fn compute_ap(recall: &[f64], precision: &[f64]) -> f64 {
    let last = recall.last().copied().unwrap_or(1.0);
    let mut mrec = Vec::with_capacity(recall.len() + 3);
    mrec.push(0.0);
    mrec.extend_from_slice(recall);
    mrec.extend([last, 1.0]);
    let mut mpre = Vec::with_capacity(precision.len() + 3);
    mpre.push(1.0);
    mpre.extend_from_slice(precision);
    mpre.extend([0.0, 0.0]);
    // envelope: running maximum from the right
    for i in (0..mpre.len() - 1).rev() {
        mpre[i] = mpre[i].max(mpre[i + 1]);
    }
    let x = linspace01(101);
    let y: Vec<f64> = x.iter().map(|&xi| interp(xi, &mrec, &mpre, mpre[0], mpre[mpre.len() - 1])).collect();
    trapezoid(&y, &x)
}

/// `np.trapezoid(y, x)`.
fn trapezoid(y: &[f64], x: &[f64]) -> f64 {
    (1..y.len()).map(|i| (x[i] - x[i - 1]) * (y[i] + y[i - 1]) / 2.0).sum()
}

/// The reference's `smooth`: box filter of fraction `f`, ends padded with the edge values.
pub fn smooth(y: &[f64], f: f64) -> Vec<f64> {
    // nf = round(len * f * 2) // 2 + 1 (Python's round: half to even)
    let nf = ((y.len() as f64 * f * 2.0).round_ties_even() as usize) / 2 + 1;
    let pad = nf / 2;
    let (first, last) = (y[0], y[y.len() - 1]);
    let yp: Vec<f64> = std::iter::repeat_n(first, pad).chain(y.iter().copied()).chain(std::iter::repeat_n(last, pad)).collect();
    (0..=yp.len() - nf).map(|i| yp[i..i + nf].iter().map(|v| v / nf as f64).sum()).collect()
}

/// One prediction as the metric sees it: its confidence, class and per-threshold correctness.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoredPrediction {
    pub confidence: f64,
    pub class_id: usize,
    pub correct: [bool; NIOU],
}

/// Metrics of one class (only classes with at least one labelled object are reported).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassMetrics {
    pub class_id: usize,
    /// Labelled objects of this class.
    pub instances: usize,
    /// Precision and recall at the confidence that maximises the mean F1 over classes.
    pub precision: f64,
    pub recall: f64,
    /// AP at each IoU threshold 0.50..0.95.
    pub ap: [f64; NIOU],
}

impl ClassMetrics {
    pub fn ap50(&self) -> f64 {
        self.ap[0]
    }
    pub fn ap50_95(&self) -> f64 {
        self.ap.iter().sum::<f64>() / NIOU as f64
    }
}

/// Overall metrics: means over the classes that have labelled objects.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub precision: f64,
    pub recall: f64,
    pub map50: f64,
    pub map50_95: f64,
    /// Confidence (on the 1000-point grid) where the smoothed mean F1 peaks; P and R are read there.
    pub best_f1_confidence: f64,
    pub classes: Vec<ClassMetrics>,
}

/// The reference's `ap_per_class` over all predictions of a dataset and the classes of all its
/// labelled objects.
pub fn ap_per_class(preds: &[ScoredPrediction], target_classes: &[usize]) -> Summary {
    let mut order: Vec<usize> = (0..preds.len()).collect();
    // np.argsort(-conf): quicksort is not stable, but ties in a float confidence only reorder
    // predictions with equal scores, which leaves every cumulative count at the tie's end unchanged
    order.sort_by(|&a, &b| preds[b].confidence.total_cmp(&preds[a].confidence));
    let sorted: Vec<&ScoredPrediction> = order.iter().map(|&i| &preds[i]).collect();

    let mut classes: Vec<(usize, usize)> = Vec::new(); // (class, count), ascending class
    let mut tc = target_classes.to_vec();
    tc.sort_unstable();
    for c in tc {
        match classes.last_mut() {
            Some((k, n)) if *k == c => *n += 1,
            _ => classes.push((c, 1)),
        }
    }
    let x = linspace01(CURVE_POINTS);
    let neg_x: Vec<f64> = x.iter().map(|v| -v).collect();
    let mut p_curves = vec![vec![0.0; CURVE_POINTS]; classes.len()];
    let mut r_curves = vec![vec![0.0; CURVE_POINTS]; classes.len()];
    let mut aps = vec![[0.0; NIOU]; classes.len()];
    for (ci, &(c, n_l)) in classes.iter().enumerate() {
        let mine: Vec<&&ScoredPrediction> = sorted.iter().filter(|p| p.class_id == c).collect();
        if mine.is_empty() {
            continue;
        }
        let neg_conf: Vec<f64> = mine.iter().map(|p| -p.confidence).collect();
        let mut recall = vec![vec![0.0; mine.len()]; NIOU];
        let mut precision = vec![vec![0.0; mine.len()]; NIOU];
        for t in 0..NIOU {
            let (mut tpc, mut fpc) = (0.0, 0.0);
            for (k, p) in mine.iter().enumerate() {
                if p.correct[t] {
                    tpc += 1.0;
                } else {
                    fpc += 1.0;
                }
                recall[t][k] = tpc / (n_l as f64 + EPS);
                precision[t][k] = tpc / (tpc + fpc);
            }
        }
        for (i, &nx) in neg_x.iter().enumerate() {
            r_curves[ci][i] = interp(nx, &neg_conf, &recall[0], 0.0, recall[0][mine.len() - 1]);
            p_curves[ci][i] = interp(nx, &neg_conf, &precision[0], 1.0, precision[0][mine.len() - 1]);
        }
        for t in 0..NIOU {
            aps[ci][t] = compute_ap(&recall[t], &precision[t]);
        }
    }
    let nc = classes.len();
    let best = if nc == 0 {
        0
    } else {
        let mean_f1: Vec<f64> = (0..CURVE_POINTS)
            .map(|i| {
                (0..nc)
                    .map(|ci| {
                        let (p, r) = (p_curves[ci][i], r_curves[ci][i]);
                        2.0 * p * r / (p + r + EPS)
                    })
                    .sum::<f64>()
                    / nc as f64
            })
            .collect();
        let s = smooth(&mean_f1, 0.1);
        // np.argmax: first maximum
        let mut bi = 0;
        for (i, &v) in s.iter().enumerate() {
            if v > s[bi] {
                bi = i;
            }
        }
        bi
    };
    let class_metrics: Vec<ClassMetrics> = classes
        .iter()
        .enumerate()
        .map(|(ci, &(c, n))| ClassMetrics {
            class_id: c,
            instances: n,
            precision: p_curves[ci][best],
            recall: r_curves[ci][best],
            ap: aps[ci],
        })
        .collect();
    let mean = |f: &dyn Fn(&ClassMetrics) -> f64| if nc == 0 { 0.0 } else { class_metrics.iter().map(f).sum::<f64>() / nc as f64 };
    Summary {
        precision: mean(&|m| m.precision),
        recall: mean(&|m| m.recall),
        map50: mean(&|m| m.ap50()),
        map50_95: mean(&|m| m.ap50_95()),
        best_f1_confidence: x[best],
        classes: class_metrics,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(c: usize, x1: f64, y1: f64, x2: f64, y2: f64) -> LabeledBox {
        LabeledBox { class_id: c, bbox: [x1, y1, x2, y2] }
    }

    /// One image: (predictions with scores, ground truth).
    type Image = (Vec<(LabeledBox, f64)>, Vec<LabeledBox>);

    /// Runs one image through matching and the AP computation.
    fn evaluate(images: &[Image]) -> Summary {
        let mut preds = Vec::new();
        let mut targets = Vec::new();
        for (p, g) in images {
            let mut p = p.clone();
            p.sort_by(|a, b| b.1.total_cmp(&a.1));
            let boxes: Vec<LabeledBox> = p.iter().map(|(b, _)| *b).collect();
            for ((bx, conf), correct) in p.iter().zip(match_predictions(&boxes, g)) {
                preds.push(ScoredPrediction { confidence: *conf, class_id: bx.class_id, correct });
            }
            targets.extend(g.iter().map(|g| g.class_id));
        }
        ap_per_class(&preds, &targets)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn numpy_interp_rules() {
        let xp = [0.0, 0.5, 0.5, 1.0];
        let fp = [1.0, 0.8, 0.4, 0.0];
        assert_eq!(interp(-0.1, &xp, &fp, 9.0, 7.0), 9.0);
        assert_eq!(interp(1.1, &xp, &fp, 9.0, 7.0), 7.0);
        assert!(close(interp(0.25, &xp, &fp, 0.0, 0.0), 0.9));
        // a repeated xp takes the value at its last occurrence, as numpy does
        assert_eq!(interp(0.5, &xp, &fp, 0.0, 0.0), 0.4);
        assert!(close(interp(0.75, &xp, &fp, 0.0, 0.0), 0.2));
        assert_eq!(interp(1.0, &xp, &fp, 0.0, 0.0), 0.0);
    }

    #[test]
    fn smooth_matches_reference() {
        // len 10, f 0.1: nf = round(2) // 2 + 1 = 2, pad 1: y padded [1,1,2,3,...,10,10], box of 2
        let y: Vec<f64> = (1..=10).map(f64::from).collect();
        let s = smooth(&y, 0.1);
        assert_eq!(s.len(), 11);
        assert!(close(s[0], 1.0) && close(s[1], 1.5) && close(s[10], 10.0));
    }

    // Expected values below are derived by hand in the comments; every one of them was also
    // checked against ultralytics 8.4.190's own `match_predictions` and `ap_per_class`.
    //
    // How the reference integrates (compute_ap): recall/precision points get sentinels
    // mrec = [0, r.., r_last, 1], mpre = [1, p.., 0, 0]; mpre becomes its running maximum from
    // the right; y_i = interp(x_i, mrec, mpre) at x_i = i/100 (numpy: at a repeated mrec value,
    // the LAST one's precision); AP = trapezoid(y, x). Since mrec ends with (r_last, 0), (1, 0),
    // y_100 = 0 even for a perfect detector, so a perfect class scores 99 * 0.01 + 0.01 * (1 + 0) / 2
    // = 0.995, not 1 (ultralytics' well-known 0.995 ceiling).

    #[test]
    fn ap_of_perfect_curve() {
        assert!(close(compute_ap(&[0.5, 1.0], &[1.0, 1.0]), 0.995));
    }

    #[test]
    fn ap_stops_at_the_last_recall() {
        // one of two objects found, precision 1: mrec [0, .5, .5, 1], envelope [1, 1, 0, 0].
        // y_0..y_49 = 1, y_50 = 0 (x = 0.5 hits the repeated 0.5, last one: 0), rest 0.
        // AP = 49 * 0.01 + 0.01 * (1 + 0) / 2 = 0.495
        assert!(close(compute_ap(&[0.5], &[1.0]), 0.495));
    }

    #[test]
    fn perfect_predictions() {
        // two classes, one object each, found exactly: each class AP = 0.995 at every IoU.
        // P and R: both classes have p = r = 1 for confidences <= 0.8, where the smoothed mean
        // F1 peaks first (index 0): P = R = 1.
        let g = vec![b(0, 0.0, 0.0, 10.0, 10.0), b(1, 20.0, 20.0, 40.0, 40.0)];
        let p = vec![(g[0], 0.9), (g[1], 0.8)];
        let s = evaluate(&[(p, g)]);
        assert!(close(s.map50, 0.995) && close(s.map50_95, 0.995), "{s:?}");
        assert!(close(s.precision, 1.0) && close(s.recall, 1.0), "{s:?}");
    }

    #[test]
    fn no_predictions_score_zero() {
        let g = vec![b(0, 0.0, 0.0, 10.0, 10.0)];
        let s = evaluate(&[(vec![], g)]);
        assert_eq!((s.map50, s.map50_95, s.precision, s.recall), (0.0, 0.0, 0.0, 0.0));
        assert_eq!(s.classes.len(), 1);
        assert_eq!(s.classes[0].instances, 1);
    }

    #[test]
    fn no_labels_no_classes() {
        // predictions on background only: no class has labels, nothing to average -> zeros
        let s = evaluate(&[(vec![(b(0, 0.0, 0.0, 5.0, 5.0), 0.9)], vec![])]);
        assert!(s.classes.is_empty());
        assert_eq!(s.map50, 0.0);
    }

    #[test]
    fn one_false_positive_above_the_true_one() {
        // one object; predictions: FP at 0.9 (far away), TP at 0.8 (exact).
        // recall [0, 1], precision [0, .5] -> mrec [0, 0, 1, 1, 1], envelope [1, .5, .5, 0, 0].
        // y_0 = .5 (x = 0 hits the repeated 0: last one), y_1..y_99 = .5, y_100 = 0.
        // AP = 99 * 0.01 * .5 + 0.01 * (.5 + 0) / 2 = 0.4975 at every IoU threshold.
        // P/R: below confidence 0.8, p = .5, r = 1 (F1 2/3, the maximum): P = .5, R = 1.
        let g = vec![b(0, 0.0, 0.0, 10.0, 10.0)];
        let p = vec![(b(0, 50.0, 50.0, 60.0, 60.0), 0.9), (g[0], 0.8)];
        let s = evaluate(&[(p, g)]);
        assert!(close(s.map50, 0.4975) && close(s.map50_95, 0.4975), "{s:?}");
        assert!(close(s.precision, 0.5) && close(s.recall, 1.0), "{s:?}");
    }

    #[test]
    fn one_false_positive_below_the_true_one() {
        // TP at 0.9, FP at 0.8: recall [1, 1], precision [1, .5]; the envelope is 1 up to
        // recall 1, so the FP costs nothing: AP = 0.995.
        let g = vec![b(0, 0.0, 0.0, 10.0, 10.0)];
        let p = vec![(g[0], 0.9), (b(0, 50.0, 50.0, 60.0, 60.0), 0.8)];
        let s = evaluate(&[(p, g)]);
        assert!(close(s.map50, 0.995), "{s:?}");
        // P lies on the interpolated slope between the two predictions, where the 101-wide box
        // filter puts the F1 peak; the value is the reference's (0.749249), not a hand figure.
        assert!((s.precision - 0.749249).abs() < 1e-6 && close(s.recall, 1.0), "{s:?}");
    }

    #[test]
    fn duplicate_boxes_count_once() {
        // two objects. The first is predicted twice (0.9 TP, 0.8 duplicate: its object is
        // claimed, so FP), the second once (0.7 TP).
        // recall [.5, .5, 1], precision [1, .5, 2/3] -> mrec [0, .5, .5, 1, 1, 1],
        // envelope [1, 1, 2/3, 2/3, 0, 0]: y_0..y_49 = 1, y_50..y_99 = 2/3, y_100 = 0.
        // AP = .49 + .01 * (1 + 2/3) / 2 + .49 * 2/3 + .01 * (2/3) / 2 = 0.828333..
        // P/R at the F1 peak (all three counted): P = 2/3, R = 1.
        let g = vec![b(0, 0.0, 0.0, 10.0, 10.0), b(0, 100.0, 100.0, 110.0, 110.0)];
        let p = vec![(g[0], 0.9), (g[0], 0.8), (g[1], 0.7)];
        let s = evaluate(&[(p, g)]);
        let expected = 0.49 + 0.01 * (1.0 + 2.0 / 3.0) / 2.0 + 0.49 * 2.0 / 3.0 + 0.01 * (2.0 / 3.0) / 2.0;
        assert!(close(s.map50, expected) && close(s.map50_95, expected), "{} vs {expected}", s.map50);
        assert!(close(s.precision, 2.0 / 3.0) && close(s.recall, 1.0), "{s:?}");
    }

    #[test]
    fn crowd_of_overlapping_boxes_is_matched_greedily() {
        // Three overlapping objects A = x[0,10], B = x[6,16], C = x[12,22] (y 0..10).
        // Predictions, best first: P1 = x[3,13] (IoU with A 70/130 = .538, with B .538, with C
        // 10/190 = .053), then P2 = A, P3 = B, P4 = C exactly.
        // IoU .50: P1 claims A (tie -> lowest index); P2 finds A claimed, best unclaimed is B at
        // 40/160 = .25 -> FP; P3 claims B, P4 claims C. T F T T over 3 objects:
        // recall [1/3, 1/3, 2/3, 1], precision [1, 1/2, 2/3, 3/4] -> envelope 1 up to recall
        // 1/3, then 3/4: y_0..y_33 = 1, y_34..y_99 = .75, y_100 = 0.
        // AP50 = .33 + .01 * 1.75 / 2 + .65 * .75 + .01 * .75 / 2 = 0.83
        // IoU >= .55: P1 matches nothing; P2, P3, P4 are exact: F T T T, recall [0, 1/3, 2/3, 1],
        // precision [0, 1/2, 2/3, 3/4] -> envelope .75 from recall 0: AP = .99 * .75 + .01 * .75 / 2
        // = 0.74625 at each of the 9 thresholds. mAP50-95 = (.83 + 9 * .74625) / 10 = 0.754625.
        let g = vec![b(0, 0.0, 0.0, 10.0, 10.0), b(0, 6.0, 0.0, 16.0, 10.0), b(0, 12.0, 0.0, 22.0, 10.0)];
        let p = vec![(b(0, 3.0, 0.0, 13.0, 10.0), 0.9), (g[0], 0.8), (g[1], 0.7), (g[2], 0.6)];
        let boxes: Vec<LabeledBox> = p.iter().map(|(b, _)| *b).collect();
        let m = match_predictions(&boxes, &g);
        assert_eq!(m.iter().map(|c| c[0]).collect::<Vec<_>>(), vec![true, false, true, true]);
        assert_eq!(m.iter().map(|c| c[1]).collect::<Vec<_>>(), vec![false, true, true, true]);
        let s = evaluate(&[(p, g)]);
        assert!(close(s.classes[0].ap[0], 0.83), "{:?}", s.classes[0].ap);
        for t in 1..NIOU {
            assert!(close(s.classes[0].ap[t], 0.74625), "{:?}", s.classes[0].ap);
        }
        assert!(close(s.map50_95, 0.754625));
        assert!(close(s.precision, 0.75) && close(s.recall, 1.0), "{s:?}");
    }

    #[test]
    fn iou_thresholds_grade_a_shifted_box() {
        // prediction x[0,10] vs object x[1,11]: IoU 90/110 = .818 -> correct at .50...80 (7
        // thresholds), wrong at .85, .90, .95 (AP 0 there). AP50 = .995, AP50-95 = 7 * .995 / 10.
        let g = vec![b(0, 1.0, 0.0, 11.0, 10.0)];
        let s = evaluate(&[(vec![(b(0, 0.0, 0.0, 10.0, 10.0), 0.9)], g)]);
        assert!(close(s.map50, 0.995) && close(s.map50_95, 0.6965), "{s:?}");
    }

    #[test]
    fn multiple_classes_average_over_labelled_classes() {
        // image 1: class 0 found exactly (AP .995); the class-1 object gets only a class-2
        // prediction, which never matches, and class 2 has no labels so it is not averaged.
        // image 2: one class-1 object, an FP (0.85) above the TP (0.8).
        // class 1 over its 2 objects: F T -> recall [0, .5], precision [0, .5];
        // mrec [0, 0, .5, .5, 1], envelope [1, .5, .5, 0, 0]: y_0..y_49 = .5, y_50.. = 0.
        // AP = .49 * .5 + .01 * .5 / 2 = 0.2475. mAP50 = (.995 + .2475) / 2 = 0.62125.
        // P/R: class 0 p = r = 1, class 1 p = r = .5 -> P = R = .75.
        let img1 = (
            vec![(b(0, 0.0, 0.0, 10.0, 10.0), 0.9), (b(2, 20.0, 20.0, 30.0, 30.0), 0.95)],
            vec![b(0, 0.0, 0.0, 10.0, 10.0), b(1, 20.0, 20.0, 30.0, 30.0)],
        );
        let img2 = (vec![(b(1, 60.0, 60.0, 70.0, 70.0), 0.85), (b(1, 0.0, 0.0, 10.0, 10.0), 0.8)], vec![b(1, 0.0, 0.0, 10.0, 10.0)]);
        let s = evaluate(&[img1, img2]);
        assert_eq!(s.classes.iter().map(|c| (c.class_id, c.instances)).collect::<Vec<_>>(), vec![(0, 1), (1, 2)]);
        assert!(close(s.classes[0].ap50(), 0.995));
        assert!(close(s.classes[1].ap50(), 0.2475), "{:?}", s.classes[1]);
        assert!(close(s.map50, 0.62125) && close(s.map50_95, 0.62125), "{}", s.map50);
        assert!(close(s.precision, 0.75) && close(s.recall, 0.75), "{s:?}");
    }

    #[test]
    fn wrong_class_never_matches() {
        let g = vec![b(0, 0.0, 0.0, 10.0, 10.0)];
        let m = match_predictions(&[b(1, 0.0, 0.0, 10.0, 10.0)], &g);
        assert_eq!(m, vec![[false; NIOU]]);
    }
}
