//! `yolo-edge jpeg-selfcheck` (hidden, CUDA builds): checks the GPU input path on this machine's
//! GPU: the device letterbox byte for byte against the host's, nvJPEG decoding against the host
//! decoder (nvJPEG's RGB, and its planes converted by the letterbox), also on JPEG files given on
//! the command line, and the device score filter against the host's. Prints a table; exits 1 when
//! the device letterbox or score filter differs from the host's.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use yolo_edge::backend::device;

#[derive(Args)]
pub struct JpegSelfcheckArgs {
    /// CUDA device.
    #[arg(long, default_value = "cuda:0")]
    device: String,
    /// JPEG files decoded too, beside the pictures the check makes.
    #[arg(value_name = "JPEG")]
    files: Vec<PathBuf>,
    /// Write the rect inputs nvJPEG's two ways made of each JPEG file here (`NAME.planes.npy`,
    /// `NAME.rgb.npy`: u8 `(H, W, 3)`), to compare with the reference's decoder.
    #[arg(long, value_name = "DIR")]
    save: Option<PathBuf>,
}

pub fn run(a: JpegSelfcheckArgs) -> anyhow::Result<ExitCode> {
    let candle_core::Device::Cuda(dev) = device::parse_device(&a.device)? else {
        anyhow::bail!("--device {}: a CUDA device is needed", a.device);
    };
    let limits = yolo_edge::vision::preprocess::DecodeLimits::default();
    let mut files = Vec::with_capacity(a.files.len());
    for f in &a.files {
        let bytes = yolo_edge::vision::preprocess::read_image_file(f, &limits).with_context(|| format!("reading {}", f.display()))?;
        let name = f.file_name().map_or_else(|| f.display().to_string(), |n| n.to_string_lossy().into_owned());
        files.push((name, bytes));
    }
    if let Some(dir) = &a.save {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let c = yolo_edge::backend::jpeg_selfcheck(&dev, &files, a.save.as_deref()).context("running the GPU JPEG self-check")?;
    print!("{}", c.report);
    Ok(if c.kernel_mismatches == 0 { ExitCode::SUCCESS } else { ExitCode::from(super::exit::OTHER) })
}
