//! YOLO-format datasets as ultralytics reads them: a `data.yaml` (the subset of YAML such files
//! use) or a folder of `images/` and `labels/`; one `class cx cy w h` line per object,
//! normalised, or a polygon `class x1 y1 x2 y2 ...` (its bounding box is used). A split may also
//! hold video files: frame N of `images/clip.mp4` is labelled by `labels/clip/N.txt` (N counted
//! from 0, any zero padding), each frame evaluated as a picture.

use std::path::{Path, PathBuf};

/// Image extensions that are evaluated (what the decoder supports).
pub const IMAGE_EXTENSIONS: [&str; 5] = ["jpg", "jpeg", "png", "bmp", "webp"];

/// Video file name endings read as video (frames decoded through GStreamer, feature `gstreamer`).
pub const VIDEO_EXTENSIONS: &[&str] = &["mp4", "mkv", "mov", "avi", "webm", "ts", "m4v", "h264", "h265", "264", "265"];

/// Whether `p` names a video file (by its ending).
pub fn is_video(p: &Path) -> bool {
    p.extension().and_then(|e| e.to_str()).is_some_and(|e| VIDEO_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
}

#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}: {reason}")]
    Yaml { path: PathBuf, line: usize, reason: String },
    #[error("{0} has no `{1}` entry")]
    MissingSplit(PathBuf, String),
    #[error("no dataset at {0}: expected a data.yaml, DIR/data.yaml, DIR/images/<split>/ or DIR/images/")]
    NotFound(PathBuf),
    #[error("no images (jpg, jpeg, png, bmp, webp) or videos (mp4, mkv, mov, ...) in {0}")]
    NoImages(PathBuf),
}

/// Why one label file was rejected (the reference skips such an image as corrupt).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LabelError {
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
}

/// One labelled object, normalised centre form.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Label {
    pub class_id: usize,
    pub cxcywh: [f64; 4],
}

impl Label {
    /// The box in pixels of a `w` x `h` picture, xyxy.
    pub fn xyxy(&self, w: f64, h: f64) -> [f64; 4] {
        let [cx, cy, bw, bh] = self.cxcywh;
        [(cx - bw / 2.0) * w, (cy - bh / 2.0) * h, (cx + bw / 2.0) * w, (cy + bh / 2.0) * h]
    }
}

/// An image and where its labels live (a missing label file means "no objects").
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub image: PathBuf,
    pub labels: PathBuf,
}

/// A video file of a split and the folder of its frames' label files (`labels/clip/N.txt`).
#[derive(Debug, Clone, PartialEq)]
pub struct VideoSample {
    pub video: PathBuf,
    pub labels: PathBuf,
}

impl VideoSample {
    /// The label file of each frame that has one, by frame index: files named by a number (any
    /// zero padding) with the `.txt` ending; other files in the folder are not labels. A
    /// missing folder means no frame has objects, as a missing label file does for a picture.
    pub fn frame_labels(&self) -> Result<std::collections::BTreeMap<u64, PathBuf>, DatasetError> {
        let mut out = std::collections::BTreeMap::new();
        let rd = match std::fs::read_dir(&self.labels) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(source) => return Err(DatasetError::Io { path: self.labels.clone(), source }),
        };
        for e in rd {
            let p = e.map_err(|source| DatasetError::Io { path: self.labels.clone(), source })?.path();
            if p.extension().is_some_and(|e| e == "txt") {
                if let Some(i) = p.file_stem().and_then(|s| s.to_str()).and_then(|s| s.parse::<u64>().ok()) {
                    out.insert(i, p);
                }
            }
        }
        Ok(out)
    }
}

/// The images and videos of one split and the dataset's class names (empty when it declares
/// none).
#[derive(Debug, Clone)]
pub struct Dataset {
    pub root: PathBuf,
    pub split: String,
    pub names: Vec<String>,
    pub samples: Vec<Sample>,
    pub videos: Vec<VideoSample>,
}

