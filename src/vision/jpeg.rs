//! JPEG pixels as the reference gets them: libjpeg-turbo, the decoder OpenCV's `imread` runs
//! under ultralytics, through its TurboJPEG API at its defaults (the accurate integer IDCT,
//! smooth chroma upsampling, its fixed-point YCbCr to RGB; CMYK and YCCK files to CMYK, then
//! OpenCV's own CMYK to RGB), so that a photo's pixels are the reference's byte for byte. The
//! headers are read first, on the decompressor that decodes, so that the caller
//! ([`super::preprocess`]) checks the size (against its pixel and side limits, before the output
//! is allocated) that is then decoded; the decompressor itself bounds the memory of a
//! progressive file's coefficients and the number of its scans.
//!
//! May use: turbojpeg-sys (libjpeg-turbo, built from its bundled source and linked statically),
//! the standard library.

use std::ffi::CStr;

use turbojpeg_sys as tj;

/// Most scans a progressive file may have: each one is a pass over every coefficient, so a file
/// of thousands of tiny scans is a denial of service in a few kilobytes (libjpeg-turbo's own fuzz
/// targets stop at 500; a progressive camera or web picture has about 10).
const MAX_SCANS: i32 = 500;

/// One TurboJPEG decompressor instance, destroyed on drop.
struct Handle(tj::tjhandle);

impl Handle {
    fn new() -> Result<Self, String> {
        // SAFETY: tj3Init takes no pointer; it returns a new instance or null.
        let h = unsafe { tj::tj3Init(tj::TJINIT_TJINIT_DECOMPRESS as libc::c_int) };
        if h.is_null() {
            Err("libjpeg-turbo could not allocate a decompressor".into())
        } else {
            Ok(Self(h))
        }
    }

    fn set(&mut self, param: tj::TJPARAM, value: libc::c_int) -> Result<(), String> {
        // SAFETY: self.0 is a live instance (new() checked it, drop destroys it once).
        if unsafe { tj::tj3Set(self.0, param as libc::c_int, value) } == 0 {
            Ok(())
        } else {
            Err(self.message())
        }
    }

    fn get(&self, param: tj::TJPARAM) -> libc::c_int {
        // SAFETY: as in set; tj3Get only reads the instance.
        unsafe { tj::tj3Get(self.0, param as libc::c_int) }
    }

    /// Makes the return code of a call on this instance a result: a warning (corrupt data that
    /// libjpeg-turbo decoded through, as OpenCV accepts it) is success, an error is its message.
    fn check(&self, rc: libc::c_int) -> Result<(), String> {
        // SAFETY: as in get; tj3GetErrorCode reads the instance's last error.
        if rc == 0 || unsafe { tj::tj3GetErrorCode(self.0) } == tj::TJERR_TJERR_WARNING as libc::c_int {
            Ok(())
        } else {
            Err(self.message())
        }
    }

    fn message(&self) -> String {
        // SAFETY: tj3GetErrorStr returns a pointer to a NUL-terminated buffer inside the instance
        // (never null), valid until the next call on it; it is copied out at once.
        unsafe { CStr::from_ptr(tj::tj3GetErrorStr(self.0)) }.to_string_lossy().trim().to_string()
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the instance is live and destroyed only here.
        unsafe { tj::tj3Destroy(self.0) }
    }
}

/// A JPEG file's headers as libjpeg-turbo reads them, on the decompressor that will decode it:
/// the frame size [`Header::size`] gives is the size [`Header::decode`] decodes, so the caller's
/// checks of it hold for the pixels.
pub(crate) struct Header<'a> {
    h: Handle,
    bytes: &'a [u8],
    len: tj::size_t,
    width: u32,
    height: u32,
    cmyk: bool,
}

impl<'a> Header<'a> {
    /// Reads the headers of `bytes` (up to the first scan) on a decompressor bounded for a
    /// picture of at most `max_pixels` pixels: a progressive file's coefficient memory and its
    /// number of scans. Errors are libjpeg-turbo's messages.
    pub(crate) fn read(bytes: &'a [u8], max_pixels: u64) -> Result<Self, String> {
        let mut h = Handle::new()?;
        let clamp = |v: u64| libc::c_int::try_from(v).unwrap_or(libc::c_int::MAX);
        // a progressive picture keeps every coefficient: 2 bytes per sample, 4 samples per pixel
        // at most; in megabytes, with room for the entropy decoder's own tables
        h.set(tj::TJPARAM_TJPARAM_MAXMEMORY, clamp(max_pixels.saturating_mul(8) / (1 << 20) + 16))?;
        h.set(tj::TJPARAM_TJPARAM_SCANLIMIT, MAX_SCANS)?;
        let len = tj::size_t::try_from(bytes.len()).map_err(|_| "the file is too large".to_string())?;
        // SAFETY: `bytes` is valid for `len` bytes for the whole call and is only read.
        h.check(unsafe { tj::tj3DecompressHeader(h.0, bytes.as_ptr(), len) })?;
        let colorspace = h.get(tj::TJPARAM_TJPARAM_COLORSPACE);
        let cmyk = colorspace == tj::TJCS_TJCS_CMYK as libc::c_int || colorspace == tj::TJCS_TJCS_YCCK as libc::c_int;
        let (w, hgt) = (h.get(tj::TJPARAM_TJPARAM_JPEGWIDTH), h.get(tj::TJPARAM_TJPARAM_JPEGHEIGHT));
        let (Ok(width), Ok(height)) = (u32::try_from(w), u32::try_from(hgt)) else {
            return Err(format!("a frame of {w}x{hgt}"));
        };
        Ok(Self { h, bytes, len, width, height, cmyk })
    }

