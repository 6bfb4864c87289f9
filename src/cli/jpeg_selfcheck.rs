//! `yolo-edge jpeg-selfcheck` (hidden, CUDA builds): checks the GPU input path on this machine's
//! GPU: the device letterbox byte for byte against the host's, nvJPEG decoding against the host
//! decoder, and the device score filter against the host's. Prints a table; exits 1 when the
//! device letterbox or score filter differs from the host's.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use yolo_edge::backend::device;

#[derive(Args)]
pub struct JpegSelfcheckArgs {
    /// CUDA device.
    #[arg(long, default_value = "cuda:0")]
    device: String,
}

pub fn run(a: JpegSelfcheckArgs) -> anyhow::Result<ExitCode> {
    let candle_core::Device::Cuda(dev) = device::parse_device(&a.device)? else {
        anyhow::bail!("--device {}: a CUDA device is needed", a.device);
    };
    let c = yolo_edge::backend::jpeg_selfcheck(&dev).context("running the GPU JPEG self-check")?;
    print!("{}", c.report);
    Ok(if c.kernel_mismatches == 0 { ExitCode::SUCCESS } else { ExitCode::from(super::exit::OTHER) })
}
