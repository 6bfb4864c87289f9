//! safetensors checkpoints (header JSON, metadata, tensor extents and dtypes), through
//! `Checkpoint::from_bytes`, the reader `Checkpoint::load` runs on a file's bytes.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use yolo_edge::weights::Checkpoint;

fuzz_target!(|data: &[u8]| {
    // `PK` selects the `.pt` reader, fuzzed by `pickle_pt`
    if data.starts_with(b"PK") {
        return;
    }
    let _ = Checkpoint::from_bytes(Path::new("fuzz.safetensors"), data);
});
