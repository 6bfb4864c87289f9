//! Image decoding (with EXIF orientation and decompression-bomb limits) and the letterbox
//! transform, bit-compatible with the reference (ultralytics `LetterBox` on top of OpenCV's
//! `cv2.resize(..., INTER_LINEAR)` and `cv2.copyMakeBorder(..., value=114)`).

use std::io::Cursor;
use std::path::Path;

use image::{ImageDecoder, ImageReader, RgbImage};

use super::jpeg;

pub use image::metadata::Orientation;

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
    #[error("not a JPEG")]
    NotJpeg,
    #[error("image is {width}x{height}, above the limit ({max_side} px per side, {max_pixels} pixels)")]
    Dimensions { width: u32, height: u32, max_side: u32, max_pixels: u64 },
    #[error("corrupt or truncated {format} image: {reason}")]
    Corrupt { format: String, reason: String },
}

/// Decodes an encoded image into RGB8, honouring EXIF orientation; never panics on bad input.
///
/// JPEGs are decoded as the reference's loader (OpenCV's `imread`) decodes them, by libjpeg-turbo
/// at its defaults: their pixels are the reference's byte for byte. The other formats by the
/// `image` crate.
pub fn decode_image(bytes: &[u8], limits: &DecodeLimits) -> Result<RgbImage, ImageError> {
    let reader = open(bytes, limits)?;
    let format = reader.format().ok_or(ImageError::UnknownFormat)?;
    if format == image::ImageFormat::Jpeg {
        let (header, orientation) = checked_jpeg_headers(bytes, limits)?;
        let corrupt = |reason| ImageError::Corrupt { format: "JPEG".into(), reason };
        let (width, height) = header.size();
        let rgb = header.decode().map_err(corrupt)?;
        let img = RgbImage::from_raw(width, height, rgb).ok_or_else(|| corrupt("the decoder gave a short picture".into()))?;
        let mut img = image::DynamicImage::ImageRgb8(img);
        img.apply_orientation(orientation);
        return Ok(img.into_rgb8());
    }
    let fmt_name = format_name(format);
    let (mut decoder, _, _) = checked_decoder(reader, format, bytes, limits)?;
    let orientation = decoder.orientation().unwrap_or(image::metadata::Orientation::NoTransforms);
    // a decoder bug (e.g. an arithmetic overflow that panics where overflow checks are on) is
    // this input's error, not the caller's panic
    let mut img = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| image::DynamicImage::from_decoder(decoder)))
        .map_err(|_| ImageError::Corrupt { format: fmt_name.clone(), reason: "the decoder failed on this input".into() })?
        .map_err(|e| ImageError::Corrupt { format: fmt_name, reason: e.to_string() })?;
    img.apply_orientation(orientation);
    Ok(img.into_rgb8())
}

/// Every check [`decode_image`] makes on a JPEG before it decodes a pixel (size, format,
/// truncation, the headers as its decoder reads them, dimensions against `limits`, a header
/// claiming more blocks than the file has bits), without decoding any: the stored width and height
/// (before EXIF orientation) and the EXIF orientation. For decoders that take the file elsewhere
/// (nvJPEG) and ignore EXIF.
///
/// The size is libjpeg-turbo's reading of the headers, the decoder [`decode_image`] runs (nvJPEG's
/// own reading is compared with it before nvJPEG decodes); the EXIF orientation is zune-jpeg's
/// (the `image` crate's JPEG decoder), read straight from `bytes` with the options `image` gives
/// it. [`decode_image`] runs this check before libjpeg-turbo decodes the pixels, on the same
/// reading of the headers.
pub fn check_jpeg_header(bytes: &[u8], limits: &DecodeLimits) -> Result<(u32, u32, Orientation), ImageError> {
    let reader = open(bytes, limits)?;
    if reader.format() != Some(image::ImageFormat::Jpeg) {
        return Err(ImageError::NotJpeg);
    }
    let (header, orientation) = checked_jpeg_headers(bytes, limits)?;
    let (width, height) = header.size();
    Ok((width, height, orientation))
}

/// [`check_jpeg_header`] after the size and format checks: libjpeg-turbo's reading of the
/// headers, ready to decode, and the EXIF orientation.
fn checked_jpeg_headers<'a>(bytes: &'a [u8], limits: &DecodeLimits) -> Result<(jpeg::Header<'a>, Orientation), ImageError> {
    check_jpeg_complete(bytes)?;
    let corrupt = |reason: String| ImageError::Corrupt { format: "JPEG".into(), reason };
    // zune-jpeg for the EXIF orientation (TurboJPEG does not return the APP1 segment); a file
    // whose headers it cannot read is refused
    let options = zune_core::options::DecoderOptions::default().set_strict_mode(false).set_max_width(usize::MAX).set_max_height(usize::MAX);
    let mut decoder = zune_jpeg::JpegDecoder::new_with_options(zune_core::bytestream::ZCursor::new(bytes), options);
    decoder.decode_headers().map_err(|e| corrupt(e.to_string()))?;
    let orientation = decoder.exif().and_then(|exif| Orientation::from_exif_chunk(exif)).unwrap_or(Orientation::NoTransforms);
    // the size from the decoder that decodes the pixels: the two parsers skip a malformed
    // marker differently, and a file can hold a frame header for each
    let header = jpeg::Header::read(bytes, limits.max_pixels).map_err(corrupt)?;
    let (width, height) = header.size();
    check_dimensions(width, height, limits)?;
    check_jpeg_scan_size(bytes, width, height)?;
    Ok((header, orientation))
}

