//! `yolo-edge convert`: any supported checkpoint to fused safetensors with metadata.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use yolo_edge::backend::device;
use yolo_edge::{model, weights};

#[derive(Args)]
pub struct ConvertArgs {
    /// Input checkpoint (.pt from ultralytics or WongKinYiu/yolov9, or .safetensors).
    input: PathBuf,
    /// Output .safetensors.
    output: PathBuf,
    /// Storage dtype of the weights (f32 or f16).
    #[arg(long, default_value = "f16")]
    dtype: String,
    /// Image size recorded in the metadata (default: the checkpoint's training size or 640).
    #[arg(long)]
    imgsz: Option<usize>,
}

pub fn run(a: ConvertArgs) -> anyhow::Result<ExitCode> {
    let dtype = device::parse_dtype(&a.dtype, &candle_core::Device::Cpu)?;
    let ck = weights::Checkpoint::load(&a.input)?;
    let (info, tensors) = model::fused_tensors(&ck)?;
    let tensors: HashMap<String, candle_core::Tensor> =
        tensors.into_iter().map(|(k, t)| Ok((k, t.to_dtype(dtype)?))).collect::<candle_core::Result<_>>()?;
    let imgsz = a.imgsz.unwrap_or(info.imgsz);
    let meta: HashMap<String, String> = [
        ("format", "yolo-edge".to_string()),
        ("fused", "true".into()),
        ("variant", info.variant.name().into()),
        ("head", serde_json::to_value(info.head)?.as_str().unwrap_or_default().into()),
        ("nc", info.nc.to_string()),
        ("names", serde_json::to_string(&info.names)?),
        ("strides", serde_json::to_string(&info.strides)?),
        ("imgsz", imgsz.to_string()),
        ("source_sha256", info.sha256.clone()),
        ("source_format", serde_json::to_value(info.source)?.as_str().unwrap_or_default().into()),
        ("yolo_edge_version", env!("CARGO_PKG_VERSION").into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    safetensors::serialize_to_file(&tensors, Some(meta), &a.output).with_context(|| format!("writing {}", a.output.display()))?;
    eprintln!(
        "{} ({}, {:?} head, {} classes) -> {} [{} tensors, {}]",
        a.input.display(),
        info.variant.name(),
        info.head,
        info.nc,
        a.output.display(),
        tensors.len(),
        device::dtype_name(dtype)
    );
    Ok(ExitCode::SUCCESS)
}