impl Dataset {
    /// Opens `split` of a dataset given as a data.yaml file, a folder holding one, or a folder
    /// with `images/<split>/` (or flat `images/`) and the matching `labels/`.
    pub fn open(path: &Path, split: &str) -> Result<Self, DatasetError> {
        if path.is_file() {
            return Self::from_yaml(path, split);
        }
        for name in ["data.yaml", "data.yml"] {
            let y = path.join(name);
            if y.is_file() {
                return Self::from_yaml(&y, split);
            }
        }
        let images = [path.join("images").join(split), path.join("images")].into_iter().find(|p| p.is_dir());
        match images {
            Some(dir) => {
                let (samples, videos) = list_images(&dir)?;
                Ok(Self { root: path.to_path_buf(), split: split.into(), names: vec![], samples, videos })
            }
            None => Err(DatasetError::NotFound(path.to_path_buf())),
        }
    }

    fn from_yaml(yaml: &Path, split: &str) -> Result<Self, DatasetError> {
        let text = std::fs::read_to_string(yaml).map_err(|source| DatasetError::Io { path: yaml.into(), source })?;
        let cfg = DataYaml::parse(&text).map_err(|(line, reason)| DatasetError::Yaml { path: yaml.into(), line, reason })?;
        let base = yaml.parent().unwrap_or(Path::new("."));
        // a relative `path` is taken relative to the yaml file (ultralytics would look under its
        // datasets folder, which an edge box does not have)
        let root = match &cfg.path {
            Some(p) if Path::new(p).is_absolute() => PathBuf::from(p),
            Some(p) => base.join(p),
            None => base.to_path_buf(),
        };
        let entry = cfg.splits.iter().find(|(k, _)| k == split).map(|(_, v)| v.clone());
        let entry = entry.ok_or_else(|| DatasetError::MissingSplit(yaml.into(), split.into()))?;
        let target = root.join(&entry);
        let (samples, videos) = if target.is_file() { list_from_txt(&target, &root)? } else { list_images(&target)? };
        Ok(Self { root, split: split.into(), names: cfg.names, samples, videos })
    }
}

/// The label file of an image: the last `/images/` component becomes `/labels/`, the extension `.txt`.
pub fn label_path(image: &Path) -> PathBuf {
    let s = image.to_string_lossy();
    let sep = std::path::MAIN_SEPARATOR;
    let (a, b) = (format!("{sep}images{sep}"), format!("{sep}labels{sep}"));
    let swapped = match s.rfind(&a) {
        Some(i) => format!("{}{}{}", &s[..i], b, &s[i + a.len()..]),
        None => s.into_owned(),
    };
    PathBuf::from(swapped).with_extension("txt")
}

fn is_image(p: &Path) -> bool {
    p.extension().and_then(|e| e.to_str()).is_some_and(|e| IMAGE_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
}

/// Images and videos, each sorted by path, with where their labels live.
fn samples(mut files: Vec<PathBuf>, at: &Path) -> Result<(Vec<Sample>, Vec<VideoSample>), DatasetError> {
    if files.is_empty() {
        return Err(DatasetError::NoImages(at.into()));
    }
    files.sort();
    let (videos, images): (Vec<PathBuf>, Vec<PathBuf>) = files.into_iter().partition(|p| is_video(p));
    Ok((
        images.into_iter().map(|image| Sample { labels: label_path(&image), image }).collect(),
        videos.into_iter().map(|video| VideoSample { labels: label_path(&video).with_extension(""), video }).collect(),
    ))
}

/// Every image and video under `dir`, recursively.
fn list_images(dir: &Path) -> Result<(Vec<Sample>, Vec<VideoSample>), DatasetError> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let rd = std::fs::read_dir(&d).map_err(|source| DatasetError::Io { path: d.clone(), source })?;
        for e in rd {
            let p = e.map_err(|source| DatasetError::Io { path: d.clone(), source })?.path();
            if p.is_dir() {
                stack.push(p);
            } else if is_image(&p) || is_video(&p) {
                out.push(p);
            }
        }
    }
    samples(out, dir)
}

