//! End-to-end evaluation of the committed default model (`models/yolov9t-shapes.safetensors`) on
//! the pictures `yolo_edge::demo::samples` draws (a different renderer from the training generator,
//! so this also checks that the model learned shapes, not the generator's pixels), through the
//! library and through the `yolo-edge eval` command.

use std::path::{Path, PathBuf};

use yolo_edge::demo::samples;

#[path = "common/runner.rs"]
mod runner;
use yolo_edge::detector::Detector;
use yolo_edge::eval::{self, dataset::Dataset, EvalOptions};

const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/models/yolov9t-shapes.safetensors");

fn write_dataset(root: &Path) {
    samples::write_yolo_dataset(root, "test").unwrap();
}

#[test]
fn default_model_finds_drawn_shapes() {
    let dir = tempfile::tempdir().unwrap();
    write_dataset(dir.path());
    let det = Detector::load(Path::new(MODEL), &candle_core::Device::Cpu, candle_core::DType::F32, None).unwrap();
    assert_eq!(det.info().names, ["circle", "square", "triangle", "star", "ring"]);
    let ds = Dataset::open(dir.path(), "test").unwrap();
    assert_eq!(ds.samples.len(), 6);
    let r = eval::evaluate(&det, &ds, &EvalOptions::default(), &mut |_, _| {}).unwrap();
    assert_eq!((r.images, r.instances, r.skipped.len()), (6, 18, 0));
    assert_eq!(r.classes.len(), 5);
    // large, clean shapes: a working model and a working eval find nearly all of them
    assert!(r.map50 >= 0.9, "mAP50 {} {:#?}", r.map50, r.classes);
    assert!(r.map50_95 >= 0.6 && r.map50_95 <= r.map50, "mAP50-95 {}", r.map50_95);
    for c in &r.classes {
        assert!(c.map50 >= 0.7, "{c:?}");
    }
}

fn yolo_edge(args: &[&str]) -> std::process::Output {
    runner::yolo_edge().args(args).output().unwrap()
}

#[test]
fn eval_command_reports_json_and_skips_bad_inputs() {
    let dir = tempfile::tempdir().unwrap();
    write_dataset(dir.path());
    let root = dir.path();
    // one corrupt picture and one picture with a malformed label file: both skipped, exit code 3
    std::fs::write(root.join("images/test/100.jpg"), b"not a jpeg").unwrap();
    std::fs::copy(root.join("images/test/000.png"), root.join("images/test/101.png")).unwrap();
    std::fs::write(root.join("labels/test/101.txt"), "0 0.5 0.5\n").unwrap();
    let json: PathBuf = root.join("report.json");
    let out = yolo_edge(&["eval", "--model", MODEL, "--data", root.to_str().unwrap(), "--device", "cpu", "--json", json.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("mAP50-95") && table.lines().any(|l| l.trim_start().starts_with("all")), "{table}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["images"], 6);
    assert_eq!(v["skipped"].as_array().unwrap().len(), 2);
    assert!(v["map50"].as_f64().unwrap() >= 0.9, "{v}");
    assert_eq!(v["classes"].as_array().unwrap().len(), 5);

    // a folder that is not a dataset is an error, not a panic
    let out = yolo_edge(&["eval", "--model", MODEL, "--data", root.join("labels").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no dataset"));
}
