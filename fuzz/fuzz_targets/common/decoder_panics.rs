//! A panic inside an image decoder crate unwinds into `decode_image`'s `catch_unwind` and becomes
//! that input's `ImageError::Corrupt` (the known case, zune-jpeg 0.5.15's multiply overflow, is
//! a `vision::preprocess` test and `fuzz/regressions/picture/`). libFuzzer's panic hook aborts on
//! every panic, caught or not, so the targets that decode pictures install this hook on top of
//! it: a panic located in a decoder crate is logged (one line, with its location, so that a
//! long run shows which decoder bugs it met) and unwinds to that catch; every other panic goes to
//! libFuzzer's hook and aborts as before.

/// Path parts of the decoder crates' sources, as panic locations name them.
const DECODER_CRATES: &[&str] = &["/zune-jpeg-", "/zune-core-", "/png-", "/image-webp-", "/image-0.", "/fdeflate-"];

pub fn let_decoder_panics_unwind() {
    let libfuzzer_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let in_decoder = info.location().is_some_and(|l| DECODER_CRATES.iter().any(|c| l.file().contains(c)));
        match info.location() {
            Some(l) if in_decoder => eprintln!("decoder panic caught by decode_image: {}:{}", l.file(), l.line()),
            _ => libfuzzer_hook(info),
        }
    }));
}