    /// The frame's width and height (before EXIF orientation).
    pub(crate) fn size(&self) -> (u32, u32) {
        (self.width, self.height)
    }

    /// The picture as packed RGB8 rows, as OpenCV's `imread` decodes it (before EXIF
    /// orientation), in a buffer of [`Header::size`]: the caller has checked that size. Errors are
    /// libjpeg-turbo's messages.
    pub(crate) fn decode(self) -> Result<Vec<u8>, String> {
        let Self { h, bytes, len, width, height, cmyk } = self;
        let (format, channels) = if cmyk { (tj::TJPF_TJPF_CMYK, 4) } else { (tj::TJPF_TJPF_RGB, 3) };
        let pitch = width as usize * channels;
        let mut out = vec![0u8; pitch * height as usize];
        let pitch_c = libc::c_int::try_from(pitch).map_err(|_| format!("rows of {pitch} bytes"))?;
        // SAFETY: `out` holds `height` rows of `pitch` bytes, what a picture of the size the
        // header gave needs in `format` (the call reads the same header of the same bytes again);
        // `bytes` is valid for `len` bytes and only read.
        let rc = unsafe { tj::tj3Decompress8(h.0, bytes.as_ptr(), len, out.as_mut_ptr(), pitch_c, format as libc::c_int) };
        h.check(rc)?;
        Ok(if cmyk { cmyk_to_rgb(&out) } else { out })
    }
}

/// Decodes `bytes` to packed RGB8 rows: [`Header::read`], then [`Header::decode`]: (width,
/// height, pixels).
#[cfg(test)]
fn decode_rgb(bytes: &[u8], max_pixels: u64) -> Result<(u32, u32, Vec<u8>), String> {
    let header = Header::read(bytes, max_pixels)?;
    let (width, height) = header.size();
    Ok((width, height, header.decode()?))
}

/// OpenCV's CMYK to RGB (imgcodecs `icvCvt_CMYK2BGR_8u_C4C3R`), on libjpeg-turbo's CMYK samples
/// (Adobe's inverted convention, as libjpeg stores them): each of C, M, Y becomes
/// `k - ((255 - v) * k >> 8)`.
fn cmyk_to_rgb(cmyk: &[u8]) -> Vec<u8> {
    let mix = |v: u8, k: u8| (i32::from(k) - (((255 - i32::from(v)) * i32::from(k)) >> 8)) as u8;
    cmyk.chunks_exact(4).flat_map(|p| [mix(p[0], p[3]), mix(p[1], p[3]), mix(p[2], p[3])]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 4:2:0 JPEG of a 37x21 gradient (the `image` crate's encoder, quality 90).
    fn jpeg() -> Vec<u8> {
        let img = image::RgbImage::from_fn(37, 21, |x, y| image::Rgb([(x * 7) as u8, (y * 12) as u8, ((x + y) * 5) as u8]));
        let mut buf = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut buf, 90).encode_image(&img).unwrap();
        buf
    }

    #[test]
    fn decodes_packed_rgb_rows_of_the_headers_size() {
        let (w, h, rgb) = decode_rgb(&jpeg(), 1 << 20).unwrap();
        assert_eq!((w, h, rgb.len()), (37, 21, 37 * 21 * 3));
        // the gradient survives the round trip: the right column is redder than the left
        assert!(rgb[36 * 3] > rgb[0] + 150, "{} {}", rgb[36 * 3], rgb[0]);
    }

    #[test]
    fn data_decoded_through_with_a_warning_gives_the_same_picture() {
        // junk between the scan and the end-of-image marker: libjpeg-turbo warns ("extraneous
        // bytes before marker 0xd9") and decodes every pixel, as OpenCV accepts it
        let good = jpeg();
        let mut junk = good[..good.len() - 2].to_vec();
        junk.extend_from_slice(&[0x00, 0x11, 0x22, 0xFF, 0xD9]);
        assert_eq!(decode_rgb(&junk, 1 << 20).unwrap(), decode_rgb(&good, 1 << 20).unwrap());
    }

    #[test]
    fn garbage_is_an_error_with_libjpeg_turbos_reason() {
        let mut cut = jpeg();
        cut.truncate(20);
        let e = decode_rgb(&cut, 1 << 20).unwrap_err();
        assert!(!e.is_empty());
        assert!(decode_rgb(b"not a jpeg", 1 << 20).is_err());
    }

    #[test]
    fn cmyk_converts_as_opencv() {
        // k - ((255 - v) * k >> 8) per channel (imgcodecs utils.cpp): white ink-free (255, k 255)
        // stays 255; k = 0 is black whatever the inks; v = 0 with k = 200 gives 200 - 199 = 1
        assert_eq!(cmyk_to_rgb(&[255, 255, 255, 255, 9, 99, 199, 0, 0, 128, 255, 200]), [255, 255, 255, 0, 0, 0, 1, 101, 200]);
    }
}
