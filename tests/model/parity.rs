//! Parity with the reference implementation (ultralytics 8.4, torch CPU, f32).
//!
//! Goldens: `scripts/make_goldens.py` — for seeded random weights, in PyTorch:
//! ```python
//! m = DetectionModel("yolov9t.yaml", nc=80).eval(); seed_weights(m)       # splitmix64 per tensor name
//! hooks = [bn.register_forward_pre_hook(set_running_stats) for bn in bns]  # BN stats = batch stats of x
//! m(x); [h.remove() for h in hooks]; y = m(x)[0]                           # x: the fixtures letterboxed by yolo-edge
//! json.dump({"sample_idx": idx, "samples": y.flatten()[idx], "row_sums": y.sum(-1)})
//! ```

use candle_core::{DType, Device};
use yolo_edge::detector::Detector;
use yolo_edge::model::{calibrate_batchnorm, BuildOptions, YoloV9};
use yolo_edge::vision::postprocess::Thresholds;
use yolo_edge::vision::preprocess::{self, DecodeLimits, Fit};
use yolo_edge::weights::{Checkpoint, SourceFormat};

use crate::common::*;
use crate::seeded;

fn seeded_checkpoint(g: &serde_json::Value) -> Checkpoint {
    let entries: Vec<(String, Vec<usize>)> = g["state_dict"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e[0].as_str().unwrap().to_string(), e[1].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect()))
        .collect();
    Checkpoint {
        path: format!("seeded:{}", g["variant"].as_str().unwrap_or("?")).into(),
        format: SourceFormat::Safetensors,
        tensors: seeded::state_dict(&entries),
        names: None,
        imgsz: Some(640),
        strides: None,
        metadata: Default::default(),
        sha256: String::new(),
    }
}

/// Builds the seeded model with BatchNorm calibrated on the fixtures, runs it, compares.
fn random_weights_parity(variant: &str, dtype: DType, tol: f64) {
    let g = golden(&format!("random_{variant}.json"));
    let lbs = fixture_inputs(640);
    assert_same_inputs(&lbs, &g);
    let x = input_tensor(&lbs);
    let mut ck = seeded_checkpoint(&g);
    let stats = calibrate_batchnorm(&ck, &x).unwrap();
    ck.tensors.extend(stats);
    let model = YoloV9::from_checkpoint(&ck, &BuildOptions::new(Device::Cpu, dtype)).unwrap();
    assert_eq!(model.info().variant.name(), variant);
    let y = model.forward(&x.to_dtype(dtype).unwrap()).unwrap();
    let (rel, sums) = compare_to_golden(&y, &g);
    eprintln!("{variant} {dtype:?}: sampled rel L2 {rel:.2e}, row sums {sums:.2e}");
    assert!(rel <= tol, "{variant} {dtype:?}: relative L2 error {rel:.3e} > {tol:.0e}");
    assert!(sums <= tol, "{variant} {dtype:?}: row-sum error {sums:.3e} > {tol:.0e}");
}

#[test]
fn random_yolov9t_f32() {
    random_weights_parity("yolov9t", DType::F32, 2e-3);
}
#[test]
fn random_yolov9s_f32() {
    random_weights_parity("yolov9s", DType::F32, 2e-3);
}
#[test]
fn random_yolov9m_f32() {
    random_weights_parity("yolov9m", DType::F32, 2e-3);
}
#[test]
fn random_yolov9c_f32() {
    random_weights_parity("yolov9c", DType::F32, 2e-3);
}
#[test]
fn random_yolov9e_f32() {
    random_weights_parity("yolov9e", DType::F32, 2e-3);
}
#[test]
fn random_yolov9t_f16() {
    // FP16 end to end on the CPU against the f32 reference
    random_weights_parity("yolov9t", DType::F16, 2e-2);
}

fn real_model(dtype: DType) -> Detector {
    Detector::load(&fixture("yolov9t-ball.pt"), &Device::Cpu, dtype, Some(640)).unwrap()
}

#[test]
fn real_checkpoint_raw_output_f32() {
    let g = golden("real_yolov9t_ball.json");
    let det = real_model(DType::F32);
    let lbs = fixture_inputs(640);
    assert_same_inputs(&lbs, &g);
    let y = det.raw(&lbs.iter().collect::<Vec<_>>()).unwrap();
    let (rel, sums) = compare_to_golden(&y, &g);
    eprintln!("real f32: rel {rel:.2e} sums {sums:.2e}");
    assert!(rel <= 2e-4 && sums <= 2e-4, "real checkpoint f32: rel {rel:.3e}, sums {sums:.3e} (limit 2e-4)");
}

#[test]
fn real_checkpoint_raw_output_f16() {
    let g = golden("real_yolov9t_ball.json");
    let det = real_model(DType::F16);
    let lbs = fixture_inputs(640);
    let y = det.raw(&lbs.iter().collect::<Vec<_>>()).unwrap();
    let (rel, _) = compare_to_golden(&y, &g);
    eprintln!("real f16: rel {rel:.2e}");
    assert!(rel <= 5e-3, "real checkpoint f16: rel {rel:.3e} (limit 5e-3)");
}