/// Images and videos listed one per line in a .txt file (relative lines are relative to the
/// dataset root).
fn list_from_txt(txt: &Path, root: &Path) -> Result<(Vec<Sample>, Vec<VideoSample>), DatasetError> {
    let text = std::fs::read_to_string(txt).map_err(|source| DatasetError::Io { path: txt.into(), source })?;
    let out: Vec<PathBuf> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| {
            let p = Path::new(l.strip_prefix("./").unwrap_or(l));
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                root.join(p)
            }
        })
        .filter(|p| is_image(p) || is_video(p))
        .collect();
    samples(out, txt)
}

/// Parses a label file's text. Duplicate rows are dropped (as the reference does); any
/// malformed row, a negative or non-integer class, a class >= `nc`, or a coordinate outside
/// [-0.01, 1] rejects the file.
pub fn parse_labels(text: &str, nc: Option<usize>) -> Result<Vec<Label>, LabelError> {
    let mut rows: Vec<Vec<f64>> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let err = |reason: String| LabelError::Line { line: i + 1, reason };
        let vals: Vec<f64> = line
            .split_whitespace()
            .map(|t| t.parse::<f64>().map_err(|_| err(format!("`{t}` is not a number"))))
            .collect::<Result<_, _>>()?;
        if vals.is_empty() {
            continue;
        }
        if vals.len() != 5 && (vals.len() < 7 || vals.len().is_multiple_of(2)) {
            return Err(err(format!("{} values: expected `class cx cy w h` or `class x1 y1 x2 y2 x3 y3 ...`", vals.len())));
        }
        if vals.iter().any(|v| !v.is_finite()) {
            return Err(err("non-finite value".into()));
        }
        let c = vals[0];
        if c < 0.0 || c.fract() != 0.0 {
            return Err(err(format!("class {c} is not a non-negative integer")));
        }
        if let Some(nc) = nc {
            if c as usize >= nc {
                return Err(err(format!("class {c} exceeds the dataset's {nc} classes")));
            }
        }
        let row = if vals.len() == 5 {
            vals
        } else {
            // polygon -> its bounding box (the reference's segments2boxes)
            let xs = vals[1..].iter().step_by(2);
            let ys = vals[2..].iter().step_by(2);
            let (x1, x2) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
            let (y1, y2) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
            vec![c, (x1 + x2) / 2.0, (y1 + y2) / 2.0, x2 - x1, y2 - y1]
        };
        // the reference's tolerance: coordinates <= 1 and >= -0.01; a box may reach past the border
        if row[1..].iter().any(|&v| !(-0.01..=1.0).contains(&v)) {
            return Err(err("coordinates must be normalised to [0, 1]".into()));
        }
        if !rows.contains(&row) {
            rows.push(row);
        }
    }
    Ok(rows.into_iter().map(|r| Label { class_id: r[0] as usize, cxcywh: [r[1], r[2], r[3], r[4]] }).collect())
}

/// The keys of a data.yaml that evaluation needs.
#[derive(Debug, Default, PartialEq)]
struct DataYaml {
    path: Option<String>,
    splits: Vec<(String, String)>,
    names: Vec<String>,
}

fn unquote(s: &str) -> String {
    let s = s.trim();
    if s.len() >= 2 && ((s.starts_with('"') && s.ends_with('"')) || (s.starts_with('\'') && s.ends_with('\''))) {
        s[1..s.len() - 1].to_string()
    } else {
        s.to_string()
    }
}

/// Drops a `# comment` that is not inside quotes.
fn strip_comment(line: &str) -> &str {
    let mut quote = None;
    for (i, ch) in line.char_indices() {
        match (ch, quote) {
            ('"' | '\'', None) => quote = Some(ch),
            (c, Some(q)) if c == q => quote = None,
            ('#', None) if i == 0 || line[..i].ends_with(char::is_whitespace) => return &line[..i],
            _ => {}
        }
    }
    line
}

/// Splits a flow collection's body on commas outside quotes.
fn split_flow(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote = None;
    for ch in body.chars() {
        match (ch, quote) {
            ('"' | '\'', None) => {
                quote = Some(ch);
                cur.push(ch)
            }
            (c, Some(q)) if c == q => {
                quote = None;
                cur.push(ch)
            }
            (',', None) => out.push(std::mem::take(&mut cur)),
            _ => cur.push(ch),
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur);
    }
    out.into_iter().map(|s| s.trim().to_string()).collect()
}

