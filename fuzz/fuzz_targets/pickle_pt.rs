//! `.pt` checkpoints: the zip reader, the pickle VM and the tensor views, through
//! `Checkpoint::from_bytes` (what `Checkpoint::load` runs on a file's bytes). An input starting
//! with `PK` is a whole archive; anything else is a `data.pkl`, wrapped in a torch.save-like
//! archive with a few storages, so the fuzzer can work on the pickle without the zip around it.
#![no_main]

use std::io::Write;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use yolo_edge::weights::Checkpoint;
use zip::write::SimpleFileOptions;

/// Storages `archive/data/0` .. `archive/data/{STORAGES-1}` of the wrapping archive.
const STORAGES: u8 = 8;

fn archive(pickle: &[u8]) -> Vec<u8> {
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let stored = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    z.start_file("archive/data.pkl", stored).unwrap();
    z.write_all(pickle).unwrap();
    for i in 0..STORAGES {
        z.start_file(format!("archive/data/{i}"), stored).unwrap();
        // 64 f32 (or 32 f64, 128 f16) per storage: enough for the views of small tensors
        z.write_all(&[i.wrapping_mul(37).wrapping_add(1); 256]).unwrap();
    }
    z.finish().unwrap().into_inner()
}

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz.pt");
    if data.starts_with(b"PK") {
        let _ = Checkpoint::from_bytes(path, data);
    } else {
        let _ = Checkpoint::from_bytes(path, &archive(data));
    }
});
