//! Video through GStreamer (feature `gstreamer`): pipelines for RTSP cameras, video files, V4L2
//! cameras and any URI, each ending in an `appsink` of packed RGB frames; the decoder element
//! chosen per codec (NVIDIA's where present and asked for, else software); and [`VideoReader`],
//! the frames of a video file one by one for `detect` and `eval`. Knows nothing of the agent.
//!
//! Pipelines (`{decoder}` picked by [`pick_decoder`] once the codec is known):
//!
//! ```text
//! rtsp:  rtspsrc ~> rtph26Xdepay ! h26Xparse ! {decoder} ! videoconvert ! appsink(RGB)
//! file:  filesrc ! parsebin ~> {decoder} ! videoconvert ! appsink(RGB)
//! uri:   urisourcebin ~> parsebin ~> {decoder} ! videoconvert ! appsink(RGB)
//! v4l2:  v4l2src ! capsfilter ! decodebin ~> videoconvert ! appsink(RGB)
//! ```
//!
//! (`~>`: linked when the pad appears.) Codecs other than H.264/H.265 go through a `decodebin`
//! (GStreamer's own choice of decoder). The appsink never blocks the stream on its own: its
//! callback hands each frame on at once (dropping is the caller's policy), or, for a lossless
//! reader, waits for the caller.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use gstreamer as gst;
use gstreamer_app as gst_app;
use gstreamer_video as gst_video;

use gst::prelude::*;
use gst_video::prelude::*;

/// Why a video could not be opened or read.
#[derive(Debug, thiserror::Error)]
pub enum MediaError {
    #[error("cannot initialise GStreamer: {0}")]
    Init(String),
    #[error("GStreamer element `{0}` is not installed (Debian: {1})")]
    MissingElement(String, &'static str),
    #[error("cannot build the GStreamer pipeline: {0}")]
    Build(String),
    #[error("{0}")]
    Stream(String),
}

/// Initialises GStreamer (once; later calls are cheap).
pub fn init() -> Result<(), MediaError> {
    gst::init().map_err(|e| MediaError::Init(e.to_string()))
}

/// Which decoder family to prefer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecoderPref {
    Auto,
    Cpu,
    Nvdec,
    Nvv4l2,
}

/// The codecs whose decoder is chosen here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    H264,
    H265,
}

impl Codec {
    /// From an encoded stream's caps name (`video/x-h264`) or an RTP `encoding-name` (`H264`).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "video/x-h264" | "H264" => Some(Self::H264),
            "video/x-h265" | "H265" => Some(Self::H265),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::H264 => "h264",
            Self::H265 => "h265",
        }
    }

    fn software(self) -> &'static str {
        match self {
            Self::H264 => "avdec_h264",
            Self::H265 => "avdec_h265",
        }
    }

    fn nvdec(self) -> &'static str {
        match self {
            Self::H264 => "nvh264dec",
            Self::H265 => "nvh265dec",
        }
    }

    fn parser(self) -> &'static str {
        match self {
            Self::H264 => "h264parse",
            Self::H265 => "h265parse",
        }
    }

    fn depayloader(self) -> &'static str {
        match self {
            Self::H264 => "rtph264depay",
            Self::H265 => "rtph265depay",
        }
    }
}

/// The decoder element chosen for a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecoderPick {
    /// The element used.
    pub element: String,
    /// Elements looked for before it and not installed.
    pub missing: Vec<String>,
}

impl DecoderPick {
    /// Whether a hardware decoder was looked for and the software one runs instead.
    pub fn fell_back(&self) -> bool {
        !self.missing.is_empty()
    }
}

/// Whether GStreamer has an element factory of this name (plugins load at run time).
pub fn element_exists(name: &str) -> bool {
    gst::ElementFactory::find(name).is_some()
}

/// `auto`: `nvv4l2decoder` (Jetson), else NVDEC, else software; `nvdec` / `nvv4l2`: that
/// element, else software; `cpu`: software.
pub fn pick_decoder(pref: DecoderPref, codec: Codec) -> DecoderPick {
    pick_with(pref, codec, element_exists)
}

