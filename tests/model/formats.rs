//! Checkpoint formats: the ultralytics fixture, `convert` round trips, bare safetensors, files
//! from the official WongKinYiu code (made by `scripts/make_test_checkpoints.py`), and damaged
//! or mismatched files, which must give errors naming the file and tensor.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use yolo_edge::detector::Detector;
use yolo_edge::model::{BuildOptions, HeadStyle, ModelError, Variant, YoloV9};
use yolo_edge::weights::{Checkpoint, SourceFormat, WeightsError};

use crate::common::*;

fn raw_on_fixtures(path: &Path, dtype: DType) -> Tensor {
    let det = Detector::load(path, &Device::Cpu, dtype, Some(320)).unwrap();
    let lbs = fixture_inputs(320);
    det.raw(&lbs.iter().collect::<Vec<_>>()).unwrap().to_dtype(DType::F32).unwrap()
}

fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    let d = (a - b).unwrap().sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap() as f64;
    let n = b.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap() as f64;
    (d / n).sqrt()
}

#[test]
fn ultralytics_fixture_is_recognised() {
    let ck = Checkpoint::load(&fixture("yolov9t-ball.pt")).unwrap();
    assert_eq!(ck.format, SourceFormat::Ultralytics);
    assert_eq!(ck.tensors["model.0.conv.weight"].dtype(), DType::F16);
    let m = YoloV9::from_checkpoint(&ck, &BuildOptions::new(Device::Cpu, DType::F32)).unwrap();
    let i = m.info();
    assert_eq!(i.variant, Variant::T);
    assert_eq!(i.head, HeadStyle::Depthwise);
    assert_eq!((i.nc, i.names.clone()), (1, vec!["ball".to_string()]));
    assert_eq!(i.strides, vec![8, 16, 32]);
    assert!((1_700_000..1_800_000).contains(&i.parameters), "parameters {}", i.parameters);
    assert!(i.sha256.starts_with("9d5338b0"), "{}", i.sha256);
}

#[test]
fn convert_round_trip_f32_and_f16() {
    let dir = tmpdir();
    let src = fixture("yolov9t-ball.pt");
    let want = raw_on_fixtures(&src, DType::F32);
    for (dt, tol) in [("f32", 1e-5), ("f16", 5e-3)] {
        let out = dir.path().join(format!("t-{dt}.safetensors"));
        let st = crate::runner::yolo_edge().args(["convert"]).arg(&src).arg(&out).args(["--dtype", dt]).status().unwrap();
        assert!(st.success());
        let ck = Checkpoint::load(&out).unwrap();
        assert_eq!(ck.format, SourceFormat::FusedSafetensors);
        assert_eq!(ck.metadata["variant"], "yolov9t");
        assert_eq!(ck.metadata["names"], "[\"ball\"]");
        assert!(!ck.tensors.keys().any(|k| k.contains(".bn.")), "BatchNorm not folded");
        let got = raw_on_fixtures(&out, DType::F32);
        let e = rel_err(&got, &want);
        assert!(e <= tol, "{dt}: converted model differs by {e:.2e}");
        let info = Detector::load(&out, &Device::Cpu, DType::F32, None).unwrap();
        assert_eq!(info.info().names, vec!["ball".to_string()]);
    }
}

fn write_safetensors(path: &Path, tensors: &HashMap<String, Tensor>) {
    safetensors::serialize_to_file(tensors, None, path).unwrap();
}

#[test]
fn bare_state_dict_safetensors_loads() {
    let dir = tmpdir();
    let ck = Checkpoint::load(&fixture("yolov9t-ball.pt")).unwrap();
    let p = dir.path().join("sd.safetensors");
    write_safetensors(&p, &ck.tensors);
    let got = raw_on_fixtures(&p, DType::F32);
    let want = raw_on_fixtures(&fixture("yolov9t-ball.pt"), DType::F32);
    assert!(rel_err(&got, &want) < 1e-6);
}

fn load_err(tensors: HashMap<String, Tensor>) -> String {
    let dir = tmpdir();
    let p = dir.path().join("broken.safetensors");
    write_safetensors(&p, &tensors);
    let ck = Checkpoint::load(&p).unwrap();
    match YoloV9::from_checkpoint(&ck, &BuildOptions::new(Device::Cpu, DType::F32)) {
        Ok(_) => panic!("a broken checkpoint loaded"),
        Err(e) => {
            let s = e.to_string();
            assert!(s.contains("broken.safetensors"), "error does not name the file: {s}");
            s
        }
    }
}

