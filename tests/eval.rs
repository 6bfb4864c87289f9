//! End-to-end evaluation of the committed default model (`models/yolov9t-shapes.safetensors`) on
//! a small shapes set drawn here with the `image` crate (a different renderer from the training
//! generator, so this is also a check that the model learned shapes, not the generator's
//! pixels), through the library and through the `yolo-edge eval` command.

use std::path::{Path, PathBuf};
use std::process::Command;

use image::{Rgb, RgbImage};
use yolo_edge::detector::Detector;
use yolo_edge::eval::{self, dataset::Dataset, EvalOptions};

const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/models/yolov9t-shapes.safetensors");

#[derive(Clone, Copy)]
enum Shape {
    Circle,
    Square,
    Triangle,
    Star,
    Ring,
}

impl Shape {
    fn class_id(self) -> usize {
        self as usize
    }
}

/// Coverage (0..1) of a pixel by a shape, 4x4 supersampled.
fn coverage(inside: &dyn Fn(f64, f64) -> bool, x: u32, y: u32) -> f64 {
    let mut n = 0;
    for i in 0..4 {
        for j in 0..4 {
            if inside(x as f64 + (i as f64 + 0.5) / 4.0, y as f64 + (j as f64 + 0.5) / 4.0) {
                n += 1;
            }
        }
    }
    n as f64 / 16.0
}

fn point_in_polygon(px: f64, py: f64, pts: &[(f64, f64)]) -> bool {
    let mut inside = false;
    let mut j = pts.len() - 1;
    for i in 0..pts.len() {
        let ((xi, yi), (xj, yj)) = (pts[i], pts[j]);
        if (yi > py) != (yj > py) && px < (xj - xi) * (py - yi) / (yj - yi) + xi {
            inside = !inside;
        }
        j = i;
    }
    inside
}

/// Paints one shape of radius `r` at (cx, cy), rotated by `angle`; returns its box (xyxy).
fn paint(img: &mut RgbImage, shape: Shape, cx: f64, cy: f64, r: f64, angle: f64, colour: [u8; 3]) -> [f64; 4] {
    let poly = |n: usize, radius: &dyn Fn(usize) -> f64| -> Vec<(f64, f64)> {
        (0..n)
            .map(|k| {
                let a = angle + k as f64 * std::f64::consts::TAU / n as f64;
                (cx + radius(k) * a.cos(), cy + radius(k) * a.sin())
            })
            .collect()
    };
    let pts = match shape {
        Shape::Square => poly(4, &|_| r),
        Shape::Triangle => poly(3, &|_| r),
        Shape::Star => poly(10, &|k| if k % 2 == 0 { r } else { r * 0.45 }),
        Shape::Circle | Shape::Ring => vec![],
    };
    let inside: Box<dyn Fn(f64, f64) -> bool> = match shape {
        Shape::Circle => Box::new(move |x, y| (x - cx).powi(2) + (y - cy).powi(2) <= r * r),
        Shape::Ring => Box::new(move |x, y| {
            let d2 = (x - cx).powi(2) + (y - cy).powi(2);
            d2 <= r * r && d2 >= (0.6 * r).powi(2)
        }),
        _ => {
            let pts = pts.clone();
            Box::new(move |x, y| point_in_polygon(x, y, &pts))
        }
    };
    let bbox = if pts.is_empty() {
        [cx - r, cy - r, cx + r, cy + r]
    } else {
        let xs = pts.iter().map(|p| p.0);
        let ys = pts.iter().map(|p| p.1);
        [xs.clone().fold(f64::MAX, f64::min), ys.clone().fold(f64::MAX, f64::min), xs.fold(f64::MIN, f64::max), ys.fold(f64::MIN, f64::max)]
    };
    let (x0, y0) = ((bbox[0].floor().max(0.0)) as u32, (bbox[1].floor().max(0.0)) as u32);
    let (x1, y1) = ((bbox[2].ceil() as u32).min(img.width() - 1), (bbox[3].ceil() as u32).min(img.height() - 1));
    for y in y0..=y1 {
        for x in x0..=x1 {
            let a = coverage(&*inside, x, y);
            if a > 0.0 {
                let p = img.get_pixel_mut(x, y);
                for c in 0..3 {
                    p.0[c] = (p.0[c] as f64 * (1.0 - a) + colour[c] as f64 * a).round() as u8;
                }
            }
        }
    }
    bbox
}