/// A picture's stored size against `limits` (and not empty).
fn check_dimensions(width: u32, height: u32, limits: &DecodeLimits) -> Result<(), ImageError> {
    if width == 0
        || height == 0
        || width > limits.max_side
        || height > limits.max_side
        || (width as u64) * (height as u64) > limits.max_pixels
    {
        return Err(ImageError::Dimensions { width, height, max_side: limits.max_side, max_pixels: limits.max_pixels });
    }
    Ok(())
}

/// A cut-off JPEG refused: decoders fill a cut-off scan with grey and succeed, and a half-written
/// upload is not a picture.
fn check_jpeg_complete(bytes: &[u8]) -> Result<(), ImageError> {
    if jpeg_is_complete(bytes) {
        Ok(())
    } else {
        Err(ImageError::Corrupt { format: "JPEG".into(), reason: "truncated: no end-of-image marker after the last scan".into() })
    }
}

/// Every 8x8 block of a Huffman-coded scan costs at least one bit, so a header that claims more
/// blocks than the file has bits is a stub: refused before any allocation.
fn check_jpeg_scan_size(bytes: &[u8], width: u32, height: u32) -> Result<(), ImageError> {
    let least = u64::from(width.div_ceil(8)) * u64::from(height.div_ceil(8)) / 8;
    if (bytes.len() as u64) < least {
        return Err(ImageError::Corrupt {
            format: "JPEG".into(),
            reason: format!(
                "the header claims {width}x{height}, which needs at least {least} bytes of scan data; the file has {}",
                bytes.len()
            ),
        });
    }
    Ok(())
}

/// The encoded file's size checks and its guessed format.
fn open<'a>(bytes: &'a [u8], limits: &DecodeLimits) -> Result<ImageReader<Cursor<&'a [u8]>>, ImageError> {
    if bytes.is_empty() {
        return Err(ImageError::Empty);
    }
    if bytes.len() as u64 > limits.max_bytes {
        return Err(ImageError::TooLarge { size: bytes.len() as u64, limit: limits.max_bytes });
    }
    Ok(ImageReader::new(Cursor::new(bytes)).with_guessed_format()?)
}

fn format_name(format: image::ImageFormat) -> String {
    format!("{format:?}").to_uppercase()
}

/// The decoder of `reader` (of `format`) once the header has passed every check made before
/// decoding, with `limits` set on it, and the picture's stored width and height.
fn checked_decoder<'a>(
    reader: ImageReader<Cursor<&'a [u8]>>,
    format: image::ImageFormat,
    bytes: &[u8],
    limits: &DecodeLimits,
) -> Result<(impl ImageDecoder + 'a, u32, u32), ImageError> {
    let corrupt = |e: image::ImageError| ImageError::Corrupt { format: format_name(format), reason: e.to_string() };
    if format == image::ImageFormat::Jpeg {
        check_jpeg_complete(bytes)?;
    }
    let mut decoder = reader.into_decoder().map_err(corrupt)?;
    let (width, height) = decoder.dimensions();
    check_dimensions(width, height, limits)?;
    if format == image::ImageFormat::Jpeg {
        check_jpeg_scan_size(bytes, width, height)?;
    }
    let mut img_limits = image::Limits::default();
    img_limits.max_image_width = Some(limits.max_side);
    img_limits.max_image_height = Some(limits.max_side);
    img_limits.max_alloc = Some(limits.max_pixels.saturating_mul(16));
    decoder.set_limits(img_limits).map_err(corrupt)?;
    Ok((decoder, width, height))
}

/// What a JPEG decoder's support for a file depends on, read from the headers before its first
/// scan: the start-of-frame marker (baseline, extended, progressive, lossless, arithmetic), its
/// segment (precision, size, components with their sampling factors and tables) and the restart
/// interval; and whether its three components are Y, Cb and Cr. Two files with the same key are
/// taken or refused alike by a decoder that looks only at these (nvJPEG's hardware decoder), so
/// its support check can be kept per key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct JpegFrameKey {
    marker: u8,
    /// The start-of-frame segment after its length: 6 bytes and 3 per component (at most 4).
    frame: [u8; 18],
    restart_interval: u16,
    ycbcr: bool,
}

impl JpegFrameKey {
    /// Three components that decoders read as Y, Cb and Cr, as libjpeg-turbo decides it
    /// (jdapimin.c `default_decompress_parms`): with a JFIF marker; else as an Adobe marker's
    /// transform says (0 is RGB); else unless the component identifiers are 'R', 'G', 'B'.
    pub fn ycbcr(&self) -> bool {
        self.ycbcr
    }
}