fn pick_with(pref: DecoderPref, codec: Codec, exists: impl Fn(&str) -> bool) -> DecoderPick {
    let wanted: &[&str] = match pref {
        DecoderPref::Auto => &["nvv4l2decoder", codec.nvdec()],
        DecoderPref::Cpu => &[],
        DecoderPref::Nvdec => &[codec.nvdec()],
        DecoderPref::Nvv4l2 => &["nvv4l2decoder"],
    };
    let mut missing = Vec::new();
    for w in wanted {
        if exists(w) {
            return DecoderPick { element: w.to_string(), missing };
        }
        missing.push(w.to_string());
    }
    DecoderPick { element: codec.software().to_string(), missing }
}

/// Where the frames come from.
#[derive(Debug, Clone)]
pub enum Input {
    Rtsp { url: String, tcp: bool, latency_ms: u32, username: Option<String>, password: Option<String> },
    File { path: PathBuf },
    V4l2 { device: PathBuf, width: Option<u32>, height: Option<u32>, fps: Option<u32> },
    Uri { uri: String },
}

/// A decoded frame: packed RGB rows (no row padding).
#[derive(Debug)]
pub struct Frame {
    pub width: u32,
    pub height: u32,
    pub data: Vec<u8>,
    /// Presentation timestamp (ns).
    pub pts_ns: Option<u64>,
}

/// What a frame callback tells the stream.
#[derive(Debug, PartialEq, Eq)]
pub enum FrameFlow {
    Continue,
    /// Stop: the stream errors out (its owner is tearing it down).
    Stop,
}

/// Told the decoder chosen for a codec.
pub type DecoderCallback = dyn Fn(Codec, &DecoderPick) + Send + Sync;

/// Called on GStreamer's streaming threads.
pub struct Callbacks {
    /// Each decoded frame.
    pub on_frame: Box<dyn Fn(Frame) -> FrameFlow + Send + Sync>,
    /// The decoder chosen, once the codec is known (not called for codecs a `decodebin` takes).
    pub on_decoder: Box<DecoderCallback>,
}

/// How the appsink runs.
#[derive(Debug, Clone, Copy)]
pub struct SinkMode {
    /// Render at the stream's clock (a file played like a camera) or as fast as it decodes.
    pub sync: bool,
    /// The frame callback may wait (a reader that must see every frame); otherwise the appsink
    /// drops what its callback has not taken (`max-buffers` 1, `drop`).
    pub lossless: bool,
}

fn make(name: &str) -> Result<gst::Element, MediaError> {
    gst::ElementFactory::make(name).build().map_err(|_| MediaError::MissingElement(name.to_string(), package_of(name)))
}

fn package_of(name: &str) -> &'static str {
    match name {
        "avdec_h264" | "avdec_h265" => "gstreamer1.0-libav",
        "rtspsrc" | "rtph264depay" | "rtph265depay" | "v4l2src" => "gstreamer1.0-plugins-good",
        "h264parse" | "h265parse" | "nvh264dec" | "nvh265dec" => "gstreamer1.0-plugins-bad (NVDEC also needs the NVIDIA driver)",
        "nvv4l2decoder" => "NVIDIA JetPack's GStreamer plugins",
        _ => "gstreamer1.0-plugins-base",
    }
}

fn build_err(e: impl std::fmt::Display) -> MediaError {
    MediaError::Build(e.to_string())
}

