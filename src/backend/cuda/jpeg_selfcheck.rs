//! A check of the GPU input path on the machine that has the GPU (`yolo-edge jpeg-selfcheck`):
//! the device letterbox against the host's `letterbox_fit`, byte for byte, on synthetic pictures
//! uploaded raw; then nvJPEG + the device letterbox against the host decoder + `letterbox_fit` on
//! the same pictures encoded as JPEG and on the caller's JPEG files (IDCT and chroma upsampling
//! differ between decoders, so small differences are expected there), nvJPEG's planes converted
//! by the letterbox beside nvJPEG's own RGB, with the fallbacks written back through `write_slot`;
//! and at the other end of the pass, the device score filter against a host filter.

use std::fmt::Write;

use candle_core::{CudaDevice, Device, Tensor};
use image::{GrayImage, RgbImage};

use super::jpeg::GpuJpeg;
use super::letterbox::{Letterboxer, Source};
use crate::vision::preprocess::{decode_image, letterbox_fit, DecodeLimits, Fit, LetterboxGeometry};

/// Picture sizes checked: landscape, odd ratios, square, a tall strip.
const SIZES: [(u32, u32); 5] = [(1920, 1080), (773, 512), (1000, 597), (333, 333), (50, 900)];
const SIZE: u32 = 640;

/// What the check found: a table for people, and the count of bytes where the device letterbox
/// differs from the host's plus the candidates where the device score filter differs from the
/// host's (0 expected; the JPEG differences are reported, not counted).
pub struct SelfCheck {
    pub report: String,
    pub kernel_mismatches: u64,
}

/// Pseudo-random pixels: every byte value, no smooth areas to hide a wrong tap.
fn noise(w: u32, h: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| {
        let mut v = (x as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (y as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        v ^= v >> 29;
        v = v.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        image::Rgb([v as u8, (v >> 8) as u8, (v >> 16) as u8])
    })
}

/// A photo-like scene for JPEG: gradients, a disc and a few hard edges.
fn scene(w: u32, h: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| {
        let (fx, fy) = (x as f32 / w as f32, y as f32 / h as f32);
        let (dx, dy) = (fx - 0.5, fy - 0.5);
        let disc = dx * dx + dy * dy < 0.06;
        let stripe = (x / 37 + y / 53) % 5 == 0;
        let r = if disc { 220.0 } else { 40.0 + 180.0 * fx };
        let g = if stripe { 30.0 } else { 60.0 + 150.0 * fy };
        let b = 90.0 + 120.0 * (fx * fy);
        image::Rgb([r as u8, g as u8, b as u8])
    })
}

/// Largest absolute difference and count of differing bytes.
fn compare(got: &[u8], want: &[u8]) -> (u8, u64, f64) {
    if got.len() != want.len() {
        return (255, want.len().max(got.len()) as u64, 255.0);
    }
    let (mut max, mut bad, mut sum) = (0u8, 0u64, 0u64);
    for (a, b) in got.iter().zip(want) {
        let d = a.abs_diff(*b);
        max = max.max(d);
        bad += u64::from(d != 0);
        sum += u64::from(d);
    }
    (max, bad, sum as f64 / want.len().max(1) as f64)
}

fn to_host(x: &Tensor) -> candle_core::Result<Vec<u8>> {
    x.to_device(&Device::Cpu)?.flatten_all()?.to_vec1::<u8>()
}

fn fit_name(f: Fit) -> &'static str {
    match f {
        Fit::Rect => "rect",
        Fit::Square => "square",
    }
}

