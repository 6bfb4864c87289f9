//! Device and dtype selection: `auto|cpu|cuda:N` and `auto|f32|f16` (FP16 on CUDA, FP32 on CPU).

use candle_core::{DType, Device};

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("unknown device `{0}` (expected auto, cpu or cuda:N)")]
    Unknown(String),
    #[error("unknown dtype `{0}` (expected auto, f32 or f16)")]
    UnknownDtype(String),
    #[error("device `{0}` requested but this binary was built without CUDA (rebuild with --features cuda)")]
    NoCudaSupport(String),
    #[error("cannot open CUDA device {index}: {reason}")]
    Cuda { index: usize, reason: String },
}

/// Parses a device name; `auto` picks the first CUDA device when there is one, else the CPU.
pub fn parse_device(s: &str) -> Result<Device, DeviceError> {
    let s = s.trim().to_ascii_lowercase();
    match s.as_str() {
        "cpu" => Ok(Device::Cpu),
        "auto" => Ok(cuda(0).unwrap_or(Device::Cpu)),
        "cuda" | "gpu" => cuda(0),
        _ => match s.strip_prefix("cuda:") {
            Some(i) => cuda(i.parse().map_err(|_| DeviceError::Unknown(s.clone()))?),
            None => Err(DeviceError::Unknown(s)),
        },
    }
}

#[cfg(feature = "cuda")]
fn cuda(index: usize) -> Result<Device, DeviceError> {
    // every entry point (detect, eval, run, bench, plan) gets the persistent JIT cache; this must
    // happen before the driver initialises
    crate::env::configure_compute_cache();
    let d = Device::new_cuda(index).map_err(|e| DeviceError::Cuda { index, reason: e.to_string() })?;
    // the pool keeps its memory between batches instead of re-mapping it at every synchronise
    crate::backend::devmem::PeakMeter::new(&d).hold_reserved().map_err(|e| DeviceError::Cuda { index, reason: e.to_string() })?;
    Ok(d)
}

#[cfg(not(feature = "cuda"))]
fn cuda(index: usize) -> Result<Device, DeviceError> {
    Err(DeviceError::NoCudaSupport(format!("cuda:{index}")))
}

/// Parses a dtype; `auto` is FP16 on CUDA and FP32 on the CPU.
pub fn parse_dtype(s: &str, device: &Device) -> Result<DType, DeviceError> {
    match s.trim().to_ascii_lowercase().as_str() {
        "auto" => Ok(if device.is_cuda() { DType::F16 } else { DType::F32 }),
        "f32" | "fp32" | "float32" => Ok(DType::F32),
        "f16" | "fp16" | "half" | "float16" => Ok(DType::F16),
        other => Err(DeviceError::UnknownDtype(other.to_string())),
    }
}

/// A short human name: `cpu`, `cuda:0`.
pub fn device_name(d: &Device) -> String {
    match d.location() {
        candle_core::DeviceLocation::Cpu => "cpu".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F32 => "f32",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names() {
        assert!(matches!(parse_device("cpu"), Ok(Device::Cpu)));
        assert!(matches!(parse_device("tpu"), Err(DeviceError::Unknown(_))));
        assert!(parse_device("cuda:x").is_err());
        assert_eq!(parse_dtype("auto", &Device::Cpu).unwrap(), DType::F32);
        assert_eq!(parse_dtype("FP16", &Device::Cpu).unwrap(), DType::F16);
        assert!(parse_dtype("int8", &Device::Cpu).is_err());
    }
}