/// Writes `images/test/*.png` and `labels/test/*.txt` under `root`: six scenes, every class
/// several times, on gradient backgrounds.
fn write_dataset(root: &Path) {
    use Shape::*;
    let scenes: [(u32, u32, &[(Shape, f64, f64, f64, f64)]); 6] = [
        (416, 320, &[(Circle, 90.0, 90.0, 50.0, 0.0), (Square, 250.0, 100.0, 60.0, 0.3), (Star, 330.0, 240.0, 55.0, 0.1)]),
        (320, 416, &[(Triangle, 100.0, 110.0, 60.0, 0.5), (Ring, 210.0, 290.0, 70.0, 0.0)]),
        (416, 416, &[(Star, 100.0, 100.0, 65.0, 0.7), (Circle, 300.0, 110.0, 40.0, 0.0), (Triangle, 150.0, 300.0, 55.0, 1.2), (Square, 310.0, 300.0, 50.0, 0.0)]),
        (400, 300, &[(Ring, 110.0, 150.0, 80.0, 0.0), (Star, 300.0, 150.0, 70.0, 0.3)]),
        (360, 360, &[(Square, 110.0, 250.0, 70.0, 0.8), (Circle, 250.0, 90.0, 60.0, 0.0), (Ring, 280.0, 270.0, 45.0, 0.0)]),
        (416, 352, &[(Triangle, 300.0, 120.0, 75.0, 2.0), (Square, 100.0, 90.0, 45.0, 0.2), (Star, 120.0, 260.0, 60.0, 0.0), (Circle, 300.0, 280.0, 45.0, 0.0)]),
    ];
    let colours = [[220, 40, 40], [30, 160, 60], [40, 70, 220], [240, 200, 30], [160, 40, 190], [20, 20, 20]];
    std::fs::create_dir_all(root.join("images/test")).unwrap();
    std::fs::create_dir_all(root.join("labels/test")).unwrap();
    for (i, (w, h, objs)) in scenes.iter().enumerate() {
        let (top, bottom) = ([200.0, 205.0, 215.0], [120.0, 135.0, 150.0]);
        let mut img = RgbImage::from_fn(*w, *h, |_, y| {
            let t = y as f64 / *h as f64;
            Rgb(std::array::from_fn(|c| (top[c] * (1.0 - t) + bottom[c] * t) as u8))
        });
        let mut labels = String::new();
        for (k, &(shape, cx, cy, r, angle)) in objs.iter().enumerate() {
            let b = paint(&mut img, shape, cx, cy, r, angle, colours[(i + k) % colours.len()]);
            let (fw, fh) = (*w as f64, *h as f64);
            labels += &format!(
                "{} {:.6} {:.6} {:.6} {:.6}\n",
                shape.class_id(),
                (b[0] + b[2]) / 2.0 / fw,
                (b[1] + b[3]) / 2.0 / fh,
                (b[2] - b[0]) / fw,
                (b[3] - b[1]) / fh
            );
        }
        img.save(root.join(format!("images/test/{i:03}.png"))).unwrap();
        std::fs::write(root.join(format!("labels/test/{i:03}.txt")), labels).unwrap();
    }
    std::fs::write(root.join("data.yaml"), "test: images/test\nnames: [circle, square, triangle, star, ring]\n").unwrap();
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
    Command::new(env!("CARGO_BIN_EXE_yolo-edge")).args(args).output().unwrap()
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
