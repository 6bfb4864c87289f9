//! `yolo-edge letterbox`: what the network sees, a picture letterboxed to the model input, as
//! PNG or u8 `.npy` (the reference goldens are made from these pixels). `--crop` cuts a region of
//! the decoded picture first; `--decoded` writes the decoded (and cropped) picture itself, so the
//! reference can be given exactly the pixels this decoder made.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use yolo_edge::vision::preprocess::{self, Fit};

#[derive(Args)]
pub struct LetterboxArgs {
    image: PathBuf,
    #[arg(long, default_value_t = 640, value_parser = super::common::parse_imgsz)]
    imgsz: usize,
    /// square (imgsz x imgsz) or rect (the long side to imgsz, the other padded to a multiple of 32)
    #[arg(long, default_value = "square")]
    fit: Fit,
    /// Region of the decoded picture to use: X,Y,W,H in pixels.
    #[arg(long, value_parser = parse_crop)]
    crop: Option<[u32; 4]>,
    /// Write the decoded (and cropped) picture, not its letterbox.
    #[arg(long)]
    decoded: bool,
    #[arg(long)]
    out: PathBuf,
}

fn parse_crop(s: &str) -> Result<[u32; 4], String> {
    let v: Vec<u32> = s.split(',').map(|p| p.trim().parse::<u32>().map_err(|e| format!("{p}: {e}"))).collect::<Result<_, _>>()?;
    <[u32; 4]>::try_from(v).map_err(|_| "expected X,Y,W,H".to_string())
}

pub fn run(a: LetterboxArgs) -> anyhow::Result<ExitCode> {
    // at most MAX_IMGSZ (the parser's bound)
    let (image, imgsz, out) = (a.image.as_path(), a.imgsz as u32, a.out.as_path());
    let mut img = preprocess::load_image(image, &preprocess::DecodeLimits::default()).with_context(|| format!("{}", image.display()))?;
    if let Some([x, y, w, h]) = a.crop {
        anyhow::ensure!(
            w > 0 && h > 0 && x.checked_add(w).is_some_and(|r| r <= img.width()) && y.checked_add(h).is_some_and(|b| b <= img.height()),
            "--crop {x},{y},{w},{h} is not inside the {}x{} picture",
            img.width(),
            img.height()
        );
        img = image::imageops::crop_imm(&img, x, y, w, h).to_image();
    }
    let (pixels, w, h, what) = if a.decoded {
        let (w, h) = img.dimensions();
        (img.into_raw(), w, h, "decoded".to_string())
    } else {
        let lb = preprocess::letterbox_fit(&img, imgsz, a.fit);
        let g = lb.geometry;
        (lb.pixels, g.in_w, g.in_h, format!("{g:?}"))
    };
    if out.extension().and_then(|e| e.to_str()) == Some("npy") {
        let t = candle_core::Tensor::from_vec(pixels, (h as usize, w as usize, 3), &candle_core::Device::Cpu)?;
        t.write_npy(out)?;
    } else {
        image::RgbImage::from_raw(w, h, pixels).context("letterbox buffer")?.save(out)?;
    }
    eprintln!("{} -> {} ({what})", image.display(), out.display());
    Ok(ExitCode::SUCCESS)
}