/// Builds (not starts) the pipeline for `input`.
pub fn build(input: &Input, pref: DecoderPref, mode: SinkMode, cb: Callbacks) -> Result<gst::Pipeline, MediaError> {
    init()?;
    let pipeline = gst::Pipeline::new();
    let convert = make("videoconvert")?;
    let caps = gst_video::VideoCapsBuilder::new().format(gst_video::VideoFormat::Rgb).build();
    let on_frame = cb.on_frame;
    let sink = gst_app::AppSink::builder()
        .caps(&caps)
        .max_buffers(1)
        .drop(!mode.lossless)
        .sync(mode.sync)
        .callbacks(
            gst_app::AppSinkCallbacks::builder()
                .new_sample(move |sink| {
                    let sample = sink.pull_sample().map_err(|_| gst::FlowError::Eos)?;
                    let frame = frame_of(&sample).map_err(|e| {
                        // the stream's error says why, not only GStreamer's "internal data stream error"
                        let msg = gst::message::Error::builder(gst::StreamError::Format, &e.to_string()).src(sink).build();
                        let _ = sink.post_message(msg);
                        gst::FlowError::Error
                    })?;
                    match on_frame(frame) {
                        FrameFlow::Continue => Ok(gst::FlowSuccess::Ok),
                        FrameFlow::Stop => Err(gst::FlowError::Flushing),
                    }
                })
                .build(),
        )
        .build();
    pipeline.add_many([&convert, sink.upcast_ref()]).map_err(build_err)?;
    convert.link(&sink).map_err(build_err)?;
    let on_decoder: Arc<DecoderCallback> = Arc::from(cb.on_decoder);
    let tail = convert.static_pad("sink").ok_or_else(|| build_err("videoconvert has no sink pad"))?;

    match input {
        Input::Rtsp { url, tcp, latency_ms, username, password } => {
            let src = make("rtspsrc")?;
            src.set_property("location", url.as_str());
            src.set_property("latency", *latency_ms);
            src.set_property_from_str("protocols", if *tcp { "tcp" } else { "udp" });
            if let Some(u) = username {
                src.set_property("user-id", u.as_str());
            }
            if let Some(p) = password {
                src.set_property("user-pw", p.as_str());
            }
            pipeline.add(&src).map_err(build_err)?;
            let weak = pipeline.downgrade();
            src.connect_pad_added(move |_, pad| {
                let Some(pipeline) = weak.upgrade() else { return };
                let caps = pad.current_caps().unwrap_or_else(|| pad.query_caps(None));
                let Some(s) = caps.structure(0) else { return };
                let media = s.get::<&str>("media").unwrap_or("");
                let codec = s.get::<&str>("encoding-name").ok().and_then(Codec::from_name);
                let r = match codec {
                    Some(codec) if media == "video" => link_encoded(&pipeline, pad, codec, true, pref, &tail, &*on_decoder),
                    _ => discard(&pipeline, pad),
                };
                if let Err(e) = r {
                    post_error(&pipeline, &e);
                }
            });
        }
        Input::File { path } => {
            let src = make("filesrc")?;
            src.set_property("location", path.to_string_lossy().as_ref());
            let parse = make("parsebin")?;
            pipeline.add_many([&src, &parse]).map_err(build_err)?;
            src.link(&parse).map_err(build_err)?;
            connect_parsed(&pipeline, &parse, pref, tail, on_decoder);
        }
        Input::Uri { uri } => {
            let src = make("urisourcebin")?;
            src.set_property("uri", uri.as_str());
            let parse = make("parsebin")?;
            pipeline.add_many([&src, &parse]).map_err(build_err)?;
            let parse_sink = parse.static_pad("sink").ok_or_else(|| build_err("parsebin has no sink pad"))?;
            let weak = pipeline.downgrade();
            src.connect_pad_added(move |_, pad| {
                if parse_sink.is_linked() {
                    if let Some(p) = weak.upgrade() {
                        let _ = discard(&p, pad);
                    }
                    return;
                }
                if let Err(e) = pad.link(&parse_sink) {
                    if let Some(p) = weak.upgrade() {
                        post_error(&p, &build_err(format!("cannot link the URI's stream: {e:?}")));
                    }
                }
            });
            connect_parsed(&pipeline, &parse, pref, tail, on_decoder);
        }
        Input::V4l2 { device, width, height, fps } => {
            let src = make("v4l2src")?;
            src.set_property("device", device.to_string_lossy().as_ref());
            let filter = make("capsfilter")?;
            let mut caps = gst::Caps::new_empty();
            for name in ["video/x-raw", "image/jpeg"] {
                let mut b = gst::Structure::builder(name);
                if let (Some(w), Some(h)) = (width, height) {
                    b = b.field("width", *w as i32).field("height", *h as i32);
                }
                if let Some(f) = fps {
                    b = b.field("framerate", gst::Fraction::new(*f as i32, 1));
                }
                caps.get_mut().ok_or_else(|| build_err("caps not writable"))?.append_structure(b.build());
            }
            filter.set_property("caps", &caps);
            let decode = make("decodebin")?;
            pipeline.add_many([&src, &filter, &decode]).map_err(build_err)?;
            gst::Element::link_many([&src, &filter, &decode]).map_err(build_err)?;
            connect_raw(&pipeline, &decode, tail);
        }
    }
    Ok(pipeline)
}