#[test]
fn missing_extra_and_misshaped_tensors_are_named() {
    let base = Checkpoint::load(&fixture("yolov9t-ball.pt")).unwrap().tensors;
    let mut t = base.clone();
    t.remove("model.4.cv2.0.m.0.cv1.conv1.bn.running_var");
    let e = load_err(t);
    assert!(e.contains("model.4.cv2.0.m.0.cv1.conv1.bn.running_var") && e.contains("missing"), "{e}");

    let mut t = base.clone();
    t.insert("model.9.extra.weight".into(), Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap());
    let e = load_err(t);
    assert!(e.contains("model.9.extra.weight") && e.contains("unexpected"), "{e}");

    let mut t = base.clone();
    t.insert("model.15.cv4.conv.weight".into(), Tensor::zeros((64, 7, 1, 1), DType::F32, &Device::Cpu).unwrap());
    let e = load_err(t);
    assert!(e.contains("model.15.cv4.conv.weight") && e.contains("shape"), "{e}");

    let t: HashMap<String, Tensor> = base.into_iter().filter(|(k, _)| !k.starts_with("model.22.")).collect();
    let e = load_err(t);
    assert!(e.contains("unknown architecture"), "{e}");
}

/// Shapes a damaged or foreign file may carry that pass the loader's first reading but fit no
/// layer: a scalar where the head reads a channel count (it panicked), and weights that look
/// grouped with a group count that does not divide the output channels (they loaded, and candle
/// ran them as a narrower convolution, so every picture failed later). Both are refused at load,
/// naming the file and tensor; a real grouped weight still loads and runs. Found by the `model`
/// fuzz target (inputs in `fuzz/regressions/model/`).
#[test]
fn shapes_that_fit_no_layer_are_refused_at_load() {
    let path = fixture("yolov9t-ball.pt");
    let base = Checkpoint::load(&path).unwrap().tensors;
    let zeros = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &Device::Cpu).unwrap();

    let mut t = base.clone();
    t.insert("model.22.cv2.0.0.conv.weight".into(), zeros(&[]));
    let e = load_err(t.clone());
    assert!(e.contains("model.22"), "{e}");
    let dir = tmpdir();
    let p = dir.path().join("scalar-head.safetensors");
    write_safetensors(&p, &t);
    let out = crate::runner::yolo_edge().args(["info"]).arg(&p).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(!stderr.contains("panicked") && stderr.contains("scalar-head.safetensors"), "{stderr}");

    // 16 inputs in groups of 3 and 224 in groups of 2: no group count divides 16 or 96 outputs
    for (name, shape) in [("model.0.conv.weight", [16, 1, 3, 3]), ("model.12.cv1.conv.weight", [96, 2, 1, 1])] {
        let mut t = base.clone();
        t.insert(name.into(), zeros(&shape));
        let e = load_err(t);
        assert!(e.contains(name) && e.contains("shape"), "{name}: {e}");
    }

    // 16 groups of one input and two outputs each: a grouped convolution nn.Conv2d can hold
    let mut ck = Checkpoint::load(&path).unwrap();
    ck.tensors.insert("model.1.conv.weight".into(), zeros(&[32, 1, 3, 3]));
    let m = YoloV9::from_checkpoint(&ck, &BuildOptions::new(Device::Cpu, DType::F32)).unwrap();
    let raw = m.forward(&zeros(&[1, 3, 64, 64])).unwrap();
    // 64x64 at strides 8, 16 and 32: 64 + 16 + 4 anchors; one class
    assert_eq!(raw.dims(), &[1, 5, 84]);
}

/// The training size a checkpoint stores becomes the network input when the caller gives none
/// (`eval` without `--imgsz`): past `MAX_IMGSZ` it is refused, naming the file, instead of sizing
/// every letterbox by it.
#[test]
fn a_stored_training_size_past_the_bound_is_refused() {
    let tensors = Checkpoint::load(&fixture("yolov9t-ball.pt")).unwrap().tensors;
    let dir = tmpdir();
    let p = dir.path().join("huge-imgsz.safetensors");
    let meta = HashMap::from([("imgsz".to_string(), (1u64 << 30).to_string())]);
    safetensors::serialize_to_file(&tensors, Some(meta), &p).unwrap();
    let e = Detector::load(&p, &Device::Cpu, DType::F32, None).err().expect("a 2^30 input size was taken").to_string();
    assert!(e.contains("huge-imgsz.safetensors") && e.contains("training size"), "{e}");
    // a size the caller gives is used
    assert_eq!(Detector::load(&p, &Device::Cpu, DType::F32, Some(320)).unwrap().imgsz(), 320);
}

