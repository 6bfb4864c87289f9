//! Pictures from bytes (JPEG, PNG, BMP, WebP, EXIF orientation, the size limits), then the
//! letterbox: what the decode pool does with every picture (`preprocess::decode_image`, then
//! `preprocess::letterbox`); and what the GPU decoder reads before nvJPEG sees the file: the
//! header check (`preprocess::check_jpeg_header`, which must refuse every JPEG `decode_image`
//! refuses before decoding, and read the size of every JPEG it decodes) and the JPEG frame key
//! (`preprocess::jpeg_frame_key`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use yolo_edge::vision::preprocess::{check_jpeg_header, decode_image, jpeg_frame_key, letterbox, DecodeLimits, ImageError, Orientation};

#[path = "common/decoder_panics.rs"]
mod decoder_panics;

fuzz_target!(init: decoder_panics::let_decoder_panics_unwind(), |data: &[u8]| {
    // the default limits but for the pixel count: 4 MP keeps each run short and still lets a
    // header claim far more than the file holds
    let limits = DecodeLimits { max_pixels: 4_000_000, ..DecodeLimits::default() };
    let _ = jpeg_frame_key(data);
    let header = check_jpeg_header(data, &limits);
    let decoded = decode_image(data, &limits);
    if let (Ok((w, h, o)), Ok(img)) = (&header, &decoded) {
        // the size the check read is the decoded picture's, turned by its orientation
        let turned = matches!(o, Orientation::Rotate90 | Orientation::Rotate270 | Orientation::Rotate90FlipH | Orientation::Rotate270FlipH);
        let want = if turned { (*h, *w) } else { (*w, *h) };
        assert_eq!(img.dimensions(), want, "check_jpeg_header read {w}x{h} ({o:?})");
    }
    if decoded.is_ok() {
        assert!(matches!(header, Ok(_) | Err(ImageError::NotJpeg)), "decode_image took a picture the header check refused: {header:?}");
    }
    if let Ok(img) = decoded {
        let _ = letterbox(&img, 64);
    }
});