/// Links `parsebin`'s video pads to a decoder (H.264/H.265: ours; others: a `decodebin`).
fn connect_parsed(pipeline: &gst::Pipeline, parse: &gst::Element, pref: DecoderPref, tail: gst::Pad, on_decoder: Arc<DecoderCallback>) {
    let weak = pipeline.downgrade();
    parse.connect_pad_added(move |_, pad| {
        let Some(pipeline) = weak.upgrade() else { return };
        let caps = pad.current_caps().unwrap_or_else(|| pad.query_caps(None));
        let Some(name) = caps.structure(0).map(|s| s.name().to_string()) else { return };
        let r = if tail.is_linked() || !name.starts_with("video/") {
            discard(&pipeline, pad)
        } else if let Some(codec) = Codec::from_name(&name) {
            link_encoded(&pipeline, pad, codec, false, pref, &tail, &*on_decoder)
        } else {
            make("decodebin").and_then(|d| {
                pipeline.add(&d).map_err(build_err)?;
                d.sync_state_with_parent().map_err(build_err)?;
                let sink = d.static_pad("sink").ok_or_else(|| build_err("decodebin has no sink pad"))?;
                pad.link(&sink).map_err(|e| build_err(format!("{e:?}")))?;
                connect_raw(&pipeline, &d, tail.clone());
                Ok(())
            })
        };
        if let Err(e) = r {
            post_error(&pipeline, &e);
        }
    });
}

/// Links a `decodebin`'s first raw video pad to the converter.
fn connect_raw(pipeline: &gst::Pipeline, decode: &gst::Element, tail: gst::Pad) {
    let weak = pipeline.downgrade();
    decode.connect_pad_added(move |_, pad| {
        let Some(pipeline) = weak.upgrade() else { return };
        let caps = pad.current_caps().unwrap_or_else(|| pad.query_caps(None));
        let video = caps.structure(0).is_some_and(|s| s.name().starts_with("video/"));
        if !video || tail.is_linked() {
            let _ = discard(&pipeline, pad);
            return;
        }
        if let Err(e) = pad.link(&tail) {
            post_error(&pipeline, &build_err(format!("cannot link the decoded video: {e:?}")));
        }
    });
}

/// `[depayloader !] parser ! decoder` between `pad` and the converter.
fn link_encoded(
    pipeline: &gst::Pipeline,
    pad: &gst::Pad,
    codec: Codec,
    rtp: bool,
    pref: DecoderPref,
    tail: &gst::Pad,
    on_decoder: &DecoderCallback,
) -> Result<(), MediaError> {
    if tail.is_linked() {
        return discard(pipeline, pad);
    }
    let pick = pick_decoder(pref, codec);
    let mut chain = Vec::new();
    if rtp {
        chain.push(make(codec.depayloader())?);
    }
    chain.push(make(codec.parser())?);
    chain.push(make(&pick.element)?);
    pipeline.add_many(&chain).map_err(build_err)?;
    gst::Element::link_many(&chain).map_err(build_err)?;
    let last = chain.last().and_then(|e| e.static_pad("src")).ok_or_else(|| build_err("decoder has no src pad"))?;
    last.link(tail).map_err(|e| build_err(format!("cannot link {} to videoconvert: {e:?}", pick.element)))?;
    for e in &chain {
        e.sync_state_with_parent().map_err(build_err)?;
    }
    let first = chain[0].static_pad("sink").ok_or_else(|| build_err("no sink pad"))?;
    pad.link(&first).map_err(|e| build_err(format!("cannot link the {} stream: {e:?}", codec.name())))?;
    on_decoder(codec, &pick);
    Ok(())
}

