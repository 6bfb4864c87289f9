//! Host time of the detection step (NMS and boxes mapped back) on one picture's candidates from
//! a seeded random-weight model, whose every anchor passes the confidence filter: the crowded
//! case that an untrained model or a low threshold (`eval`'s 0.001) gives.
//!
//!     cargo run --release --example nms_cost -- random:yolov9c PICTURE [CONF] [RAW.npy]
//!
//! Prints the candidates, the boxes kept and the median of 200 runs (CPU model, f32, rect).
//! RAW.npy keeps the raw output, so that `scripts/nms_reference.py` times the reference's
//! detection step on the same tensor.

use std::time::Instant;

use candle_core::{DType, Device};
use yolo_edge::detector::Detector;
use yolo_edge::model::random;
use yolo_edge::model::{BuildOptions, YoloV9};
use yolo_edge::vision::postprocess::{self, Thresholds};
use yolo_edge::vision::preprocess::{decode_image, letterbox_fit, DecodeLimits, Fit};

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let [_, spec, picture, rest @ ..] = args.as_slice() else {
        return Err("usage: nms_cost random:yolov9X PICTURE [CONF] [RAW.npy]".into());
    };
    let conf: f32 = rest.first().map(|c| c.parse()).transpose()?.unwrap_or(0.25);
    let variant = random::parse_spec(spec).ok_or("expected random:yolov9X")??;
    let model = YoloV9::from_checkpoint(&random::random_checkpoint(variant, 0)?, &BuildOptions::new(Device::Cpu, DType::F32))?;
    let det = Detector::from_model(model, 640);
    let img = decode_image(&std::fs::read(picture)?, &DecodeLimits::default())?;
    let lb = letterbox_fit(&img, 640, Fit::Rect);
    let raw = det.raw(&[&lb])?;
    if let Some(path) = rest.get(1) {
        raw.write_npy(path)?;
    }
    let cands = det.candidates(&raw, conf)?.swap_remove(0);
    let th = Thresholds { conf, ..Thresholds::default() };
    let mut times = Vec::new();
    let mut kept = 0;
    for _ in 0..200 {
        let c = cands.clone();
        let t = Instant::now();
        kept = postprocess::finish(c, &th, &lb.geometry, &det.info().names).len();
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    println!("{} candidates at conf {conf}, {kept} kept: {:.3} ms (median of 200)", cands.len(), times[100]);
    Ok(())
}
