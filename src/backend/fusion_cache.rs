//! The fused-convolution decisions of earlier processes (`[tuning] cudnn_fusion_cache`), kept in
//! a file so that a restart builds only the plans it kept instead of timing several per shape.
//!
//! With `cudnn_fusion` on, each new convolution shape is decided by building and timing the
//! fused graph's first plans (`backend::cuda::cudnn_fused`): about 0.2 s per plan build on an
//! H100, 17-20 s for yolov9t's first pass at batch 1 and 22-60 s for yolov9c in a fresh process,
//! two minutes for the planner's start-up with yolov9t (BENCHMARKS.md, "The fusion cache"). The outcome,
//! which engine config of cuDNN's heuristics ran fastest or that the shape is not fused, holds
//! for the same GPU model, cuDNN version and yolo-edge version (whose graphs and rules made it),
//! so it is kept here as one JSON line per decision:
//!
//! ```json
//! {"target":{"device":"NVIDIA H100 80GB HBM3","cudnn":91900,"yolo_edge":"0.1.0"},"shape":{...},"fused":{"position":1,"engine":12}}
//! ```
//!
//! The file is read once, on the first decision, at most [`MAX_BYTES`] of it; lines that do not
//! parse (a cut write, an edit by hand) are skipped and counted, the others of another target
//! kept but unused. Decisions are appended as they are made, so that several processes may share
//! the file and a crash loses at most the line being written. A recorded engine config is checked
//! again when its plan is built (the heuristics' order must still name the same engine); where it
//! does not build, the shape is decided anew and the new decision appended (the last line of a
//! shape wins).
//!
//! May use: serde, the standard library. Knows nothing of cuDNN itself: the CUDA module gives it
//! plain values.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Most bytes of the file read (about 40,000 decisions); decisions past it are not appended.
pub const MAX_BYTES: u64 = 8 << 20;

/// What a decision holds for: the GPU model and the cuDNN version whose heuristics and kernels
/// made it, and the version of yolo-edge whose operation graphs and rules it followed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Target {
    pub device: String,
    pub cudnn: u64,
    pub yolo_edge: String,
}

impl Target {
    /// A decision made by this build of yolo-edge on `device` with cuDNN `cudnn`.
    pub fn this_build(device: String, cudnn: u64) -> Self {
        Self { device, cudnn, yolo_edge: env!("CARGO_PKG_VERSION").to_string() }
    }
}

/// A fused convolution's shape: input `(N, C, H, W)` and filter `(K, C, R, S)` in cuDNN's order,
/// stride, padding, the epilogue and the channel strides of input and output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shape {
    pub x: [i32; 4],
    pub w: [i32; 4],
    pub stride: i32,
    pub pad: i32,
    pub act: bool,
    pub residual: bool,
    pub x_width: i32,
    pub y_width: i32,
    pub y_offset: i32,
}

/// The engine config a shape runs fused with: its position in cuDNN's heuristics (mode A) and
/// the engine's global index, checked when the plan is built again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Choice {
    pub position: u32,
    pub engine: i64,
}

/// One line of the file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Entry {
    target: Target,
    shape: Shape,
    /// `None`: not fused (the convolution and its epilogue run apart).
    fused: Option<Choice>,
}

/// Why the file could not be used: the decisions are then made anew and not kept.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("fusion cache {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// The decisions read from a file, and where new ones go.
#[derive(Debug)]
pub struct FusionCache {
    path: PathBuf,
    target: Target,
    decided: HashMap<Shape, Option<Choice>>,
    /// Bytes in the file (read or appended): none are appended past [`MAX_BYTES`].
    bytes: u64,
    /// The file's last byte is not a newline (a cut write): the next append starts a new line.
    cut: bool,
    /// A write failed (disk full, file made read-only): later decisions are kept in memory only.
    failed: bool,
    /// Lines that did not parse.
    pub damaged: usize,
    /// Lines of other targets (another GPU model, cuDNN or yolo-edge version).
    pub other_targets: usize,
}

