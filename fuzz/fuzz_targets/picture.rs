//! Pictures from bytes (JPEG, PNG, BMP, WebP, EXIF orientation, the size limits), then the
//! letterbox: what the decode pool does with every picture (`preprocess::decode_image`, then
//! `preprocess::letterbox`); and the JPEG frame key the GPU decoder reads before nvJPEG sees the
//! file (`preprocess::jpeg_frame_key`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use yolo_edge::vision::preprocess::{decode_image, jpeg_frame_key, letterbox, DecodeLimits};

#[path = "common/decoder_panics.rs"]
mod decoder_panics;

fuzz_target!(init: decoder_panics::let_decoder_panics_unwind(), |data: &[u8]| {
    // the default limits but for the pixel count: 4 MP keeps each run short and still lets a
    // header claim far more than the file holds
    let limits = DecodeLimits { max_pixels: 4_000_000, ..DecodeLimits::default() };
    let _ = jpeg_frame_key(data);
    if let Ok(img) = decode_image(data, &limits) {
        let _ = letterbox(&img, 64);
    }
});
