//! `yolo-edge letterbox`: what the network sees, a picture letterboxed to the model input, as
//! PNG or u8 `.npy` (the reference goldens are made from these pixels).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

#[derive(Args)]
pub struct LetterboxArgs {
    image: PathBuf,
    #[arg(long, default_value_t = 640)]
    imgsz: u32,
    #[arg(long)]
    out: PathBuf,
}

pub fn run(a: LetterboxArgs) -> anyhow::Result<ExitCode> {
    let (image, imgsz, out) = (a.image.as_path(), a.imgsz, a.out.as_path());
    use yolo_edge::vision::preprocess;
    anyhow::ensure!(imgsz > 0 && imgsz % 32 == 0, "--imgsz must be a positive multiple of 32");
    let img = preprocess::load_image(image, &preprocess::DecodeLimits::default()).with_context(|| format!("{}", image.display()))?;
    let lb = preprocess::letterbox(&img, imgsz);
    if out.extension().and_then(|e| e.to_str()) == Some("npy") {
        let t = candle_core::Tensor::from_vec(lb.pixels, (imgsz as usize, imgsz as usize, 3), &candle_core::Device::Cpu)?;
        t.write_npy(out)?;
    } else {
        image::RgbImage::from_raw(imgsz, imgsz, lb.pixels).context("letterbox buffer")?.save(out)?;
    }
    eprintln!("{} -> {} ({:?})", image.display(), out.display(), lb.geometry);
    Ok(ExitCode::SUCCESS)
}
