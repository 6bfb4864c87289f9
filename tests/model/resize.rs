//! Letterbox resize bit-exactness with `cv2.resize(..., INTER_LINEAR)` (OpenCV 5, x86 SIMD path),
//! on seeded random and gradient pictures; goldens from `scripts/make_goldens.py --only resize`.

use sha2::{Digest, Sha256};
use yolo_edge::vision::preprocess::resize_linear_cv;

use crate::common::golden;
use crate::seeded::uniforms;

fn hex(b: &[u8]) -> String {
    Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect()
}

fn source(case: &serde_json::Value) -> (Vec<u8>, usize, usize) {
    let w = case["src_size"][0].as_u64().unwrap() as usize;
    let h = case["src_size"][1].as_u64().unwrap() as usize;
    let px = match case["src"].as_str().unwrap() {
        "prng" => uniforms(case["src_name"].as_str().unwrap(), w * h * 3).iter().map(|u| (u * 256.0).floor() as u8).collect(),
        "gradient" => (0..h)
            .flat_map(|y| {
                (0..w).flat_map(move |x| [(x * 255 / (w - 1)) as u8, (y * 255 / (h - 1)) as u8, ((x + y) * 255 / (w + h - 2)) as u8])
            })
            .collect(),
        other => panic!("unknown source {other}"),
    };
    (px, w, h)
}

#[test]
fn resize_is_bit_exact_with_opencv() {
    let g = golden("resize_cv2.json");
    let mut bad = Vec::new();
    for case in g["cases"].as_array().unwrap() {
        let (src, w, h) = source(case);
        if let Some(s) = case["src_sha256"].as_str() {
            assert_eq!(hex(&src), s, "source picture differs for {case}");
        }
        let dw = case["dst_size"][0].as_u64().unwrap() as usize;
        let dh = case["dst_size"][1].as_u64().unwrap() as usize;
        let out = resize_linear_cv(&src, w, h, dw, dh);
        if hex(&out) != case["dst_sha256"].as_str().unwrap() {
            let first: Vec<u8> = case["dst_first64"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u8).collect();
            bad.push(format!("{w}x{h} -> {dw}x{dh}: first bytes {:?} vs {:?}", &out[..8], &first[..8]));
        }
    }
    assert!(bad.is_empty(), "{} case(s) differ from cv2:\n{}", bad.len(), bad.join("\n"));
}
