//! Pictures from files to letterboxed batches, ahead of the thread that runs the model.
//!
//! A [`Feed`] reads, decodes and letterboxes on rayon's pool (one task per picture, sized to
//! the cores) in a thread of its own, and hands the pictures over in batches, in input order,
//! through a bounded channel: while the model runs one batch, the next ones are being decoded,
//! and when the model is the slower side the feed waits instead of piling pictures up. A batch
//! smaller than the cores is decoded together with the batches after it (a window of at least
//! as many pictures as there are threads), so batch 1 keeps every core busy too.
//!
//! Every picture carries the host time each of its stages took ([`StageTimes`]): what
//! `yolo-edge bench --mode e2e` reports as the CPU cost per picture.
//!
//! May use: [`super::preprocess`], rayon, the standard library.

use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use image::RgbImage;
use rayon::prelude::*;

use super::preprocess::{self, DecodeLimits, Fit, ImageError, LetterboxGeometry, Letterboxed};

/// Host time one picture spent in each stage before the model.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageTimes {
    /// Reading the file.
    pub read: Duration,
    /// Decoding it to RGB (with the bounds checks and EXIF orientation); for a JPEG left to the
    /// device's decoder, checking its header.
    pub decode: Duration,
    /// Resizing and padding to the network input.
    pub letterbox: Duration,
}

impl StageTimes {
    pub fn total(&self) -> Duration {
        self.read + self.decode + self.letterbox
    }
}

impl std::ops::AddAssign for StageTimes {
    fn add_assign(&mut self, o: Self) {
        self.read += o.read;
        self.decode += o.decode;
        self.letterbox += o.letterbox;
    }
}

/// A picture ready for the model.
#[derive(Debug)]
pub struct Picture {
    pub pixels: Pixels,
    /// The decoded picture, where [`FeedOptions::keep_decoded`] asked for it (to draw on).
    pub decoded: Option<RgbImage>,
}

/// A picture's pixels as the feed hands them over.
#[derive(Debug)]
pub enum Pixels {
    /// Decoded and letterboxed on the host.
    Letterboxed(Letterboxed),
    /// A JPEG whose header passed every check of the host decoder, left encoded for a decoder on
    /// the device ([`FeedOptions::jpeg_on_device`]); `geometry` is where it will sit in the input.
    Jpeg { bytes: Vec<u8>, geometry: LetterboxGeometry, fit: Fit },
}

impl Picture {
    /// Where the picture sits in the network input.
    pub fn geometry(&self) -> &LetterboxGeometry {
        match &self.pixels {
            Pixels::Letterboxed(lb) => &lb.geometry,
            Pixels::Jpeg { geometry, .. } => geometry,
        }
    }

    /// The letterboxed pixels, where the host made them.
    pub fn letterboxed(&self) -> Option<&Letterboxed> {
        match &self.pixels {
            Pixels::Letterboxed(lb) => Some(lb),
            Pixels::Jpeg { .. } => None,
        }
    }
}

/// One input of a [`Feed`]: its index in the input list, its path, and the picture or why there
/// is none.
#[derive(Debug)]
pub struct Prepared {
    pub index: usize,
    pub path: PathBuf,
    pub picture: Result<Picture, ImageError>,
    pub times: StageTimes,
}

/// How a [`Feed`] prepares and groups pictures.
#[derive(Debug, Clone, Copy)]
pub struct FeedOptions {
    /// Pictures per batch handed over (the last one may be smaller).
    pub batch: usize,
    /// Network input size and fit.
    pub imgsz: u32,
    pub fit: Fit,
    pub limits: DecodeLimits,
    /// Keep each decoded picture beside its letterboxed copy (pictures are then decoded on the
    /// host).
    pub keep_decoded: bool,
    /// Leave JPEGs encoded for a decoder on the device ([`Pixels::Jpeg`]) after checking their
    /// headers; other formats, and JPEGs with an EXIF orientation to apply, are decoded here.
    pub jpeg_on_device: bool,
    /// Batches decoded ahead of the one the model runs (at least 1).
    pub ahead: usize,
}

