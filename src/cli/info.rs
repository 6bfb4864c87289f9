//! `yolo-edge info`: what a checkpoint holds (variant, head, classes, strides, parameters,
//! GFLOPs), as text or JSON.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use yolo_edge::{model, weights};

#[derive(Args)]
pub struct InfoArgs {
    /// Checkpoint (.pt or .safetensors).
    model: PathBuf,
    /// Image size for the GFLOPs figure.
    #[arg(long, default_value_t = 640)]
    imgsz: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(a: InfoArgs) -> anyhow::Result<ExitCode> {
    let (path, imgsz, json) = (a.model.as_path(), a.imgsz, a.json);
    let ck = weights::Checkpoint::load(path)?;
    let m = model::YoloV9::from_checkpoint(&ck, &model::BuildOptions::new(candle_core::Device::Cpu, candle_core::DType::F32))?;
    let gflops = m.gflops(imgsz).context("computing GFLOPs")?;
    let i = m.info();
    if json {
        let mut v = serde_json::to_value(i)?;
        v["gflops"] = serde_json::json!(gflops);
        v["gflops_imgsz"] = serde_json::json!(imgsz);
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("model      {}", i.path);
        println!("variant    {}", i.variant.name());
        println!("head       {:?}", i.head);
        println!("format     {:?}", i.source);
        println!("classes    {} {:?}", i.nc, if i.names.len() > 10 { &i.names[..10] } else { &i.names[..] });
        println!("strides    {:?}", i.strides);
        println!("imgsz      {}", i.imgsz);
        println!("parameters {} ({:.2} M)", i.parameters, i.parameters as f64 / 1e6);
        println!("GFLOPs     {gflops:.1} at {imgsz}x{imgsz}");
        println!("sha256     {}", i.sha256);
    }
    Ok(ExitCode::SUCCESS)
}