impl FusionCache {
    /// The decisions for `target` in `path` (none where it does not exist yet).
    pub fn open(path: &Path, target: Target) -> Result<Self, CacheError> {
        let io = |source| CacheError::Io { path: path.to_path_buf(), source };
        let mut text = Vec::new();
        match std::fs::File::open(path) {
            Ok(f) => {
                f.take(MAX_BYTES).read_to_end(&mut text).map_err(io)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let mut cache = Self {
            path: path.to_path_buf(),
            target,
            decided: HashMap::new(),
            bytes: text.len() as u64,
            cut: text.last().is_some_and(|&b| b != b'\n'),
            failed: false,
            damaged: 0,
            other_targets: 0,
        };
        for line in text.split(|&b| b == b'\n').filter(|l| !l.iter().all(u8::is_ascii_whitespace)) {
            match serde_json::from_slice::<Entry>(line) {
                Ok(e) if e.target == cache.target => {
                    cache.decided.insert(e.shape, e.fused);
                }
                Ok(_) => cache.other_targets += 1,
                Err(_) => cache.damaged += 1,
            }
        }
        Ok(cache)
    }

    /// Decisions kept for this target.
    pub fn len(&self) -> usize {
        self.decided.len()
    }

    pub fn is_empty(&self) -> bool {
        self.decided.is_empty()
    }

    /// The decision kept for `shape`: `Some(None)` not fused, `Some(Some(c))` fused with `c`,
    /// `None` not decided yet.
    pub fn get(&self, shape: &Shape) -> Option<Option<Choice>> {
        self.decided.get(shape).copied()
    }

    /// Keeps the decision for `shape` and appends it to the file; `Ok(false)` where it was kept
    /// in memory only: the file is full ([`MAX_BYTES`]) or an earlier write failed. A failed
    /// write is the error once; later decisions are not written.
    pub fn record(&mut self, shape: Shape, fused: Option<Choice>) -> Result<bool, CacheError> {
        self.decided.insert(shape, fused);
        let entry = Entry { target: self.target.clone(), shape, fused };
        let mut line = serde_json::to_vec(&entry).expect("a cache entry serializes");
        line.push(b'\n');
        if self.cut {
            line.insert(0, b'\n');
        }
        if self.failed || self.bytes + line.len() as u64 > MAX_BYTES {
            return Ok(false);
        }
        let written = std::fs::OpenOptions::new().create(true).append(true).open(&self.path).and_then(|mut f| f.write_all(&line));
        if let Err(source) = written {
            self.failed = true;
            return Err(CacheError::Io { path: self.path.clone(), source });
        }
        self.bytes += line.len() as u64;
        self.cut = false;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target::this_build("NVIDIA H100 80GB HBM3".into(), 91900)
    }

    fn shape(n: i32) -> Shape {
        Shape {
            x: [n, 16, 320, 320],
            w: [32, 16, 3, 3],
            stride: 2,
            pad: 1,
            act: true,
            residual: false,
            x_width: 16,
            y_width: 32,
            y_offset: 0,
        }
    }

    #[test]
    fn decisions_survive_a_restart_and_the_last_line_of_a_shape_wins() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fusion.jsonl");
        let mut c = FusionCache::open(&path, target()).unwrap();
        assert!(c.is_empty() && c.get(&shape(1)).is_none());
        let fused = Choice { position: 2, engine: 12 };
        assert!(c.record(shape(1), Some(fused)).unwrap());
        assert!(c.record(shape(8), None).unwrap());
        assert!(c.record(shape(1), Some(Choice { position: 0, engine: 3 })).unwrap());
        let again = FusionCache::open(&path, target()).unwrap();
        assert_eq!((again.len(), again.damaged, again.other_targets), (2, 0, 0));
        assert_eq!(again.get(&shape(1)), Some(Some(Choice { position: 0, engine: 3 })));
        assert_eq!(again.get(&shape(8)), Some(None));
        assert_eq!(again.get(&shape(2)), None);
    }

    #[test]
    fn another_gpu_cudnn_or_yolo_edge_decides_anew() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fusion.jsonl");
        FusionCache::open(&path, target()).unwrap().record(shape(1), None).unwrap();
        let other = FusionCache::open(&path, Target { cudnn: 92000, ..target() }).unwrap();
        assert_eq!((other.len(), other.other_targets), (0, 1));
        let other = FusionCache::open(&path, Target { device: "NVIDIA H200".into(), ..target() }).unwrap();
        assert_eq!((other.len(), other.other_targets), (0, 1));
        let other = FusionCache::open(&path, Target { yolo_edge: "0.2.0".into(), ..target() }).unwrap();
        assert_eq!((other.len(), other.other_targets), (0, 1));
    }

    #[test]
    fn damaged_lines_are_skipped_and_a_cut_line_is_ended_before_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fusion.jsonl");
        FusionCache::open(&path, target()).unwrap().record(shape(1), None).unwrap();
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        // an edit by hand, binary junk, and a write cut short by a crash
        f.write_all(b"not json\n\xff\xfe\x00\n{\"target\":{\"device\":\"NVIDIA H1").unwrap();
        drop(f);
        let mut c = FusionCache::open(&path, target()).unwrap();
        assert_eq!((c.len(), c.damaged), (1, 3));
        c.record(shape(4), Some(Choice { position: 1, engine: 7 })).unwrap();
        let again = FusionCache::open(&path, target()).unwrap();
        // the cut line stays damaged; the new decision is a line of its own
        assert_eq!((again.len(), again.damaged), (2, 3));
        assert_eq!(again.get(&shape(4)), Some(Some(Choice { position: 1, engine: 7 })));
    }

    #[test]
    fn a_failed_write_is_reported_once_and_decisions_stay_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("gone");
        std::fs::create_dir(&folder).unwrap();
        let mut c = FusionCache::open(&folder.join("fusion.jsonl"), target()).unwrap();
        std::fs::remove_dir(&folder).unwrap();
        assert!(matches!(c.record(shape(1), None), Err(CacheError::Io { .. })));
        assert!(!c.record(shape(2), None).unwrap());
        assert_eq!((c.get(&shape(1)), c.get(&shape(2))), (Some(None), Some(None)));
    }

    #[test]
    fn a_file_past_the_bound_is_read_up_to_it_and_not_grown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fusion.jsonl");
        FusionCache::open(&path, target()).unwrap().record(shape(1), None).unwrap();
        let one = std::fs::metadata(&path).unwrap().len();
        // padding lines of spaces up to past the bound
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        let pad = vec![b' '; 1 << 20];
        for _ in 0..8 {
            f.write_all(&pad).unwrap();
            f.write_all(b"\n").unwrap();
        }
        drop(f);
        let before = std::fs::metadata(&path).unwrap().len();
        assert!(before > MAX_BYTES && before > one);
        let mut c = FusionCache::open(&path, target()).unwrap();
        assert_eq!((c.len(), c.damaged), (1, 0));
        assert!(!c.record(shape(2), None).unwrap());
        assert_eq!(c.get(&shape(2)), Some(None), "kept in memory");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), before);
    }
}