impl Default for FeedOptions {
    fn default() -> Self {
        Self { batch: 1, imgsz: 640, fit: Fit::Rect, limits: DecodeLimits::default(), keep_decoded: false, jpeg_on_device: false, ahead: 2 }
    }
}

/// Reads, decodes and letterboxes one file (or, for the device's decoder, checks a JPEG's
/// header), timing each stage.
pub fn prepare(path: &std::path::Path, o: &FeedOptions) -> (Result<Picture, ImageError>, StageTimes) {
    let mut t = StageTimes::default();
    let t0 = Instant::now();
    let bytes = preprocess::read_image_file(path, &o.limits);
    t.read = t0.elapsed();
    let bytes = match bytes {
        Ok(b) => b,
        Err(e) => return (Err(e), t),
    };
    let picture = picture_from_bytes(bytes, o, &mut t);
    (picture, t)
}

/// An encoded picture's bytes made ready for the model: a JPEG left encoded for the device's
/// decoder once its header passed every check ([`FeedOptions::jpeg_on_device`]), anything else
/// decoded and letterboxed here. Adds the time of each stage to `t`.
pub fn picture_from_bytes(bytes: Vec<u8>, o: &FeedOptions, t: &mut StageTimes) -> Result<Picture, ImageError> {
    if o.jpeg_on_device && !o.keep_decoded {
        let t1 = Instant::now();
        let header = preprocess::check_jpeg_header(&bytes, &o.limits);
        t.decode += t1.elapsed();
        match header {
            Ok((w, h, image::metadata::Orientation::NoTransforms)) => {
                let geometry = LetterboxGeometry::fit(w, h, o.imgsz, o.fit);
                return Ok(Picture { pixels: Pixels::Jpeg { bytes, geometry, fit: o.fit }, decoded: None });
            }
            // another format, or an orientation to apply: the host decodes it
            Ok(_) | Err(ImageError::NotJpeg) => {}
            Err(e) => return Err(e),
        }
    }
    let t1 = Instant::now();
    let decoded = preprocess::decode_image(&bytes, &o.limits);
    t.decode += t1.elapsed();
    decoded.map(|img| {
        let t2 = Instant::now();
        let letterboxed = preprocess::letterbox_fit(&img, o.imgsz, o.fit);
        t.letterbox += t2.elapsed();
        Picture { pixels: Pixels::Letterboxed(letterboxed), decoded: o.keep_decoded.then_some(img) }
    })
}

/// Letterboxed batches of pictures read from files, prepared ahead on rayon's pool; an iterator
/// of batches in input order. Dropping it stops the work (the pictures in flight are finished
/// and dropped).
pub struct Feed {
    rx: Option<Receiver<Vec<Prepared>>>,
    worker: Option<JoinHandle<()>>,
}

impl Feed {
    /// Starts preparing `paths` in batches of `o.batch` (an error only where no thread can be
    /// started).
    pub fn spawn(paths: Vec<PathBuf>, o: FeedOptions) -> std::io::Result<Feed> {
        let batch = o.batch.max(1);
        let threads = rayon::current_num_threads().max(1);
        // pictures decoded together: at least one per thread, whole batches
        let per_window = batch * threads.div_ceil(batch);
        // the window's batches plus `ahead` more may wait in the channel
        let (tx, rx) = sync_channel::<Vec<Prepared>>(per_window / batch + o.ahead.max(1));
        let worker = std::thread::Builder::new().name("picture-feed".into()).spawn(move || {
            let mut start = 0;
            for window in paths.chunks(per_window) {
                let mut prepared: Vec<Prepared> = window
                    .par_iter()
                    .enumerate()
                    .map(|(i, p)| {
                        let (picture, times) = prepare(p, &o);
                        Prepared { index: start + i, path: p.clone(), picture, times }
                    })
                    .collect();
                start += window.len();
                while !prepared.is_empty() {
                    let rest = prepared.split_off(batch.min(prepared.len()));
                    if tx.send(std::mem::replace(&mut prepared, rest)).is_err() {
                        return; // the consumer is gone
                    }
                }
            }
        })?;
        Ok(Feed { rx: Some(rx), worker: Some(worker) })
    }
}