#[test]
fn damaged_files_give_errors_not_panics() {
    let dir = tmpdir();
    let good = std::fs::read(fixture("yolov9t-ball.pt")).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty.pt", vec![]),
        ("truncated.pt", good[..good.len() / 2].to_vec()),
        ("tail-cut.pt", good[..good.len() - 100].to_vec()),
        ("random.pt", (0..5000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect()),
        ("text.safetensors", b"this is not a model at all, just some text".to_vec()),
        ("bad-header.safetensors", [&200u64.to_le_bytes()[..], b"{\"a\":1}"].concat()),
    ];
    for (name, bytes) in cases {
        let p: PathBuf = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        let r = Checkpoint::load(&p)
            .map_err(ModelError::from)
            .and_then(|ck| YoloV9::from_checkpoint(&ck, &BuildOptions::new(Device::Cpu, DType::F32)).map(|_| ()));
        let e = r.expect_err(name).to_string();
        assert!(e.contains(name), "{name}: error does not name the file: {e}");
        // and the CLI exits with the model error code, without a panic
        let out = crate::runner::yolo_edge().args(["info"]).arg(&p).output().unwrap();
        assert_eq!(out.status.code(), Some(4), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
    }
    // the corrupted storage of one tensor is named
    let mut zipped = good.clone();
    let at = zipped.len() / 3;
    zipped.truncate(at);
    let p = dir.path().join("cut.pt");
    std::fs::write(&p, &zipped).unwrap();
    assert!(matches!(Checkpoint::load(&p), Err(WeightsError::NotACheckpoint { .. }) | Err(WeightsError::Tensor { .. })));
}

/// Checkpoints made by `scripts/make_test_checkpoints.py` with the reference code (the official
/// WongKinYiu/yolov9 classes via the `yolo9` package, an f32 ultralytics file, a bare state dict),
/// each with its reference output on a seeded input. CI generates them (`.ci/run`); a developer
/// machine without the reference venv skips, unless `YOLO_EDGE_REQUIRE_TESTDATA` is set.
#[test]
fn generated_reference_checkpoints() {
    let Some(dir) = testdata("", "scripts/make_test_checkpoints.py") else { return };
    let seeded_input = || {
        let v: Vec<f32> = crate::seeded::uniforms("test-input", 3 * 640 * 640).into_iter().map(|u| u as f32).collect();
        Tensor::from_vec(v, (1, 3, 640, 640), &Device::Cpu).unwrap()
    };
    for (file, variant, head, nc, names) in [
        ("official-gelan-t", Variant::T, HeadStyle::Classic, 80, None),
        ("ultra-yolov9s-f32", Variant::S, HeadStyle::Classic, 3, Some(vec!["a", "b", "c"])),
    ] {
        let path = dir.join(format!("{file}.pt"));
        let g: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{file}.json"))).unwrap()).unwrap();
        let ck = Checkpoint::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let model = YoloV9::from_checkpoint(&ck, &BuildOptions::new(Device::Cpu, DType::F32)).unwrap_or_else(|e| panic!("{e}"));
        let i = model.info();
        assert_eq!((i.variant, i.head, i.nc), (variant, head, nc), "{file}");
        if let Some(n) = names {
            assert_eq!(i.names, n.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        }
        let y = model.forward(&seeded_input()).unwrap();
        let (rel, sums) = compare_to_golden(&y, &g);
        eprintln!("{file}: rel L2 {rel:.2e}, row sums {sums:.2e}");
        assert!(rel <= 2e-3 && sums <= 2e-3, "{file}: rel {rel:.2e} sums {sums:.2e}");
    }
    // the real checkpoint's state dict as bare safetensors (f16 + int64 scalars) computes the same
    let want = raw_on_fixtures(&fixture("yolov9t-ball.pt"), DType::F32);
    let got = raw_on_fixtures(&dir.join("state-dict-t.safetensors"), DType::F32);
    assert!(rel_err(&got, &want) < 1e-6);
    for bad in ["broken-empty.pt", "broken-no-data-pkl.pt", "broken-random.bin", "broken-truncated.pt"] {
        let p = dir.join(bad);
        let e = Checkpoint::load(&p).expect_err(bad).to_string();
        assert!(e.contains(bad), "{e}");
    }
}
