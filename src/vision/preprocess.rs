//! Image decoding (with EXIF orientation and decompression-bomb limits) and the letterbox
//! transform, bit-compatible with the reference (ultralytics `LetterBox` on top of OpenCV's
//! `cv2.resize(..., INTER_LINEAR)` and `cv2.copyMakeBorder(..., value=114)`).

use std::io::Cursor;
use std::path::Path;

use image::{ImageDecoder, ImageReader, RgbImage};

/// Value of the padding added around the resized picture (as the reference).
pub const PAD_VALUE: u8 = 114;

/// Limits applied before any pixel is decoded, so a malicious header cannot make us allocate.
#[derive(Debug, Clone, Copy)]
pub struct DecodeLimits {
    /// Largest accepted width or height, in pixels.
    pub max_side: u32,
    /// Largest accepted number of pixels (w*h).
    pub max_pixels: u64,
    /// Largest accepted encoded size in bytes.
    pub max_bytes: u64,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        // 16384 px per side and 100 MP cover every camera we know of; a 30000x30000 PNG bomb does not pass.
        Self { max_side: 16_384, max_pixels: 100_000_000, max_bytes: 256 << 20 }
    }
}

/// Why an input could not be turned into pixels.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("empty file")]
    Empty,
    #[error("cannot read: {0}")]
    Io(#[from] std::io::Error),
    #[error("file is {size} bytes, above the limit of {limit} bytes")]
    TooLarge { size: u64, limit: u64 },
    #[error("not a supported image (JPEG, PNG, BMP or WebP)")]
    UnknownFormat,
    #[error("image is {width}x{height}, above the limit ({max_side} px per side, {max_pixels} pixels)")]
    Dimensions { width: u32, height: u32, max_side: u32, max_pixels: u64 },
    #[error("corrupt or truncated {format} image: {reason}")]
    Corrupt { format: String, reason: String },
}

/// Decodes an encoded image into RGB8, honouring EXIF orientation; never panics on bad input.
pub fn decode_image(bytes: &[u8], limits: &DecodeLimits) -> Result<RgbImage, ImageError> {
    if bytes.is_empty() {
        return Err(ImageError::Empty);
    }
    if bytes.len() as u64 > limits.max_bytes {
        return Err(ImageError::TooLarge { size: bytes.len() as u64, limit: limits.max_bytes });
    }
    let reader = ImageReader::new(Cursor::new(bytes)).with_guessed_format()?;
    let format = reader.format().ok_or(ImageError::UnknownFormat)?;
    let fmt_name = format!("{format:?}").to_uppercase();
    let corrupt = |e: image::ImageError| ImageError::Corrupt { format: fmt_name.clone(), reason: e.to_string() };
    if format == image::ImageFormat::Jpeg && !jpeg_is_complete(bytes) {
        // decoders fill a cut-off scan with grey and succeed; a half-written upload is not a picture
        return Err(ImageError::Corrupt { format: fmt_name, reason: "truncated: no end-of-image marker after the last scan".into() });
    }
    let mut decoder = reader.into_decoder().map_err(corrupt)?;
    let (width, height) = decoder.dimensions();
    if width == 0
        || height == 0
        || width > limits.max_side
        || height > limits.max_side
        || (width as u64) * (height as u64) > limits.max_pixels
    {
        return Err(ImageError::Dimensions { width, height, max_side: limits.max_side, max_pixels: limits.max_pixels });
    }
    let mut img_limits = image::Limits::default();
    img_limits.max_image_width = Some(limits.max_side);
    img_limits.max_image_height = Some(limits.max_side);
    img_limits.max_alloc = Some(limits.max_pixels.saturating_mul(16));
    decoder.set_limits(img_limits).map_err(corrupt)?;
    let orientation = decoder.orientation().unwrap_or(image::metadata::Orientation::NoTransforms);
    // a decoder bug (e.g. an arithmetic overflow that panics where overflow checks are on) is
    // this input's error, not the caller's panic
    let mut img = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| image::DynamicImage::from_decoder(decoder)))
        .map_err(|_| ImageError::Corrupt { format: fmt_name.clone(), reason: "the decoder failed on this input".into() })?
        .map_err(corrupt)?;
    img.apply_orientation(orientation);
    Ok(img.into_rgb8())
}

/// True when an end-of-image marker follows the last start-of-scan marker. Entropy-coded data
/// stuffs every 0xFF with 0x00, so neither marker can appear inside a scan by chance.
fn jpeg_is_complete(b: &[u8]) -> bool {
    let last = |m: u8| b.windows(2).rposition(|w| w[0] == 0xFF && w[1] == m);
    matches!((last(0xDA), last(0xD9)), (Some(sos), Some(eoi)) if eoi > sos)
}