impl DataYaml {
    /// Parses the data.yaml subset: top-level `key: scalar`, and `names` as a block list, a
    /// block mapping `index: name`, a flow list `[a, b]` or a flow mapping `{0: a, 1: b}`.
    /// Other keys are ignored. Errors carry the 1-based line number.
    fn parse(text: &str) -> Result<Self, (usize, String)> {
        let mut out = DataYaml::default();
        let mut indexed: Vec<(usize, String)> = Vec::new();
        let mut in_names = false;
        for (i, raw) in text.lines().enumerate() {
            let line = strip_comment(raw).trim_end();
            if line.trim().is_empty() || line.trim() == "---" {
                continue;
            }
            let indented = line.starts_with(' ') || line.starts_with('\t');
            let t = line.trim();
            if indented {
                if !in_names {
                    continue; // nested value of a key we do not use
                }
                if let Some(item) = t.strip_prefix("- ").or(if t == "-" { Some("") } else { None }) {
                    out.names.push(unquote(item));
                } else if let Some((k, v)) = t.split_once(':') {
                    let idx = k.trim().parse::<usize>().map_err(|_| (i + 1, format!("`{}` is not a class index", k.trim())))?;
                    indexed.push((idx, unquote(v)));
                } else {
                    return Err((i + 1, format!("cannot read `{t}` under names")));
                }
                continue;
            }
            in_names = false;
            let Some((k, v)) = t.split_once(':') else {
                return Err((i + 1, format!("expected `key: value`, got `{t}`")));
            };
            let (k, v) = (k.trim(), v.trim());
            match k {
                "names" if v.is_empty() => in_names = true,
                "names" if v.starts_with('[') && v.ends_with(']') => {
                    out.names = split_flow(&v[1..v.len() - 1]).iter().map(|s| unquote(s)).collect()
                }
                "names" if v.starts_with('{') && v.ends_with('}') => {
                    for item in split_flow(&v[1..v.len() - 1]) {
                        let (a, b) = item.split_once(':').ok_or((i + 1, format!("`{item}` is not `index: name`")))?;
                        let idx = a.trim().parse::<usize>().map_err(|_| (i + 1, format!("`{}` is not a class index", a.trim())))?;
                        indexed.push((idx, unquote(b)));
                    }
                }
                "names" => return Err((i + 1, "names must be a list or a mapping".into())),
                "path" if !v.is_empty() => out.path = Some(unquote(v)),
                "train" | "val" | "test" | "minival" if v.starts_with('[') => {
                    return Err((i + 1, format!("`{k}` lists several sources; evaluate them one by one")))
                }
                "train" | "val" | "test" | "minival" if !v.is_empty() => out.splits.push((k.to_string(), unquote(v))),
                _ => {}
            }
        }
        if !indexed.is_empty() {
            indexed.sort_by_key(|(k, _)| *k);
            if indexed.iter().enumerate().any(|(i, (k, _))| i != *k) {
                return Err((0, "names must be indexed 0, 1, 2, ... without gaps".into()));
            }
            out.names = indexed.into_iter().map(|(_, v)| v).collect();
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_block_mapping_and_comments() {
        let y = "# generated\npath: ../d  # root\ntrain: images/train\ntest: 'images/test'\nnc: 2\nnames:\n  0: circle\n  1: \"square # not a comment\"\ndownload: |\n  print('x')\n";
        let d = DataYaml::parse(y).unwrap();
        assert_eq!(d.path.as_deref(), Some("../d"));
        assert_eq!(d.splits, vec![("train".into(), "images/train".into()), ("test".into(), "images/test".into())]);
        assert_eq!(d.names, vec!["circle", "square # not a comment"]);
    }

    #[test]
    fn yaml_list_forms() {
        assert_eq!(DataYaml::parse("names: [a, 'b, c', d]").unwrap().names, vec!["a", "b, c", "d"]);
        assert_eq!(DataYaml::parse("names: {1: b, 0: a}").unwrap().names, vec!["a", "b"]);
        assert_eq!(DataYaml::parse("names:\n  - a\n  - b\n").unwrap().names, vec!["a", "b"]);
        assert!(DataYaml::parse("names:\n  0: a\n  2: c\n").is_err());
        assert!(DataYaml::parse("names:\n  x: a\n").is_err());
        assert!(DataYaml::parse("val: [a, b]").is_err());
    }

    #[test]
    fn label_paths_swap_the_last_images_folder() {
        let p = label_path(Path::new("/data/images/set/images/test/0001.jpg"));
        assert_eq!(p, Path::new("/data/images/set/labels/test/0001.txt"));
    }

    #[test]
    fn videos_are_listed_apart_with_a_label_folder_per_clip() {
        let d = tempfile::tempdir().unwrap();
        let images = d.path().join("images/test");
        std::fs::create_dir_all(&images).unwrap();
        for f in ["b.jpg", "a.png", "clip.MP4", "notes.md"] {
            std::fs::write(images.join(f), b"").unwrap();
        }
        let labels = d.path().join("labels/test/clip");
        std::fs::create_dir_all(&labels).unwrap();
        for f in ["000000.txt", "7.txt", "00012.txt", "classes.txt", "3.json"] {
            std::fs::write(labels.join(f), b"").unwrap();
        }
        let ds = Dataset::open(d.path(), "test").unwrap();
        let names: Vec<_> = ds.samples.iter().map(|s| s.image.file_name().unwrap().to_str().unwrap()).collect();
        assert_eq!(names, ["a.png", "b.jpg"]);
        assert_eq!(ds.videos, vec![VideoSample { video: images.join("clip.MP4"), labels: labels.clone() }]);
        let frames = ds.videos[0].frame_labels().unwrap();
        assert_eq!(frames.keys().copied().collect::<Vec<_>>(), [0, 7, 12]);
        assert_eq!(frames[&12], labels.join("00012.txt"));
        // no label folder: every frame a background picture
        let none = VideoSample { video: images.join("clip.MP4"), labels: d.path().join("labels/none") };
        assert!(none.frame_labels().unwrap().is_empty());
        // a split of videos only is a split
        let v = d.path().join("v/images");
        std::fs::create_dir_all(&v).unwrap();
        std::fs::write(v.join("x.mkv"), b"").unwrap();
        let ds = Dataset::open(&d.path().join("v"), "test").unwrap();
        assert!(ds.samples.is_empty() && ds.videos.len() == 1);
    }

    #[test]
    fn labels_parse_boxes_polygons_and_drop_duplicates() {
        let l = parse_labels("0 0.5 0.5 0.2 0.4\n\n0 0.5 0.5 0.2 0.4\n1 0.1 0.1 0.3 0.1 0.3 0.5\n", Some(2)).unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].xyxy(100.0, 50.0), [40.0, 15.0, 60.0, 35.0]);
        assert_eq!(l[1].class_id, 1);
        let [cx, cy, w, h] = l[1].cxcywh;
        assert!((cx - 0.2).abs() < 1e-12 && (cy - 0.3).abs() < 1e-12 && (w - 0.2).abs() < 1e-12 && (h - 0.4).abs() < 1e-12);
    }

    #[test]
    fn bad_labels_are_rejected_with_their_line() {
        assert_eq!(
            parse_labels("0 0.5 0.5 0.2\n", None),
            Err(LabelError::Line { line: 1, reason: "4 values: expected `class cx cy w h` or `class x1 y1 x2 y2 x3 y3 ...`".into() })
        );
        assert!(parse_labels("0 0.5 0.5 0.2 0.2\n1.5 0.5 0.5 0.2 0.2", None).is_err());
        assert!(parse_labels("-1 0.5 0.5 0.2 0.2", None).is_err());
        assert!(parse_labels("3 0.5 0.5 0.2 0.2", Some(3)).is_err());
        assert!(parse_labels("0 1.5 0.5 0.2 0.2", None).is_err());
        assert!(parse_labels("0 0.95 0.5 0.2 0.2", None).is_ok(), "a box past the border is kept, as by the reference");
        assert!(parse_labels("0 nan 0.5 0.2 0.2", None).is_err());
        assert!(parse_labels("0 x 0.5 0.2 0.2", None).is_err());
    }
}