/// Runs both checks on `dev` (the JPEG one only where nvJPEG loads), the JPEG one also on `files`
/// (name, bytes); with `save`, the rect inputs nvJPEG's two ways made of each of `files` go there
/// as u8 `.npy` (`NAME.planes.npy`, `NAME.rgb.npy`, `(H, W, 3)`).
pub fn jpeg_selfcheck(dev: &CudaDevice, files: &[(String, Vec<u8>)], save: Option<&std::path::Path>) -> candle_core::Result<SelfCheck> {
    let mut r = String::new();
    let mut mismatches = 0u64;
    let pics: Vec<RgbImage> = SIZES.iter().map(|&(w, h)| noise(w, h)).collect();
    // packed back to back, every other picture with 5 spare bytes per row (a pitch wider than its row)
    let mut host = Vec::new();
    let mut sources = Vec::new();
    for (k, img) in pics.iter().enumerate() {
        let row = img.width() as usize * 3;
        let pitch = row + if k % 2 == 1 { 5 } else { 0 };
        sources.push(Source { offset: host.len(), pitch, w: img.width(), h: img.height(), chroma: None });
        for y in img.as_raw().chunks(row) {
            host.extend_from_slice(y);
            host.resize(host.len() + pitch - row, 0xEE);
        }
    }
    let base = dev.clone_htod(&host)?;
    let mut lbx = Letterboxer::default();
    let mut run =
        |slots: &[Option<(Source, LetterboxGeometry)>], first: usize, count: usize, (w, h): (u32, u32)| -> candle_core::Result<Vec<u8>> {
            let mut out = dev.alloc_zeros::<u8>(count * w as usize * h as usize * 3)?;
            lbx.run(dev, &base, slots, first, (w, h), &mut out)?;
            dev.clone_dtoh(&out)
        };
    writeln!(r, "device letterbox against letterbox_fit (raw pictures; expected 0 mismatching bytes)").ok();
    writeln!(r, "{:<11} {:<7} {:<9} {:>7} {:>12}", "picture", "fit", "input", "max|d|", "mismatching").ok();
    for fit in [Fit::Rect, Fit::Square] {
        for (img, src) in pics.iter().zip(&sources) {
            let want = letterbox_fit(img, SIZE, fit);
            let g = want.geometry;
            let got = run(&[Some((*src, g))], 0, 1, (g.in_w, g.in_h))?;
            let (max, bad, _) = compare(&got, &want.pixels);
            mismatches += bad;
            writeln!(
                r,
                "{:<11} {:<7} {:<9} {max:>7} {bad:>12}",
                format!("{}x{}", src.w, src.h),
                fit_name(fit),
                format!("{}x{}", g.in_w, g.in_h)
            )
            .ok();
        }
    }
    // one launch for slots 1..7 of 7 (the five pictures and an empty slot), slot 0 by another
    let mut slots: Vec<Option<(Source, LetterboxGeometry)>> = pics
        .iter()
        .zip(&sources)
        .map(|(img, s)| Some((*s, LetterboxGeometry::fit(img.width(), img.height(), SIZE, Fit::Square))))
        .collect();
    slots.push(None);
    let n = slots.len() + 1;
    let mut out = dev.alloc_zeros::<u8>(n * (SIZE * SIZE * 3) as usize)?;
    lbx.run(dev, &base, &[None], 0, (SIZE, SIZE), &mut out)?;
    lbx.run(dev, &base, &slots, 1, (SIZE, SIZE), &mut out)?;
    let got = dev.clone_dtoh(&out)?;
    let slot = (SIZE * SIZE * 3) as usize;
    let pad = vec![crate::vision::preprocess::PAD_VALUE; slot];
    let mut want: Vec<&[u8]> = vec![&pad];
    let lbs: Vec<_> = pics.iter().map(|img| letterbox_fit(img, SIZE, Fit::Square)).collect();
    want.extend(lbs.iter().map(|l| l.pixels.as_slice()));
    want.push(&pad);
    let (mut max, mut bad) = (0, 0);
    for (k, w) in want.iter().enumerate() {
        let (m, b, _) = compare(&got[k * slot..(k + 1) * slot], w);
        max = max.max(m);
        bad += b;
    }
    mismatches += bad;
    writeln!(r, "{:<11} {:<7} {:<9} {max:>7} {bad:>12}", "batch of 7", "square", format!("{SIZE}x{SIZE}")).ok();

    writeln!(r).ok();
    let mut differing = super::candidates::selfcheck(dev, &mut r)?;
    writeln!(r).ok();
    differing += super::nms::selfcheck(dev, &mut r)?;
    mismatches += differing;
    writeln!(r).ok();
    match GpuJpeg::new(dev, 1).and_then(|planar| Ok((planar, GpuJpeg::new(dev, 1)?.with_planar(false)))) {
        Err(e) => {
            writeln!(r, "nvJPEG: {e}").ok();
        }
        Ok((planar, rgb)) => jpeg_part(&planar, &rgb, files, save, &mut r)?,
    }
    writeln!(r).ok();
    writeln!(
        r,
        "device letterbox, score filter and NMS: {}",
        if mismatches == 0 {
            "OK (bit-exact)".to_string()
        } else {
            format!("FAILED: {} mismatching bytes, {differing} differing candidates or kept boxes", mismatches - differing)
        }
    )
    .ok();
    Ok(SelfCheck { report: r, kernel_mismatches: mismatches })
}

