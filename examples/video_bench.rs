//! Decode + letterbox throughput of one video stream on the CPU, as the agent does it (the
//! software decoder through GStreamer, RGB out of the appsink, the reference letterbox):
//!
//!     cargo run --release --features gstreamer --example video_bench -- CLIP.mp4 [IMGSZ]
//!
//! Prints frames, decode-only fps (GStreamer's threads) and decode + letterbox fps (this thread
//! letterboxing every frame as it arrives), one stream at a time. `scripts/bench_video.sh`
//! makes the clips and runs it.

use std::time::Instant;

use yolo_edge::media::{DecoderPref, VideoReader};
use yolo_edge::vision::preprocess::{letterbox_fit, Fit};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = std::path::PathBuf::from(args.get(1).ok_or("usage: video_bench CLIP [IMGSZ]")?);
    let imgsz: u32 = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(640);
    // decode only
    let t = Instant::now();
    let mut n = 0usize;
    let mut size = (0, 0);
    for f in VideoReader::open(&path, DecoderPref::Cpu)? {
        let f = f?;
        size = (f.width, f.height);
        n += 1;
    }
    let decode_s = t.elapsed().as_secs_f64();
    // decode + letterbox
    let t = Instant::now();
    let mut m = 0usize;
    for f in VideoReader::open(&path, DecoderPref::Cpu)? {
        let f = f?;
        let img = image::RgbImage::from_raw(f.width, f.height, f.data).ok_or("frame of the wrong size")?;
        let lb = letterbox_fit(&img, imgsz, Fit::Rect);
        std::hint::black_box(&lb);
        m += 1;
    }
    let both_s = t.elapsed().as_secs_f64();
    println!(
        "{} {}x{}: {n} frames; decode {:.1} fps; decode + letterbox to {imgsz} {:.1} fps",
        path.display(),
        size.0,
        size.1,
        n as f64 / decode_s,
        m as f64 / both_s
    );
    Ok(())
}