/// Reads and decodes an image file.
pub fn load_image(path: &Path, limits: &DecodeLimits) -> Result<RgbImage, ImageError> {
    let meta = std::fs::metadata(path)?;
    if meta.len() > limits.max_bytes {
        return Err(ImageError::TooLarge { size: meta.len(), limit: limits.max_bytes });
    }
    decode_image(&std::fs::read(path)?, limits)
}

/// Where the original picture sits inside the letterboxed square.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LetterboxGeometry {
    pub orig_w: u32,
    pub orig_h: u32,
    /// Side of the square network input.
    pub size: u32,
    /// Width and height of the resized picture inside the square.
    pub new_w: u32,
    pub new_h: u32,
    /// Left and top padding, in pixels.
    pub left: u32,
    pub top: u32,
}

impl LetterboxGeometry {
    /// The reference's geometry (`LetterBox(auto=False, scale_fill=False, scaleup=True, center=True)`),
    /// including Python's round-half-to-even.
    pub fn new(orig_w: u32, orig_h: u32, size: u32) -> Self {
        let r = f64::min(size as f64 / orig_h as f64, size as f64 / orig_w as f64);
        let new_w = ((orig_w as f64 * r).round_ties_even() as u32).clamp(1, size);
        let new_h = ((orig_h as f64 * r).round_ties_even() as u32).clamp(1, size);
        let left = ((size - new_w) as f64 / 2.0 - 0.1).round_ties_even() as u32;
        let top = ((size - new_h) as f64 / 2.0 - 0.1).round_ties_even() as u32;
        Self { orig_w, orig_h, size, new_w, new_h, left, top }
    }

    /// Maps a box from network-input pixels back to original-image pixels, clipped to the image
    /// (the reference's `scale_boxes` + `clip_boxes`).
    pub fn unletterbox(&self, b: [f32; 4]) -> [f32; 4] {
        let gx = self.new_w as f64 / self.orig_w as f64;
        let gy = self.new_h as f64 / self.orig_h as f64;
        let (w, h) = (self.orig_w as f64, self.orig_h as f64);
        let f = |v: f32, pad: u32, g: f64, max: f64| (((v as f64) - pad as f64) / g).clamp(0.0, max) as f32;
        [f(b[0], self.left, gx, w), f(b[1], self.top, gy, h), f(b[2], self.left, gx, w), f(b[3], self.top, gy, h)]
    }
}

/// A picture letterboxed to the network's square input, HWC RGB u8 (normalised on the device).
#[derive(Debug, Clone)]
pub struct Letterboxed {
    pub pixels: Vec<u8>,
    pub geometry: LetterboxGeometry,
}

/// Resizes with OpenCV's INTER_LINEAR fixed-point arithmetic and pads with 114, centred.
pub fn letterbox(img: &RgbImage, size: u32) -> Letterboxed {
    let geometry = LetterboxGeometry::new(img.width(), img.height(), size);
    let s = size as usize;
    let mut pixels = vec![PAD_VALUE; s * s * 3];
    let resized;
    let src: &[u8] = if (geometry.new_w, geometry.new_h) == (img.width(), img.height()) {
        img.as_raw()
    } else {
        resized =
            resize_linear_cv(img.as_raw(), img.width() as usize, img.height() as usize, geometry.new_w as usize, geometry.new_h as usize);
        &resized
    };
    let row = geometry.new_w as usize * 3;
    for y in 0..geometry.new_h as usize {
        let dst = ((y + geometry.top as usize) * s + geometry.left as usize) * 3;
        pixels[dst..dst + row].copy_from_slice(&src[y * row..(y + 1) * row]);
    }
    Letterboxed { pixels, geometry }
}

const COEF_BITS: u32 = 11;
const COEF_SCALE: f32 = (1 << COEF_BITS) as f32;

/// Source index and fixed-point weights of one destination coordinate, as OpenCV computes them.
fn linear_taps(dst_len: usize, src_len: usize, clamp_weight: bool) -> Vec<(usize, usize, i32, i32)> {
    let scale = src_len as f64 / dst_len as f64;
    (0..dst_len)
        .map(|d| {
            let mut f = ((d as f64 + 0.5) * scale - 0.5) as f32;
            let mut s = f.floor() as i64;
            f -= s as f32;
            let last = src_len as i64 - 1;
            if clamp_weight {
                // x direction: OpenCV moves the weight onto the edge pixel
                if s < 0 {
                    f = 0.0;
                    s = 0;
                }
                if s >= last {
                    f = 0.0;
                    s = last;
                }
            }
            // OpenCV's saturate_cast<short> rounds half to even
            let w0 = ((1.0 - f) * COEF_SCALE).round_ties_even() as i32;
            let w1 = (f * COEF_SCALE).round_ties_even() as i32;
            let s0 = s.clamp(0, last) as usize;
            let s1 = (s + 1).clamp(0, last) as usize;
            (s0, s1, w0, w1)
        })
        .collect()
}