/// The [`JpegFrameKey`] of `b`, or `None` where its headers up to the first scan cannot be walked
/// (no start-of-image, a segment running past the end, no frame header, more than 4 components,
/// a second frame header). Reads only the segment lengths and the frame and restart segments.
pub fn jpeg_frame_key(b: &[u8]) -> Option<JpegFrameKey> {
    if b.get(..2)? != [0xFF, 0xD8] {
        return None;
    }
    let mut frame: Option<(u8, [u8; 18])> = None;
    let mut restart_interval = 0u16;
    let (mut jfif, mut adobe_transform) = (false, None);
    let mut i = 2;
    loop {
        if *b.get(i)? != 0xFF {
            return None;
        }
        // fill bytes: any number of 0xFF before the marker code
        while *b.get(i + 1)? == 0xFF {
            i += 1;
        }
        let marker = b[i + 1];
        i += 2;
        if marker == 0x01 || (0xD0..=0xD7).contains(&marker) {
            continue; // no segment
        }
        let len = usize::from(u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?]));
        if len < 2 {
            return None;
        }
        let seg = b.get(i + 2..i + len)?;
        match marker {
            0xDA => {
                let (marker, frame) = frame?;
                let rgb_ids = frame[5] == 3 && [frame[6], frame[9], frame[12]] == *b"RGB";
                let ycbcr = frame[5] == 3 && (jfif || adobe_transform.map_or(!rgb_ids, |t| t != 0));
                return Some(JpegFrameKey { marker, frame, restart_interval, ycbcr });
            }
            0xDD => restart_interval = u16::from_be_bytes([*seg.first()?, *seg.get(1)?]),
            0xE0 if seg.starts_with(b"JFIF\0") => jfif = true,
            // "Adobe", version, flags0, flags1, transform
            0xEE if seg.len() >= 12 && seg.starts_with(b"Adobe") => adobe_transform = Some(seg[11]),
            // SOF0-SOF15 except DHT (C4), JPG (C8) and DAC (CC)
            0xC0..=0xCF if !matches!(marker, 0xC4 | 0xC8 | 0xCC) => {
                let components = usize::from(*seg.get(5)?);
                if frame.is_some() || components > 4 || seg.len() < 6 + 3 * components {
                    return None;
                }
                let mut f = [0u8; 18];
                f[..6 + 3 * components].copy_from_slice(&seg[..6 + 3 * components]);
                frame = Some((marker, f));
            }
            _ => {}
        }
        i += len;
    }
}

/// True when an end-of-image marker follows the last start-of-scan marker. Entropy-coded data
/// stuffs every 0xFF with 0x00, so neither marker can appear inside a scan by chance.
///
/// Read as: a start of scan exists, and none follows the last end of image. In a complete file
/// the last end of image is its last two bytes and the first start of scan ends its headers, so
/// the check reads a few bytes at each end (memchr's SIMD search over 0xFF bytes) instead of the
/// whole scan; it runs on every picture and must cost little beside decoding it.
fn jpeg_is_complete(b: &[u8]) -> bool {
    let marker = |i: usize, m: u8| b.get(i + 1) == Some(&m);
    let Some(eoi) = memchr::memrchr_iter(0xFF, b).find(|&i| marker(i, 0xD9)) else { return false };
    let sos_after = memchr::memchr_iter(0xFF, &b[eoi..]).any(|i| marker(eoi + i, 0xDA));
    !sos_after && memchr::memchr_iter(0xFF, &b[..eoi]).any(|i| marker(i, 0xDA))
}

/// Reads and decodes an image file (see [`read_image_file`]).
pub fn load_image(path: &Path, limits: &DecodeLimits) -> Result<RgbImage, ImageError> {
    decode_image(&read_image_file(path, limits)?, limits)
}

/// Reads an image file's bytes: a regular file (a FIFO or a device in a hot folder is an error,
/// not a read that never ends) of at most `limits.max_bytes`.
pub fn read_image_file(path: &Path, limits: &DecodeLimits) -> Result<Vec<u8>, ImageError> {
    let meta = std::fs::metadata(path)?;
    if meta.is_file() && meta.len() > limits.max_bytes {
        return Err(ImageError::TooLarge { size: meta.len(), limit: limits.max_bytes });
    }
    Ok(crate::files::read_bounded(path, limits.max_bytes)?)
}

/// How pictures are fitted to the network input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fit {
    /// The reference's `predict` default (`LetterBox(auto=True)`): scaled to fit `imgsz` on the
    /// long side, the short side padded to the next multiple of the model's largest stride. A
    /// 1280x720 frame runs at 640x384, a 640x480 photo at 640x480.
    #[default]
    Rect,
    /// Padded to an `imgsz` square (`LetterBox(auto=False)`).
    Square,
}

impl std::str::FromStr for Fit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "rect" => Ok(Fit::Rect),
            "square" => Ok(Fit::Square),
            _ => Err(format!("`{s}` is not a letterbox fit (rect or square)")),
        }
    }
}

/// The largest stride of every YOLOv9 variant: rectangles are padded to multiples of it.
pub const STRIDE: u32 = 32;

/// Where the original picture sits inside the network input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LetterboxGeometry {
    pub orig_w: u32,
    pub orig_h: u32,
    /// Width and height of the network input.
    pub in_w: u32,
    pub in_h: u32,
    /// Width and height of the resized picture inside the input.
    pub new_w: u32,
    pub new_h: u32,
    /// Left and top padding, in pixels.
    pub left: u32,
    pub top: u32,
}

impl LetterboxGeometry {
    /// The reference's square geometry (`LetterBox(auto=False, scale_fill=False, scaleup=True,
    /// center=True)`), including Python's round-half-to-even.
    pub fn new(orig_w: u32, orig_h: u32, size: u32) -> Self {
        Self::fit(orig_w, orig_h, size, Fit::Square)
    }