impl Iterator for Feed {
    type Item = Vec<Prepared>;
    fn next(&mut self) -> Option<Vec<Prepared>> {
        self.rx.as_ref()?.recv().ok()
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        // closing the channel first makes the worker's next send fail, so the join is short
        drop(self.rx.take());
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_jpeg(dir: &std::path::Path, name: &str, w: u32, h: u32) -> PathBuf {
        let img = RgbImage::from_fn(w, h, |x, y| image::Rgb([(x * 7) as u8, (y * 5) as u8, 90]));
        let p = dir.join(name);
        img.save(&p).unwrap();
        p
    }

    #[test]
    fn batches_come_in_input_order_with_errors_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let mut paths = vec![];
        for i in 0..7 {
            paths.push(write_jpeg(dir.path(), &format!("{i}.jpg"), 64 + i * 8, 48));
        }
        let bad = dir.path().join("bad.jpg");
        std::fs::write(&bad, b"not a picture").unwrap();
        paths.insert(3, bad);
        paths.push(dir.path().join("missing.jpg"));
        let o = FeedOptions { batch: 3, imgsz: 64, ..FeedOptions::default() };
        let batches: Vec<Vec<Prepared>> = Feed::spawn(paths.clone(), o).unwrap().collect();
        assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), vec![3, 3, 3]);
        let flat: Vec<&Prepared> = batches.iter().flatten().collect();
        for (i, p) in flat.iter().enumerate() {
            assert_eq!((p.index, &p.path), (i, &paths[i]));
            let expect_ok = i != 3 && i != 8;
            assert_eq!(p.picture.is_ok(), expect_ok, "{i}: {:?}", p.picture.as_ref().err());
        }
        // the picture is the one `prepare` makes alone
        let (alone, _) = prepare(&paths[0], &o);
        assert_eq!(flat[0].picture.as_ref().unwrap().letterboxed().unwrap().pixels, alone.unwrap().letterboxed().unwrap().pixels);
        assert!(flat[0].picture.as_ref().unwrap().decoded.is_none());
        assert!(flat[0].times.decode > Duration::ZERO);
    }

    #[test]
    fn jpegs_for_the_device_are_checked_and_left_encoded() {
        let dir = tempfile::tempdir().unwrap();
        let jpg = write_jpeg(dir.path(), "a.jpg", 160, 90);
        let png = dir.path().join("b.png");
        RgbImage::from_pixel(40, 30, image::Rgb([1, 2, 3])).save(&png).unwrap();
        let cut = dir.path().join("cut.jpg");
        let b = std::fs::read(&jpg).unwrap();
        std::fs::write(&cut, &b[..b.len() / 2]).unwrap();
        let o = FeedOptions { imgsz: 64, jpeg_on_device: true, ..FeedOptions::default() };
        let (p, _) = prepare(&jpg, &o);
        match p.unwrap().pixels {
            Pixels::Jpeg { bytes, geometry, fit } => {
                assert_eq!(bytes, b);
                assert_eq!(geometry, LetterboxGeometry::fit(160, 90, 64, Fit::Rect));
                assert_eq!(fit, Fit::Rect);
            }
            Pixels::Letterboxed(_) => panic!("a plain JPEG is left for the device"),
        }
        // another format is decoded here; a truncated JPEG is the host decoder's error
        assert!(prepare(&png, &o).0.unwrap().letterboxed().is_some());
        assert!(prepare(&cut, &o).0.unwrap_err().to_string().contains("truncated"));
        // pictures kept for drawing are decoded here
        let keep = FeedOptions { keep_decoded: true, ..o };
        assert!(prepare(&jpg, &keep).0.unwrap().letterboxed().is_some());
    }

    #[test]
    fn dropping_a_feed_early_stops_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = write_jpeg(dir.path(), "a.jpg", 32, 32);
        let paths = vec![p; 10_000];
        let mut feed = Feed::spawn(paths, FeedOptions { batch: 1, imgsz: 32, keep_decoded: true, ..FeedOptions::default() }).unwrap();
        let first = feed.next().unwrap();
        assert!(first[0].picture.as_ref().unwrap().decoded.is_some());
        let t = Instant::now();
        drop(feed);
        // at most one window in flight is finished, not 10,000 pictures
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }
}