/// Sends a pad nobody uses (audio, a second video) into a `fakesink`.
fn discard(pipeline: &gst::Pipeline, pad: &gst::Pad) -> Result<(), MediaError> {
    let sink = make("fakesink")?;
    sink.set_property("sync", false);
    sink.set_property("async", false);
    pipeline.add(&sink).map_err(build_err)?;
    sink.sync_state_with_parent().map_err(build_err)?;
    let sp = sink.static_pad("sink").ok_or_else(|| build_err("fakesink has no sink pad"))?;
    pad.link(&sp).map(|_| ()).map_err(|e| build_err(format!("{e:?}")))
}

fn post_error(pipeline: &gst::Pipeline, e: &MediaError) {
    let msg = gst::message::Error::builder(gst::CoreError::Negotiation, &e.to_string()).build();
    let _ = pipeline.post_message(msg);
}

/// Largest width or height of a frame taken from a stream (8K UHD is 7680 wide).
pub const MAX_FRAME_SIDE: u32 = 8192;
/// Largest frame taken from a stream, in pixels (8K UHD, 7680x4320, is 33.2 million): its RGB
/// copy is at most 100 MB.
pub const MAX_FRAME_PIXELS: u64 = 7680 * 4320;

/// Refuses a frame size a stream should never have, before its RGB copy is allocated (a hostile
/// file or camera can declare any size).
pub fn check_frame_size(width: u32, height: u32) -> Result<(), MediaError> {
    if width == 0 || height == 0 || width > MAX_FRAME_SIDE || height > MAX_FRAME_SIDE || width as u64 * height as u64 > MAX_FRAME_PIXELS {
        return Err(MediaError::Stream(format!(
            "frame {width}x{height} is outside the accepted sizes (sides 1..={MAX_FRAME_SIDE}, at most {MAX_FRAME_PIXELS} pixels)"
        )));
    }
    Ok(())
}

/// Copies a sample's RGB picture out, row by row (GStreamer pads rows to 4 bytes).
fn frame_of(sample: &gst::Sample) -> Result<Frame, MediaError> {
    let buffer = sample.buffer().ok_or_else(|| MediaError::Stream("sample without a buffer".into()))?;
    let caps = sample.caps().ok_or_else(|| MediaError::Stream("sample without caps".into()))?;
    let info = gst_video::VideoInfo::from_caps(caps).map_err(|e| MediaError::Stream(e.to_string()))?;
    check_frame_size(info.width(), info.height())?;
    let vf = gst_video::VideoFrameRef::from_buffer_ref_readable(buffer, &info).map_err(|e| MediaError::Stream(e.to_string()))?;
    let (w, h) = (vf.width() as usize, vf.height() as usize);
    let stride = vf.plane_stride()[0] as usize;
    let plane = vf.plane_data(0).map_err(|e| MediaError::Stream(e.to_string()))?;
    let row = w * 3;
    if stride < row || plane.len() < stride * h.saturating_sub(1) + row {
        return Err(MediaError::Stream(format!("frame {w}x{h}: plane of {} bytes, stride {stride}", plane.len())));
    }
    let mut data = Vec::with_capacity(row * h);
    for y in 0..h {
        data.extend_from_slice(&plane[y * stride..y * stride + row]);
    }
    Ok(Frame { width: w as u32, height: h as u32, data, pts_ns: buffer.pts().map(|t| t.nseconds()) })
}

/// The text of a bus error: the element, the error and GStreamer's debug detail.
pub fn error_text(err: &gst::message::Error) -> String {
    let src = err.src().map(|s| s.name().to_string()).unwrap_or_default();
    match err.debug() {
        Some(d) => format!("{src}: {} ({})", err.error(), d.lines().next().unwrap_or_default()),
        None => format!("{src}: {}", err.error()),
    }
}

/// The frames of a video file, in order, none dropped (`detect`, `eval`).
pub struct VideoReader {
    pipeline: gst::Pipeline,
    frames: Option<Receiver<Frame>>,
    decoder: Arc<std::sync::Mutex<Option<String>>>,
    eos: bool,
    done: bool,
}