    /// The reference's geometry for `fit`: the picture scaled by `min(size/h, size/w)`, each side
    /// rounded half to even; the padding around it the whole rest of the square (`Square`) or
    /// only what reaches the next multiple of [`STRIDE`] (`Rect`, `LetterBox(auto=True)`), split
    /// as `round(d/2 - 0.1)` before and the rest after.
    pub fn fit(orig_w: u32, orig_h: u32, size: u32, fit: Fit) -> Self {
        let r = f64::min(size as f64 / orig_h as f64, size as f64 / orig_w as f64);
        let new_w = ((orig_w as f64 * r).round_ties_even() as u32).clamp(1, size);
        let new_h = ((orig_h as f64 * r).round_ties_even() as u32).clamp(1, size);
        let (dw, dh) = match fit {
            Fit::Square => (size - new_w, size - new_h),
            Fit::Rect => ((size - new_w) % STRIDE, (size - new_h) % STRIDE),
        };
        let left = (dw as f64 / 2.0 - 0.1).round_ties_even() as u32;
        let top = (dh as f64 / 2.0 - 0.1).round_ties_even() as u32;
        Self { orig_w, orig_h, in_w: new_w + dw, in_h: new_h + dh, new_w, new_h, left, top }
    }

    /// Maps a box from network-input pixels back to original-image pixels, clipped to the image
    /// (the reference's `scale_boxes` + `clip_boxes`, which recompute gain and padding from the
    /// input and original shapes).
    pub fn unletterbox(&self, b: [f32; 4]) -> [f32; 4] {
        let (w, h) = (self.orig_w as f64, self.orig_h as f64);
        let gain = f64::min(self.in_h as f64 / h, self.in_w as f64 / w);
        let new_w = (w * gain).round_ties_even().max(1.0);
        let new_h = (h * gain).round_ties_even().max(1.0);
        let (gx, gy) = (new_w / w, new_h / h);
        let pad_x = ((self.in_w as f64 - new_w) / 2.0 - 0.1).round_ties_even();
        let pad_y = ((self.in_h as f64 - new_h) / 2.0 - 0.1).round_ties_even();
        let f = |v: f32, pad: f64, g: f64, max: f64| ((v as f64 - pad) / g).clamp(0.0, max) as f32;
        [f(b[0], pad_x, gx, w), f(b[1], pad_y, gy, h), f(b[2], pad_x, gx, w), f(b[3], pad_y, gy, h)]
    }
}

/// A picture letterboxed to the network input, HWC RGB u8 (normalised on the device).
#[derive(Debug, Clone)]
pub struct Letterboxed {
    pub pixels: Vec<u8>,
    pub geometry: LetterboxGeometry,
}

/// Positions of a batch grouped by key (a picture's input shape: one forward pass takes one
/// shape), groups in order of first appearance, positions ascending within each.
pub fn group_positions<K: PartialEq>(keys: impl IntoIterator<Item = K>) -> Vec<(K, Vec<usize>)> {
    let mut groups: Vec<(K, Vec<usize>)> = Vec::new();
    for (i, k) in keys.into_iter().enumerate() {
        match groups.iter_mut().find(|g| g.0 == k) {
            Some(g) => g.1.push(i),
            None => groups.push((k, vec![i])),
        }
    }
    groups
}

/// Letterboxes to an `imgsz` square (see [`letterbox_fit`]).
pub fn letterbox(img: &RgbImage, size: u32) -> Letterboxed {
    letterbox_fit(img, size, Fit::Square)
}

/// Resizes with OpenCV's INTER_LINEAR fixed-point arithmetic and pads with 114, centred, to the
/// input [`LetterboxGeometry::fit`] gives. The resized rows are written straight into the
/// padded picture.
pub fn letterbox_fit(img: &RgbImage, size: u32, fit: Fit) -> Letterboxed {
    let geometry = LetterboxGeometry::fit(img.width(), img.height(), size, fit);
    let (iw, ih) = (geometry.in_w as usize, geometry.in_h as usize);
    let mut pixels = vec![PAD_VALUE; iw * ih * 3];
    let (nw, nh) = (geometry.new_w as usize, geometry.new_h as usize);
    let at = (geometry.top as usize * iw + geometry.left as usize) * 3;
    let dst = &mut pixels[at..];
    if (geometry.new_w, geometry.new_h) == (img.width(), img.height()) {
        for (y, src) in img.as_raw().chunks_exact(nw * 3).enumerate() {
            dst[y * iw * 3..][..nw * 3].copy_from_slice(src);
        }
    } else {
        resize_linear_cv_into(img.as_raw(), img.width() as usize, img.height() as usize, dst, iw * 3, nw, nh);
    }
    Letterboxed { pixels, geometry }
}

const COEF_BITS: u32 = 11;
const COEF_SCALE: f32 = (1 << COEF_BITS) as f32;

/// Source index and fixed-point weights of one destination coordinate, as OpenCV computes them.
pub(crate) fn linear_taps(dst_len: usize, src_len: usize, clamp_weight: bool) -> Vec<(usize, usize, i32, i32)> {
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
    let mut dst = vec![0u8; dw * dh * 3];
    resize_linear_cv_into(src, sw, sh, &mut dst, dw * 3, dw, dh);
    dst
}