/// Detections from the JPEG files, box for box against the reference's own pipeline (cv2
/// decode + LetterBox + NMS + scale_boxes) at conf 0.01.
#[test]
fn real_checkpoint_detections_match_reference() {
    let g = golden("real_yolov9t_ball.json");
    let det = real_model(DType::F32);
    let th = Thresholds { conf: 0.01, iou: 0.7, max_det: 300 };
    let lbs = fixture_inputs(640);
    let ours = det.detect(&lbs.iter().collect::<Vec<_>>(), &th).unwrap();
    let refs = g["detections_predict"].as_array().unwrap();
    let mut matched = 0;
    for (img, (mine, theirs)) in ours.iter().zip(refs).enumerate() {
        let theirs = theirs.as_array().unwrap();
        for r in theirs {
            let rb: Vec<f32> = r["box"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
            let rb = [rb[0], rb[1], rb[2], rb[3]];
            let rc = r["confidence"].as_f64().unwrap() as f32;
            let hit = mine.iter().find(|d| {
                d.class_id as u64 == r["class_id"].as_u64().unwrap() && iou(&d.bbox, &rb) >= 0.95 && (d.confidence - rc).abs() <= 0.01
            });
            // a reference box right at the threshold may fall on either side of it
            assert!(hit.is_some() || rc < th.conf + 0.01, "image {img}: reference box {rb:?} conf {rc} has no match in {mine:?}");
            matched += hit.is_some() as usize;
        }
        let extra = mine.iter().filter(|d| d.confidence >= th.conf + 0.01).count();
        let theirs_above = theirs.iter().filter(|r| r["confidence"].as_f64().unwrap() as f32 >= th.conf + 0.01).count();
        assert_eq!(extra, theirs_above, "image {img}: {extra} boxes above {} here, {theirs_above} in the reference", th.conf + 0.01);
    }
    assert!(matched > 0, "no detections compared");
}

/// The rect letterbox against ultralytics `predict` at its defaults (and at conf 0.01, for boxes
/// near the threshold), box for box: same classes, IoU >= 0.99, confidence within 1e-3, on photos
/// of five aspect ratios (3:2, 16:9, portrait, 4:3, square; sides not multiples of 32), decoded
/// by yolo-edge on both sides. Golden: `scripts/make_rect_goldens.py`.
#[test]
fn rect_letterbox_detections_match_predict_box_for_box() {
    use sha2::Digest;
    let hex = |b: &[u8]| sha2::Sha256::digest(b).iter().map(|b| format!("{b:02x}")).collect::<String>();
    let g = golden("rect_yolov9t_ball.json");
    let det = real_model(DType::F32);
    let mut compared = 0;
    for case in g["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let mut img = preprocess::load_image(&fixture(case["image"].as_str().unwrap()), &DecodeLimits::default()).unwrap();
        if let Some(c) = case["crop"].as_array() {
            let c: Vec<u32> = c.iter().map(|v| v.as_u64().unwrap() as u32).collect();
            img = image::imageops::crop_imm(&img, c[0], c[1], c[2], c[3]).to_image();
        }
        assert_eq!(hex(img.as_raw()), case["decoded_sha256"].as_str().unwrap(), "{name}: decoded pixels differ from the golden's");
        let lb = preprocess::letterbox_fit(&img, 640, Fit::Rect);
        let shape = [lb.geometry.in_h as u64, lb.geometry.in_w as u64];
        assert_eq!(
            shape.to_vec(),
            case["input_shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect::<Vec<_>>(),
            "{name}"
        );
        assert_eq!(hex(&lb.pixels), case["input_sha256"].as_str().unwrap(), "{name}: rect letterbox differs from the reference's");
        let raw = det.raw(&[&lb]).unwrap();
        let (rel, sums) = compare_to_golden(&raw, &case["raw"]);
        assert!(rel <= 2e-4 && sums <= 2e-4, "{name}: raw output rel {rel:.3e}, sums {sums:.3e}");
        for (key, conf) in [("predict_default", 0.25), ("predict_conf_0_01", 0.01)] {
            let th = Thresholds { conf, iou: 0.7, max_det: 300 };
            let mine = &det.detect(&[&lb], &th).unwrap()[0];
            let theirs = case[key].as_array().unwrap();
            assert_eq!(mine.len(), theirs.len(), "{name} {key}: {mine:?} vs {theirs:?}");
            for (d, r) in mine.iter().zip(theirs) {
                let rb: Vec<f32> = r["box"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
                let rb = [rb[0], rb[1], rb[2], rb[3]];
                let rc = r["confidence"].as_f64().unwrap() as f32;
                assert_eq!(d.class_id as u64, r["class_id"].as_u64().unwrap(), "{name} {key}");
                let o = iou(&d.bbox, &rb);
                assert!(
                    o >= 0.99 && (d.confidence - rc).abs() <= 1e-3,
                    "{name} {key}: {:?} {} vs {rb:?} {rc} (IoU {o})",
                    d.bbox,
                    d.confidence
                );
                compared += 1;
            }
        }
        eprintln!("{name}: input {}x{}, raw rel {rel:.1e}", lb.geometry.in_w, lb.geometry.in_h);
    }
    assert!(compared >= 10, "only {compared} boxes compared");
}
