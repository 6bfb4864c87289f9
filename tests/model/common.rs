//! Shared helpers: fixture paths, golden files, letterboxed inputs, error metrics.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use serde_json::Value;
use yolo_edge::vision::preprocess::{self, DecodeLimits, Letterboxed};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixture(name: &str) -> PathBuf {
    let p = root().join("../shared/fixtures").join(name);
    assert!(p.exists(), "fixture {} missing (../shared/fixtures beside the repo)", p.display());
    p
}

/// The folder `sub` of the generated test data (`$YOLO_EDGE_TESTDATA`, else `target/testdata`)
/// when it holds a `manifest.json`; `None` (the test skips) on a machine that has not run
/// `script`, unless `YOLO_EDGE_REQUIRE_TESTDATA` is set (CI), where that is a failure.
pub fn testdata(sub: &str, script: &str) -> Option<PathBuf> {
    let dir = std::env::var("YOLO_EDGE_TESTDATA").map(PathBuf::from).unwrap_or_else(|_| root().join("target/testdata")).join(sub);
    if dir.join("manifest.json").exists() {
        return Some(dir);
    }
    assert!(std::env::var("YOLO_EDGE_REQUIRE_TESTDATA").is_err(), "{} has no manifest.json", dir.display());
    eprintln!("SKIP: {} missing (run {script})", dir.display());
    None
}

pub fn golden(name: &str) -> Value {
    let p = root().join("tests/goldens").join(name);
    let s = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e} (run scripts/make_goldens.py)", p.display()));
    serde_json::from_str(&s).unwrap()
}

/// The two fixture photos in golden order, letterboxed.
pub fn fixture_inputs(imgsz: u32) -> Vec<Letterboxed> {
    ["horses.jpg", "volleyball-court.jpg"]
        .iter()
        .map(|n| preprocess::letterbox(&preprocess::load_image(&fixture(n), &DecodeLimits::default()).unwrap(), imgsz))
        .collect()
}

/// Checks that our letterboxed fixtures are the pixels the golden was computed on, so that a
/// preprocessing change is reported as such and not as a model mismatch.
pub fn assert_same_inputs(lbs: &[Letterboxed], g: &Value) {
    use sha2::Digest;
    for (lb, want) in lbs.iter().zip(g["inputs"].as_array().unwrap()) {
        let got: String = sha2::Sha256::digest(&lb.pixels).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(got, want["pixels_sha256"].as_str().unwrap(), "letterboxed {} differs from the golden's input", want["image"]);
    }
}

/// Normalised `(B, 3, H, W)` f32 input on the CPU.
pub fn input_tensor(lbs: &[Letterboxed]) -> Tensor {
    let (w, h) = (lbs[0].geometry.in_w as usize, lbs[0].geometry.in_h as usize);
    let bytes: Vec<u8> = lbs.iter().flat_map(|l| l.pixels.iter().copied()).collect();
    (Tensor::from_vec(bytes, (lbs.len(), h, w, 3), &Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .permute((0, 3, 1, 2))
        .unwrap()
        .contiguous()
        .unwrap()
        / 255.0)
        .unwrap()
}

/// Relative L2 error of `out` at the golden's sampled indices, and the worst relative error of
/// the golden per-row sums.
pub fn compare_to_golden(out: &Tensor, g: &Value) -> (f64, f64) {
    let shape: Vec<usize> = g["output_shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
    assert_eq!(out.dims(), shape.as_slice(), "output shape");
    let flat = out.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let idx = g["sample_idx"].as_array().unwrap();
    let want = g["samples"].as_array().unwrap();
    let (mut num, mut den) = (0f64, 0f64);
    for (i, w) in idx.iter().zip(want) {
        let w = w.as_f64().unwrap();
        let d = flat[i.as_u64().unwrap() as usize] as f64 - w;
        num += d * d;
        den += w * w;
    }
    let rel = (num / den.max(1e-30)).sqrt();
    let sums = out.to_dtype(DType::F64).unwrap().sum(2).unwrap().flatten_all().unwrap().to_vec1::<f64>().unwrap();
    let want_sums: Vec<f64> = g["row_sums"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect::<Vec<_>>())
        .collect();
    let (mut num, mut den) = (0f64, 0f64);
    for (a, b) in sums.iter().zip(&want_sums) {
        num += (a - b) * (a - b);
        den += b * b;
    }
    (rel, (num / den.max(1e-30)).sqrt())
}

pub fn iou(a: &[f32; 4], b: &[f32; 4]) -> f32 {
    let iw = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let ih = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let i = iw * ih;
    i / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - i)
}

pub fn tmpdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}