impl VideoReader {
    /// Opens a file with the software decoder (`pref` to ask for another).
    pub fn open(path: &Path, pref: DecoderPref) -> Result<Self, MediaError> {
        if !path.is_file() {
            return Err(MediaError::Stream(format!("{} is not a file", path.display())));
        }
        let (tx, rx) = sync_channel::<Frame>(4);
        let decoder = Arc::new(std::sync::Mutex::new(None));
        let d = decoder.clone();
        let cb = Callbacks {
            on_frame: Box::new(move |f| if tx.send(f).is_ok() { FrameFlow::Continue } else { FrameFlow::Stop }),
            on_decoder: Box::new(move |_, pick| {
                if let Ok(mut d) = d.lock() {
                    *d = Some(pick.element.clone());
                }
            }),
        };
        let pipeline = build(&Input::File { path: path.to_path_buf() }, pref, SinkMode { sync: false, lossless: true }, cb)?;
        pipeline.set_state(gst::State::Playing).map_err(|e| MediaError::Stream(format!("cannot play {}: {e}", path.display())))?;
        Ok(Self { pipeline, frames: Some(rx), decoder, eos: false, done: false })
    }

    /// The decoder element in use (known after the first frame).
    pub fn decoder(&self) -> Option<String> {
        self.decoder.lock().ok().and_then(|d| d.clone())
    }
}

impl Iterator for VideoReader {
    type Item = Result<Frame, MediaError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let bus = self.pipeline.bus()?;
        loop {
            let rx = self.frames.as_ref()?;
            if self.eos {
                // every frame was rendered before the end of stream reached the sink
                let f = rx.try_recv().ok();
                self.done = f.is_none();
                return f.map(Ok);
            }
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(f) => return Some(Ok(f)),
                Err(RecvTimeoutError::Disconnected) => {
                    self.done = true;
                    return None;
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
            while let Some(msg) = bus.pop_filtered(&[gst::MessageType::Error, gst::MessageType::Eos]) {
                match msg.view() {
                    gst::MessageView::Error(e) => {
                        self.done = true;
                        return Some(Err(MediaError::Stream(error_text(e))));
                    }
                    _ => self.eos = true,
                }
            }
        }
    }
}

impl Drop for VideoReader {
    fn drop(&mut self) {
        // the receiver goes first, so that a streaming thread waiting to hand a frame over ends
        self.frames = None;
        let _ = self.pipeline.set_state(gst::State::Null);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_sizes_beyond_8k_are_refused() {
        assert!(check_frame_size(1920, 1080).is_ok());
        assert!(check_frame_size(7680, 4320).is_ok());
        assert!(check_frame_size(8192, 4050).is_ok());
        assert!(check_frame_size(8192, 8192).is_err());
        assert!(check_frame_size(8193, 16).is_err());
        assert!(check_frame_size(0, 1080).is_err());
        assert!(check_frame_size(u32::MAX, u32::MAX).is_err());
    }

    #[test]
    fn decoder_choice_falls_back_to_software() {
        let none = |_: &str| false;
        let nv = |n: &str| n == "nvh264dec" || n == "nvh265dec";
        let jetson = |n: &str| n == "nvv4l2decoder";
        let p = pick_with(DecoderPref::Auto, Codec::H264, none);
        assert_eq!(p.element, "avdec_h264");
        assert_eq!(p.missing, vec!["nvv4l2decoder", "nvh264dec"]);
        assert!(p.fell_back());
        assert_eq!(pick_with(DecoderPref::Auto, Codec::H265, nv).element, "nvh265dec");
        assert_eq!(pick_with(DecoderPref::Auto, Codec::H265, jetson).element, "nvv4l2decoder");
        let p = pick_with(DecoderPref::Cpu, Codec::H265, nv);
        assert_eq!((p.element.as_str(), p.fell_back()), ("avdec_h265", false));
        let p = pick_with(DecoderPref::Nvv4l2, Codec::H264, nv);
        assert_eq!((p.element.as_str(), p.missing.clone()), ("avdec_h264", vec!["nvv4l2decoder".to_string()]));
        assert_eq!(pick_with(DecoderPref::Nvdec, Codec::H264, nv).element, "nvh264dec");
    }
}