/// nvJPEG + device letterbox against the host decoder + `letterbox_fit`: `planar` (nvJPEG's
/// planes where it can) and `rgb` (nvJPEG's RGB) on the same pictures.
fn jpeg_part(
    planar: &GpuJpeg,
    rgb: &GpuJpeg,
    extra: &[(String, Vec<u8>)],
    save: Option<&std::path::Path>,
    r: &mut String,
) -> candle_core::Result<()> {
    let limits = DecodeLimits::default();
    let enc_err = |e: image::ImageError| candle_core::Error::Msg(format!("encoding a test picture: {e}"));
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for &(w, h) in &SIZES {
        let mut buf = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut buf, 90).encode_image(&scene(w, h)).map_err(enc_err)?;
        files.push((format!("{w}x{h}"), buf));
    }
    let gray_at = files.len();
    let gray = GrayImage::from_fn(333, 333, |x, y| image::Luma([((x * 3 + y * 5) % 256) as u8]));
    let mut buf = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut buf, 90).encode_image(&gray).map_err(enc_err)?;
    files.push(("333x333 gray".into(), buf));
    let mut png = Vec::new();
    scene(333, 333).write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png).map_err(enc_err)?;
    files.push(("333x333 png".into(), png));
    let cut = files[3].1[..files[3].1.len() * 2 / 3].to_vec();
    files.push(("333x333 cut".into(), cut));
    let extra_at = files.len();
    files.extend(extra.iter().cloned());

    writeln!(
        r,
        "nvJPEG ({} backend) + device letterbox against decode_image + letterbox_fit (made pictures: JPEG quality 90, 4:2:0); \
         planes: nvJPEG's planes converted by the letterbox (RGB for a batch with a picture it cannot take), RGB: nvJPEG's RGB",
        planar.backend()
    )
    .ok();
    writeln!(
        r,
        "{:<22} {:<7} {:<9} {:>13} {:>13} {:>13}  path",
        "picture", "fit", "input", "planes max/mean", "RGB max/mean", "planes vs RGB"
    )
    .ok();
    let all: Vec<usize> = (0..files.len()).collect();
    for fit in [Fit::Square, Fit::Rect] {
        // square: every picture in one call, and all but the gray one (a batch of planes); rect:
        // one call per picture (the shapes differ)
        let groups: Vec<Vec<usize>> = match fit {
            Fit::Square => vec![all.iter().copied().filter(|&k| k != gray_at).collect(), all.clone()],
            Fit::Rect => all.iter().map(|&k| vec![k]).collect(),
        };
        for group in groups {
            let bytes: Vec<&[u8]> = group.iter().map(|&k| files[k].1.as_slice()).collect();
            let t = std::time::Instant::now();
            let (x, results) = planar.decode_letterbox(&bytes, SIZE, fit, &limits)?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let (xr, results_rgb) = rgb.decode_letterbox(&bytes, SIZE, fit, &limits)?;
            let (_, h, w, _) = x.dims4()?;
            let slot = h * w * 3;
            let mut notes = Vec::new();
            for (i, ((&k, res), res_rgb)) in group.iter().zip(&results).zip(&results_rgb).enumerate() {
                let cpu = decode_image(&files[k].1, &limits).map(|img| letterbox_fit(&img, SIZE, fit));
                let path = match (res, &cpu) {
                    (Ok(_), _) => "nvJPEG".to_string(),
                    (Err(why), Ok(lb)) => {
                        planar.write_slot(&x, i, lb)?;
                        format!("fallback ({why}), written by write_slot")
                    }
                    (Err(why), Err(e)) => format!("fallback ({why}); the host refuses it too ({e})"),
                };
                if let (Err(_), Ok(lb)) = (res_rgb, &cpu) {
                    rgb.write_slot(&xr, i, lb)?;
                }
                notes.push((k, path, cpu));
            }
            if let (Some(dir), Fit::Rect, [k]) = (save, fit, group.as_slice()) {
                if *k >= extra_at && results[0].is_ok() {
                    for (t, way) in [(&x, "planes"), (&xr, "rgb")] {
                        t.squeeze(0)?.to_device(&Device::Cpu)?.write_npy(dir.join(format!("{}.{way}.npy", files[*k].0)))?;
                    }
                }
            }
            let (got, got_rgb) = (to_host(&x)?, to_host(&xr)?);
            for (i, (k, path, cpu)) in notes.into_iter().enumerate() {
                let range = i * slot..(i + 1) * slot;
                let vs = |a: &[u8], b: &[u8]| {
                    let (m, _, mean) = compare(&a[range.clone()], b);
                    format!("{m}/{mean:.3}")
                };
                let (p, q) = match &cpu {
                    Ok(lb) => (vs(&got, &lb.pixels), vs(&got_rgb, &lb.pixels)),
                    Err(_) => ("-".into(), "-".into()),
                };
                let both = vs(&got, &got_rgb[range.clone()]);
                writeln!(r, "{:<22} {:<7} {:<9} {p:>13} {q:>13} {both:>13}  {path}", files[k].0, fit_name(fit), format!("{w}x{h}")).ok();
            }
            if group.len() > 1 {
                writeln!(r, "  ({} pictures in one call: {ms:.1} ms, decode + letterbox, first call includes set-up)", group.len()).ok();
            }
        }
    }
    Ok(())
}