/// `cv2.resize(src, (dw, dh), interpolation=cv2.INTER_LINEAR)` for 3-channel u8, bit-exact with the
/// SIMD path OpenCV takes on x86 (horizontal pass in 11-bit fixed point, vertical pass with
/// `((S>>4)*b)>>16` products and `(+2)>>2` rounding).
pub fn resize_linear_cv(src: &[u8], sw: usize, sh: usize, dw: usize, dh: usize) -> Vec<u8> {
    let xt = linear_taps(dw, sw, true);
    let yt = linear_taps(dh, sh, false);
    let hpass = |row: usize| -> Vec<i32> {
        let r = &src[row * sw * 3..(row + 1) * sw * 3];
        let mut out = vec![0i32; dw * 3];
        for (x, &(s0, s1, w0, w1)) in xt.iter().enumerate() {
            for c in 0..3 {
                out[x * 3 + c] = r[s0 * 3 + c] as i32 * w0 + r[s1 * 3 + c] as i32 * w1;
            }
        }
        out
    };
    let mut dst = vec![0u8; dw * dh * 3];
    let mut cache: Option<(usize, Vec<i32>)> = None;
    for (y, &(r0, r1, b0, b1)) in yt.iter().enumerate() {
        let h0 = match cache.take() {
            Some((r, v)) if r == r0 => v,
            _ => hpass(r0),
        };
        let h1 = if r1 == r0 { h0.clone() } else { hpass(r1) };
        let out = &mut dst[y * dw * 3..(y + 1) * dw * 3];
        for x in 0..dw * 3 {
            let a = ((h0[x] >> 4) * b0) >> 16;
            let b = ((h1[x] >> 4) * b1) >> 16;
            out[x] = ((a + b + 2) >> 2).clamp(0, 255) as u8;
        }
        cache = Some((r1, h1));
    }
    dst
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jpeg_that_overflows_the_decoders_arithmetic_is_an_error_or_a_picture_never_a_panic() {
        // found by the `mqtt_image` fuzz target: zune-jpeg 0.5.15 multiplies with overflow
        // (bitstream.rs:400) while decoding it, a panic where overflow checks are on
        let bytes = include_bytes!("../../fuzz/regressions/picture/zune-jpeg-0.5.15-mul-overflow.jpg");
        match decode_image(bytes, &DecodeLimits::default()) {
            Ok(img) => assert!(img.width() > 0 && img.height() > 0),
            Err(e) => assert!(matches!(e, ImageError::Corrupt { .. }), "{e}"),
        }
    }

    #[test]
    fn geometry_matches_reference_rounding() {
        // ultralytics LetterBox((640, 640), auto=False) on a 773x512 picture: 640x424, pad 108/108.
        let g = LetterboxGeometry::new(773, 512, 640);
        assert_eq!((g.new_w, g.new_h, g.left, g.top), (640, 424, 0, 108));
        // 1920x1080 -> 640x360, top 140
        let g = LetterboxGeometry::new(1920, 1080, 640);
        assert_eq!((g.new_w, g.new_h, g.left, g.top), (640, 360, 0, 140));
        // odd padding: 641 -> top = round(dh - 0.1)
        let g = LetterboxGeometry::new(100, 99, 64);
        assert_eq!((g.new_w, g.new_h, g.top), (64, 63, 0));
    }

    #[test]
    fn unletterbox_inverts_geometry() {
        let g = LetterboxGeometry::new(1920, 1080, 640);
        let b = g.unletterbox([0.0, 140.0, 640.0, 500.0]);
        for (v, e) in b.iter().zip([0.0, 0.0, 1920.0, 1080.0]) {
            assert!((v - e).abs() < 1e-3, "{b:?}");
        }
    }

    #[test]
    fn truncated_jpeg_is_refused() {
        let mut buf = Vec::new();
        let img = RgbImage::from_fn(64, 48, |x, y| image::Rgb([x as u8 * 3, y as u8 * 5, 7]));
        image::codecs::jpeg::JpegEncoder::new(&mut buf).encode_image(&img).unwrap();
        assert!(decode_image(&buf, &DecodeLimits::default()).is_ok());
        let cut = &buf[..buf.len() * 2 / 3];
        let e = decode_image(cut, &DecodeLimits::default()).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
    }

    #[test]
    fn identity_resize_is_exact() {
        let src: Vec<u8> = (0..(7 * 5 * 3)).map(|v| (v * 37 % 251) as u8).collect();
        assert_eq!(resize_linear_cv(&src, 7, 5, 7, 5), src);
    }
}
