//! Decode + letterbox throughput of one video stream, as the agent does it (the decoder through
//! GStreamer, RGB out of the appsink, the reference letterbox on the CPU):
//!
//!     cargo run --release --features gstreamer --example video_bench -- CLIP.mp4 [IMGSZ] [cpu|nvdec|auto]
//!
//! The decoder defaults to the software one; `nvdec` asks for NVDEC (`nvh264dec`/`nvh265dec`),
//! and the element that decoded is printed.
//! Prints frames, decode-only fps (GStreamer's threads) and decode + letterbox fps (this thread
//! letterboxing every frame as it arrives), one stream at a time. `scripts/bench_video.sh`
//! makes the clips and runs it.

use std::time::Instant;

use yolo_edge::media::{DecoderPref, VideoReader};
use yolo_edge::vision::preprocess::{letterbox_fit, Fit};

type Error = Box<dyn std::error::Error>;

/// One pass over the clip: frames, their size, and frames per second.
struct Pass {
    frames: usize,
    size: (u32, u32),
    fps: f64,
    decoder: String,
}

/// One pass over the clip, letterboxing each frame or not.
fn pass(path: &std::path::Path, letterbox: Option<u32>, pref: DecoderPref) -> Result<Pass, Error> {
    let t = Instant::now();
    let (mut n, mut size) = (0usize, (0, 0));
    let mut reader = VideoReader::open(path, pref)?;
    for f in reader.by_ref() {
        let f = f?;
        size = (f.width, f.height);
        if let Some(imgsz) = letterbox {
            let img = image::RgbImage::from_raw(f.width, f.height, f.data).ok_or("frame of the wrong size")?;
            std::hint::black_box(letterbox_fit(&img, imgsz, Fit::Rect));
        }
        n += 1;
    }
    Ok(Pass { frames: n, size, fps: n as f64 / t.elapsed().as_secs_f64(), decoder: reader.decoder().unwrap_or_default() })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let path = std::path::PathBuf::from(args.get(1).ok_or("usage: video_bench CLIP [IMGSZ] [cpu|nvdec|auto]")?);
    let imgsz: u32 = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(640);
    let pref = match args.get(3).map(String::as_str) {
        None | Some("cpu") => DecoderPref::Cpu,
        Some("nvdec") => DecoderPref::Nvdec,
        Some("auto") => DecoderPref::Auto,
        Some(other) => return Err(format!("decoder `{other}`: expected cpu, nvdec or auto").into()),
    };
    // a first pass loads the plugins and warms the caches
    let Pass { frames: n, size, decoder, .. } = pass(&path, None, pref)?;
    let decode = median((0..3).map(|_| pass(&path, None, pref).map(|r| r.fps)).collect::<Result<_, _>>()?);
    let both = median((0..3).map(|_| pass(&path, Some(imgsz), pref).map(|r| r.fps)).collect::<Result<_, _>>()?);
    println!(
        "{} {}x{} ({decoder}): {n} frames; decode {decode:.1} fps; decode + letterbox to {imgsz} {both:.1} fps (median of 3)",
        path.display(),
        size.0,
        size.1
    );
    Ok(())
}