/// [`resize_linear_cv`] into `dst`, whose rows start `stride` bytes apart (row `y` at
/// `dst[y * stride..][..dw * 3]`); the bytes between rows are left as they are.
pub fn resize_linear_cv_into(src: &[u8], sw: usize, sh: usize, dst: &mut [u8], stride: usize, dw: usize, dh: usize) {
    let xt = linear_taps(dw, sw, true);
    let yt = linear_taps(dh, sh, false);
    let hpass = |row: usize, out: &mut [i32]| {
        let r = &src[row * sw * 3..(row + 1) * sw * 3];
        for (o, &(s0, s1, w0, w1)) in out.chunks_exact_mut(3).zip(&xt) {
            let (a, b) = (&r[s0 * 3..s0 * 3 + 3], &r[s1 * 3..s1 * 3 + 3]);
            o[0] = a[0] as i32 * w0 + b[0] as i32 * w1;
            o[1] = a[1] as i32 * w0 + b[1] as i32 * w1;
            o[2] = a[2] as i32 * w0 + b[2] as i32 * w1;
        }
    };
    // the horizontal passes of the two source rows the current destination row reads; the
    // next destination row usually reads the same rows or the one after
    let (mut h0, mut h1) = (vec![0i32; dw * 3], vec![0i32; dw * 3]);
    let (mut row0, mut row1) = (usize::MAX, usize::MAX);
    for (y, &(r0, r1, b0, b1)) in yt.iter().enumerate() {
        if r0 != row0 {
            if r0 == row1 {
                std::mem::swap(&mut h0, &mut h1);
                row1 = usize::MAX;
            } else {
                hpass(r0, &mut h0);
            }
            row0 = r0;
        }
        if r1 != row1 {
            if r1 == row0 {
                h1.copy_from_slice(&h0);
            } else {
                hpass(r1, &mut h1);
            }
            row1 = r1;
        }
        let out = &mut dst[y * stride..][..dw * 3];
        for ((o, &a), &b) in out.iter_mut().zip(&h0).zip(&h1) {
            let a = ((a >> 4) * b0) >> 16;
            let b = ((b >> 4) * b1) >> 16;
            *o = ((a + b + 2) >> 2).clamp(0, 255) as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jpeg_that_overflows_the_decoders_arithmetic_is_an_error_or_a_picture_never_a_panic() {
        // found by the `mqtt_image` fuzz target: zune-jpeg 0.5.15 multiplies with overflow
        // (bitstream.rs:400) while decoding it, a panic where overflow checks are on. As found,
        // its header claims more blocks than its scan can hold, which the stub check refuses
        // before any decoding
        let bytes = include_bytes!("../../fuzz/regressions/picture/zune-jpeg-0.5.15-mul-overflow.jpg");
        let e = decode_image(bytes, &DecodeLimits::default()).unwrap_err();
        assert!(e.to_string().contains("scan data"), "{e}");
        // the same file with 5000 zero bytes before its end-of-image marker (a later fuzz find had
        // such a scan) passes that check and reaches the decoder, whose panic is this input's error
        let padded = include_bytes!("../../fuzz/regressions/picture/zune-jpeg-0.5.15-mul-overflow-padded.jpg");
        match decode_image(padded, &DecodeLimits::default()) {
            Ok(img) => assert!(img.width() > 0 && img.height() > 0),
            Err(ImageError::Corrupt { reason, .. }) if cfg!(debug_assertions) => assert_eq!(reason, "the decoder failed on this input"),
            Err(e) => assert!(matches!(e, ImageError::Corrupt { .. }), "{e}"),
        }
    }

    /// A baseline 4:2:0 JPEG of `w` x `h` from the `image` crate's encoder.
    fn encoded(w: u32, h: u32, quality: u8) -> Vec<u8> {
        let img = RgbImage::from_fn(w, h, |x, y| image::Rgb([(x * 7) as u8, (y * 5) as u8, ((x + y) * 3) as u8]));
        let mut out = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality).encode_image(&img).unwrap();
        out
    }

    #[test]
    fn the_frame_key_is_the_frame_header_and_restart_interval_and_nothing_else() {
        let a = encoded(64, 48, 90);
        let k = jpeg_frame_key(&a).expect("a baseline JPEG has a key");
        assert_eq!(k.marker, 0xC0);
        assert_eq!(&k.frame[..6], &[8, 0, 48, 0, 64, 3]);
        // other pixels and other tables, same frame: same key
        assert_eq!(jpeg_frame_key(&encoded(64, 48, 40)), Some(k));
        // another size: another key
        assert_ne!(jpeg_frame_key(&encoded(48, 64, 90)), Some(k));
        // progressive (SOF2 in place of SOF0): another key
        let sof = a.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        let mut p = a.clone();
        p[sof + 1] = 0xC2;
        assert_eq!(jpeg_frame_key(&p).map(|k| k.marker), Some(0xC2));
        // a restart interval (DRI after SOI): another key
        let mut r = a[..2].to_vec();
        r.extend_from_slice(&[0xFF, 0xDD, 0, 4, 0, 16]);
        r.extend_from_slice(&a[2..]);
        let kr = jpeg_frame_key(&r).unwrap();
        assert_eq!((kr.marker, kr.frame, kr.restart_interval), (k.marker, k.frame, 16));
    }

    #[test]
    fn the_frame_key_says_whether_the_components_are_ycbcr_as_libjpeg_turbo_reads_them() {
        let a = encoded(32, 16, 90);
        assert!(a[2..4] == [0xFF, 0xE0] && a[6..11] == *b"JFIF\0", "the encoder writes a JFIF marker first");
        let app0 = 4 + usize::from(u16::from_be_bytes([a[4], a[5]]));
        // `a` without its JFIF marker, with `segment` after the start of image and the
        // components' identifiers set to `ids`
        let variant = |segment: &[u8], ids: &[u8; 3]| {
            let mut v = a[..2].to_vec();
            v.extend_from_slice(segment);
            v.extend_from_slice(&a[app0..]);
            let sof = v.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
            for (k, id) in ids.iter().enumerate() {
                v[sof + 10 + 3 * k] = *id;
            }
            jpeg_frame_key(&v).expect("a key").ycbcr()
        };
        let adobe = |transform: u8| [&[0xFF, 0xEE, 0, 14][..], b"Adobe", &[0, 100, 0, 0, 0, 0, transform]].concat();
        assert!(jpeg_frame_key(&a).unwrap().ycbcr(), "JFIF");
        assert!(variant(&[], &[1, 2, 3]), "no marker, identifiers 1 2 3");
        assert!(variant(&[], &[7, 8, 9]), "no marker, other identifiers");
        assert!(!variant(&[], b"RGB"), "no marker, identifiers R G B");
        assert!(!variant(&adobe(0), &[1, 2, 3]), "Adobe, transform 0");
        assert!(variant(&adobe(1), b"RGB"), "Adobe, transform 1");
        assert!(variant(&[&a[2..app0], &adobe(0)[..]].concat(), b"RGB"), "JFIF before an Adobe marker's transform 0");
        let gray = image::GrayImage::from_fn(16, 16, |x, y| image::Luma([(x * y) as u8]));
        let mut g = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut g, 90).encode_image(&gray).unwrap();
        assert!(!jpeg_frame_key(&g).unwrap().ycbcr(), "one component");
    }

    #[test]
    fn a_frame_key_is_none_for_headers_that_cannot_be_walked() {
        let a = encoded(32, 32, 90);
        assert_eq!(jpeg_frame_key(&[]), None);
        assert_eq!(jpeg_frame_key(b"\x89PNG\r\n"), None);
        // cut anywhere before the scan: None, never a panic
        let sos = a.windows(2).position(|w| w == [0xFF, 0xDA]).unwrap();
        for n in 0..sos + 4 {
            assert_eq!(jpeg_frame_key(&a[..n]), None, "cut at {n}");
        }
        // a segment length of 0 or 1
        for len in [0u8, 1] {
            let mut bad = a[..2].to_vec();
            bad.extend_from_slice(&[0xFF, 0xE0, 0, len]);
            bad.extend_from_slice(&a[2..]);
            assert_eq!(jpeg_frame_key(&bad), None);
        }
        // a frame header of 5 components
        let sof = a.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        let mut five = a.clone();
        five[sof + 9] = 5;
        assert_eq!(jpeg_frame_key(&five), None);
        // every byte flipped in turn: whatever comes back, no panic
        for k in 0..a.len().min(700) {
            let mut f = a.clone();
            f[k] ^= 0xA5;
            let _ = jpeg_frame_key(&f);
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
    fn rect_geometry_matches_reference_rounding() {
        // ultralytics LetterBox((640, 640), auto=True, stride=32)
        let g = LetterboxGeometry::fit(1280, 720, 640, Fit::Rect);
        assert_eq!((g.in_w, g.in_h, g.new_w, g.new_h, g.left, g.top), (640, 384, 640, 360, 0, 12));
        let g = LetterboxGeometry::fit(640, 480, 640, Fit::Rect);
        assert_eq!((g.in_w, g.in_h, g.left, g.top), (640, 480, 0, 0));
        // portrait, sides not multiples of 32: 773x1031 -> 480x640, new 480x640
        let g = LetterboxGeometry::fit(773, 1031, 640, Fit::Rect);
        assert_eq!((g.in_w, g.in_h, g.new_w, g.new_h, g.left, g.top), (480, 640, 480, 640, 0, 0));
        // 773x512 -> 640x424 padded by 24: top round(11.9) = 12, bottom 12
        let g = LetterboxGeometry::fit(773, 512, 640, Fit::Rect);
        assert_eq!((g.in_w, g.in_h, g.top), (640, 448, 12));
        // an odd pad: 1000x597 -> 640x382, dh = 258 % 32 = 2 -> top round(0.9) = 1
        let g = LetterboxGeometry::fit(1000, 597, 640, Fit::Rect);
        assert_eq!((g.in_h, g.new_h, g.top), (384, 382, 1));
        for (w, h) in [(1280, 720), (773, 1031), (1000, 597), (333, 333), (50, 900)] {
            let g = LetterboxGeometry::fit(w, h, 640, Fit::Rect);
            assert!(g.in_w.is_multiple_of(STRIDE) && g.in_h.is_multiple_of(STRIDE) && g.in_w.max(g.in_h) == 640, "{g:?}");
            let b = g.unletterbox([g.left as f32, g.top as f32, (g.left + g.new_w) as f32, (g.top + g.new_h) as f32]);
            for (v, e) in b.iter().zip([0.0, 0.0, w as f32, h as f32]) {
                assert!((v - e).abs() < 1e-3, "{w}x{h}: {b:?}");
            }
        }
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

    /// A small JPEG whose frame header is patched to claim `w`x`h`.
    fn jpeg_claiming(w: u16, h: u16) -> Vec<u8> {
        let mut buf = Vec::new();
        let img = RgbImage::from_fn(64, 48, |x, y| image::Rgb([x as u8 * 3, y as u8 * 5, 7]));
        image::codecs::jpeg::JpegEncoder::new(&mut buf).encode_image(&img).unwrap();
        // SOF0: FF C0, length (2), precision (1), height (2), width (2)
        let sof = buf.windows(2).position(|m| m == [0xFF, 0xC0]).unwrap();
        buf[sof + 5..sof + 7].copy_from_slice(&h.to_be_bytes());
        buf[sof + 7..sof + 9].copy_from_slice(&w.to_be_bytes());
        buf
    }

    #[test]
    fn jpeg_stubs_claiming_large_pictures_are_refused_before_decoding() {
        let stub = jpeg_claiming(16000, 6000);
        assert!(stub.len() < 2000, "{}", stub.len());
        let t = std::time::Instant::now();
        let e = decode_image(&stub, &DecodeLimits::default()).unwrap_err().to_string();
        assert!(e.contains("claims 16000x6000") && e.contains("187500 bytes"), "{e}");
        // refused from the header: no 288 MB canvas was made and filled
        assert!(t.elapsed() < std::time::Duration::from_millis(100), "{:?}", t.elapsed());
        // the bound is far below what real pictures hold: the unpatched picture decodes
        assert!(decode_image(&jpeg_claiming(64, 48), &DecodeLimits::default()).is_ok());
        // over the side limit, the dimensions error comes first
        let e = decode_image(&jpeg_claiming(20000, 100), &DecodeLimits::default()).unwrap_err().to_string();
        assert!(e.contains("20000x100") && e.contains("above the limit"), "{e}");
    }

    #[test]
    fn the_jpeg_header_check_refuses_what_decode_image_refuses_without_decoding() {
        let ok = jpeg_claiming(64, 48);
        let (w, h, o) = check_jpeg_header(&ok, &DecodeLimits::default()).unwrap();
        assert_eq!((w, h, o), (64, 48, Orientation::NoTransforms));
        let stub = check_jpeg_header(&jpeg_claiming(16000, 6000), &DecodeLimits::default()).unwrap_err().to_string();
        assert!(stub.contains("claims 16000x6000"), "{stub}");
        let cut = check_jpeg_header(&ok[..ok.len() * 2 / 3], &DecodeLimits::default()).unwrap_err().to_string();
        assert!(cut.contains("truncated"), "{cut}");
        let small = DecodeLimits { max_side: 32, ..DecodeLimits::default() };
        assert!(matches!(check_jpeg_header(&ok, &small), Err(ImageError::Dimensions { width: 64, height: 48, .. })));
        let few = DecodeLimits { max_pixels: 64 * 48 - 1, ..DecodeLimits::default() };
        assert!(matches!(check_jpeg_header(&ok, &few), Err(ImageError::Dimensions { width: 64, height: 48, .. })));
        assert!(matches!(decode_image(&ok, &few), Err(ImageError::Dimensions { width: 64, height: 48, .. })));
        assert!(decode_image(&ok, &DecodeLimits { max_pixels: 64 * 48, ..DecodeLimits::default() }).is_ok());
        let mut png = Vec::new();
        RgbImage::new(4, 4).write_to(&mut Cursor::new(&mut png), image::ImageFormat::Png).unwrap();
        assert!(matches!(check_jpeg_header(&png, &DecodeLimits::default()), Err(ImageError::NotJpeg)));
        assert!(decode_image(&png, &DecodeLimits::default()).is_ok());
        // a header the decoder cannot read: refused by both
        let mut bad = ok.clone();
        let sof = bad.windows(2).position(|m| m == [0xFF, 0xC0]).unwrap();
        bad[sof + 9] = 0; // no components
        let (c, d) = (check_jpeg_header(&bad, &DecodeLimits::default()), decode_image(&bad, &DecodeLimits::default()));
        assert!(matches!(c, Err(ImageError::Corrupt { .. })) && d.is_err(), "{c:?} {d:?}");
    }

    /// `jpeg` with an APP1 EXIF segment (big-endian TIFF, one IFD entry) giving `orientation`.
    fn with_exif_orientation(jpeg: &[u8], orientation: u16) -> Vec<u8> {
        let mut tiff = b"MM\0\x2a\0\0\0\x08".to_vec();
        tiff.extend_from_slice(&1u16.to_be_bytes()); // one entry
        tiff.extend_from_slice(&[0x01, 0x12, 0, 3, 0, 0, 0, 1]); // Orientation, SHORT, count 1
        tiff.extend_from_slice(&orientation.to_be_bytes());
        tiff.extend_from_slice(&[0, 0, 0, 0, 0, 0]); // value padding, no next IFD
        let mut payload = b"Exif\0\0".to_vec();
        payload.extend_from_slice(&tiff);
        let mut out = jpeg[..2].to_vec();
        out.extend_from_slice(&[0xFF, 0xE1]);
        out.extend_from_slice(&(payload.len() as u16 + 2).to_be_bytes());
        out.extend_from_slice(&payload);
        out.extend_from_slice(&jpeg[2..]);
        out
    }

    /// Where the first segment of `jpeg` with marker `0xFF marker` lies, marker and length included.
    fn segment(jpeg: &[u8], marker: u8) -> std::ops::Range<usize> {
        let at = jpeg.windows(2).position(|m| m == [0xFF, marker]).unwrap();
        at..at + 2 + u16::from_be_bytes([jpeg[at + 2], jpeg[at + 3]]) as usize
    }

    #[test]
    fn the_jpeg_header_check_reads_the_size_that_decode_image_decodes() {
        // found by the `picture` fuzz target under AddressSanitizer (kept in
        // fuzz/regressions/picture/): after a TEM marker (0xFF01, which has no length), zune-jpeg
        // reads two bytes as a length and skips that far, libjpeg-turbo skips to the next marker;
        // a file with a frame header where each lands gave the check one size and the decoder
        // another, and the device path's fallback a picture of the wrong shape for its batch.
        // Here: a 24x19 picture whose first frame header libjpeg-turbo reads, and inside a
        // comment a 24x17 one, where zune-jpeg's skip lands
        let tall = encoded(24, 19, 90);
        let short = encoded(24, 17, 90);
        let (at, sof_short) = (segment(&tall, 0xC0), &short[segment(&short, 0xC0)]);
        let sof_tall = &tall[at.clone()];
        let mut file = vec![0xFF, 0xD8, 0xFF, 0x01];
        let skip = 2 + sof_tall.len() + 4;
        file.extend_from_slice(&(skip as u16).to_be_bytes());
        file.extend_from_slice(sof_tall);
        file.extend_from_slice(&[0xFF, 0xFE]);
        file.extend_from_slice(&(2 + sof_short.len() as u16).to_be_bytes());
        file.extend_from_slice(sof_short);
        // the rest of the 24x19 file without its frame header: tables, scan, end of image
        file.extend_from_slice(&tall[2..at.start]);
        file.extend_from_slice(&tall[at.end..]);
        let mut zune = zune_jpeg::JpegDecoder::new(zune_core::bytestream::ZCursor::new(&file[..]));
        zune.decode_headers().unwrap();
        assert_eq!(zune.dimensions(), Some((24, 17)), "zune-jpeg reads the other frame header");
        let limits = DecodeLimits::default();
        let (w, h, _) = check_jpeg_header(&file, &limits).unwrap();
        assert_eq!((w, h), (24, 19));
        assert_eq!(decode_image(&file, &limits).unwrap().dimensions(), (24, 19));
        let found = include_bytes!("../../fuzz/regressions/picture/tem-marker-two-frame-headers.jpg");
        let (w, h, _) = check_jpeg_header(found, &limits).unwrap();
        assert_eq!(decode_image(found, &limits).unwrap().dimensions(), (w, h));
    }

    #[test]
    fn the_jpeg_header_check_reads_the_exif_orientation_that_decode_image_applies() {
        for (tag, want) in
            [(1, Orientation::NoTransforms), (3, Orientation::Rotate180), (6, Orientation::Rotate90), (8, Orientation::Rotate270)]
        {
            let jpeg = with_exif_orientation(&encoded(64, 48, 90), tag);
            let (w, h, o) = check_jpeg_header(&jpeg, &DecodeLimits::default()).unwrap();
            assert_eq!((w, h, o), (64, 48, want), "orientation tag {tag}");
            let img = decode_image(&jpeg, &DecodeLimits::default()).unwrap();
            let turned = matches!(want, Orientation::Rotate90 | Orientation::Rotate270);
            assert_eq!(img.dimensions(), if turned { (48, 64) } else { (64, 48) }, "orientation tag {tag}");
        }
    }

    #[test]
    fn a_jpeg_is_complete_when_an_end_of_image_follows_its_last_scan() {
        let ok = encoded(64, 48, 90);
        assert!(jpeg_is_complete(&ok));
        // cut anywhere inside the scan, or the end-of-image marker alone cut off
        let sos = ok.windows(2).rposition(|m| m == [0xFF, 0xDA]).unwrap();
        for cut in [sos + 1, sos + 20, ok.len() - 2, ok.len() - 1] {
            assert!(!jpeg_is_complete(&ok[..cut]), "cut at {cut} of {}", ok.len());
        }
        // trailing bytes after the end of image are allowed
        let mut tail = ok.clone();
        tail.extend_from_slice(&[0, 0, 0xFF]);
        assert!(jpeg_is_complete(&tail));
        // an end of image before the main scan (an EXIF thumbnail's) does not make a cut file complete
        let thumb = encoded(8, 8, 50);
        let mut with_thumb = ok[..2].to_vec();
        with_thumb.extend_from_slice(&[0xFF, 0xE1]);
        with_thumb.extend_from_slice(&(thumb.len() as u16 + 2).to_be_bytes());
        with_thumb.extend_from_slice(&thumb);
        with_thumb.extend_from_slice(&ok[2..]);
        assert!(jpeg_is_complete(&with_thumb));
        assert!(!jpeg_is_complete(&with_thumb[..with_thumb.len() - 100]));
        // no scan at all, or a scan after the last end of image
        assert!(!jpeg_is_complete(&[0xFF, 0xD8, 0xFF, 0xD9]));
        let mut scan_after = ok.clone();
        scan_after.extend_from_slice(&[0xFF, 0xDA, 0, 2]);
        assert!(!jpeg_is_complete(&scan_after));
    }

    #[test]
    fn only_regular_files_are_read_as_pictures() {
        let e = load_image(Path::new("/dev/zero"), &DecodeLimits::default()).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.jpg");
        std::fs::write(&big, vec![0u8; 2000]).unwrap();
        let limits = DecodeLimits { max_bytes: 1000, ..DecodeLimits::default() };
        assert!(matches!(load_image(&big, &limits), Err(ImageError::TooLarge { size: 2000, limit: 1000 })));
    }

    #[test]
    fn positions_group_by_key_in_order_of_first_appearance() {
        let shapes = [(640, 384), (640, 480), (640, 384), (384, 640), (640, 480), (640, 384)];
        let groups = group_positions(shapes);
        assert_eq!(groups, [((640, 384), vec![0, 2, 5]), ((640, 480), vec![1, 4]), ((384, 640), vec![3])]);
        assert!(group_positions(Vec::<u8>::new()).is_empty());
    }

    #[test]
    fn identity_resize_is_exact() {
        let src: Vec<u8> = (0..(7 * 5 * 3)).map(|v| (v * 37 % 251) as u8).collect();
        assert_eq!(resize_linear_cv(&src, 7, 5, 7, 5), src);
    }
}
