//! Checkpoint loading without Python: ultralytics `.pt` files (a zip holding a pickled
//! `DetectionModel`), the official WongKinYiu/yolov9 `.pt` files (same layout, other classes),
//! and safetensors with the same state-dict names, with or without yolo-edge metadata.
//! Every error names the file, and the tensor where there is one.

pub mod pickle;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Tensor};

use pickle::Value;

/// What went wrong while reading a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("{path}: cannot read: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: not a model checkpoint: {reason}")]
    NotACheckpoint { path: PathBuf, reason: String },
    #[error("{path}: damaged pickle in the checkpoint: {source}")]
    Pickle { path: PathBuf, source: pickle::PickleError },
    #[error("{path}: tensor `{tensor}`: {reason}")]
    Tensor { path: PathBuf, tensor: String, reason: String },
    #[error("{path}: missing tensor `{tensor}` (expected shape {expected:?})")]
    Missing { path: PathBuf, tensor: String, expected: Vec<usize> },
    #[error("{path}: tensor `{tensor}` has shape {found:?}, expected {expected:?}")]
    Shape { path: PathBuf, tensor: String, expected: Vec<usize>, found: Vec<usize> },
    #[error("{path}: {count} unexpected tensor(s) for a {arch} model, e.g. {examples:?}")]
    Unexpected { path: PathBuf, arch: String, count: usize, examples: Vec<String> },
    #[error("{path}: unknown architecture: {reason}")]
    UnknownArchitecture { path: PathBuf, reason: String },
}

/// The source format of a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceFormat {
    /// ultralytics `.pt` (`ultralytics.nn.tasks.DetectionModel`).
    Ultralytics,
    /// WongKinYiu/yolov9 `.pt` (`models.yolo.DetectionModel`), e.g. `yolov9-c-converted.pt`.
    Official,
    /// safetensors with ultralytics state-dict names (unfused).
    Safetensors,
    /// safetensors written by `yolo-edge convert` (BatchNorm and RepConv already folded).
    FusedSafetensors,
}

/// Raw tensors (on the CPU, as stored) and what the file says about the model.
#[derive(Debug)]
pub struct Checkpoint {
    pub path: PathBuf,
    pub format: SourceFormat,
    pub tensors: HashMap<String, Tensor>,
    /// Class names, by class id, when the file carries them.
    pub names: Option<Vec<String>>,
    /// Training image size, when the file carries it.
    pub imgsz: Option<usize>,
    /// Strides stored in the model, when present.
    pub strides: Option<Vec<f64>>,
    /// Free-form metadata (safetensors `__metadata__`).
    pub metadata: BTreeMap<String, String>,
    /// sha256 of the file, hex.
    pub sha256: String,
}

impl Checkpoint {
    /// Loads a checkpoint, choosing the reader from the file's content (not its name).
    pub fn load(path: &Path) -> Result<Self, WeightsError> {
        let io = |source| WeightsError::Io { path: path.to_owned(), source };
        let bytes = std::fs::read(path).map_err(io)?;
        let sha256 = {
            use sha2::Digest;
            let d = sha2::Sha256::digest(&bytes);
            d.iter().map(|b| format!("{b:02x}")).collect::<String>()
        };
        if bytes.len() < 8 {
            return Err(WeightsError::NotACheckpoint { path: path.to_owned(), reason: format!("file is only {} bytes", bytes.len()) });
        }
        let mut ck = if bytes.starts_with(b"PK") { load_pt(path, &bytes)? } else { load_safetensors(path, &bytes)? };
        ck.sha256 = sha256;
        Ok(ck)
    }
}

fn not_ckpt(path: &Path, reason: impl Into<String>) -> WeightsError {
    WeightsError::NotACheckpoint { path: path.to_owned(), reason: reason.into() }
}

fn load_safetensors(path: &Path, bytes: &[u8]) -> Result<Checkpoint, WeightsError> {
    let st = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| not_ckpt(path, format!("neither a PyTorch zip nor a valid safetensors file ({e})")))?;
    let (_, header) = safetensors::SafeTensors::read_metadata(bytes).map_err(|e| not_ckpt(path, e.to_string()))?;
    let metadata: BTreeMap<String, String> = header.metadata().clone().map(|m| m.into_iter().collect()).unwrap_or_default();
    let mut tensors = HashMap::new();
    for (name, view) in st.tensors() {
        let dtype = match view.dtype() {
            safetensors::Dtype::F32 => DType::F32,
            safetensors::Dtype::F16 => DType::F16,
            safetensors::Dtype::BF16 => DType::BF16,
            safetensors::Dtype::F64 => DType::F64,
            safetensors::Dtype::I64 => DType::I64,
            other => {
                return Err(WeightsError::Tensor { path: path.to_owned(), tensor: name, reason: format!("unsupported dtype {other:?}") })
            }
        };
        let t = Tensor::from_raw_buffer(view.data(), dtype, view.shape(), &Device::Cpu).map_err(|e| WeightsError::Tensor {
            path: path.to_owned(),
            tensor: name.clone(),
            reason: e.to_string(),
        })?;
        tensors.insert(name, t);
    }
    let names = metadata.get("names").and_then(|s| serde_json::from_str::<Vec<String>>(s).ok());
    let imgsz = metadata.get("imgsz").and_then(|s| s.parse().ok());
    let strides = metadata.get("strides").and_then(|s| serde_json::from_str::<Vec<f64>>(s).ok());
    let format = if metadata.get("fused").map(|s| s == "true").unwrap_or(false) {
        SourceFormat::FusedSafetensors
    } else {
        SourceFormat::Safetensors
    };
    Ok(Checkpoint { path: path.to_owned(), format, tensors, names, imgsz, strides, metadata, sha256: String::new() })
}

fn load_pt(path: &Path, bytes: &[u8]) -> Result<Checkpoint, WeightsError> {
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(|e| not_ckpt(path, format!("damaged zip archive ({e})")))?;
    let pkl_name = zip
        .file_names()
        .filter_map(|n| n.ok().map(|n| n.into_owned()))
        .find(|n| n.ends_with("data.pkl"))
        .ok_or_else(|| not_ckpt(path, "zip archive without data.pkl (not a torch.save file)"))?;
    let prefix = pkl_name.strip_suffix("data.pkl").unwrap_or("").to_string();
    let mut pkl = Vec::new();
    zip.by_name(&pkl_name)
        .and_then(|mut f| f.read_to_end(&mut pkl).map_err(Into::into))
        .map_err(|e| not_ckpt(path, format!("cannot read data.pkl ({e})")))?;
    let root = pickle::parse(&pkl).map_err(|source| WeightsError::Pickle { path: path.to_owned(), source })?;

    // The module: ckpt["ema"] or ckpt["model"] (ultralytics / official), or the object itself.
    let model = match &root {
        Value::Dict(_) => ["ema", "model"].iter().filter_map(|k| root.get(k)).find(|v| matches!(v, Value::Object(_))).ok_or_else(|| {
            not_ckpt(path, "checkpoint dict has no `model` or `ema` module (a bare state_dict? convert it to safetensors)")
        })?,
        Value::Object(_) => root.clone(),
        _ => return Err(not_ckpt(path, "pickle holds neither a dict nor a module")),
    };
    let class = model.class_name().unwrap_or_default();
    let format = if class.starts_with("ultralytics.") {
        SourceFormat::Ultralytics
    } else if class.starts_with("models.yolo") || class.starts_with("yolo9") || class.contains("DetectionModel") {
        SourceFormat::Official
    } else {
        return Err(WeightsError::UnknownArchitecture {
            path: path.to_owned(),
            reason: format!("the checkpoint holds a `{class}`, not a YOLO DetectionModel"),
        });
    };
    if !class.ends_with("DetectionModel") {
        return Err(WeightsError::UnknownArchitecture { path: path.to_owned(), reason: format!("`{class}` is not a detection model") });
    }

    let mut refs = Vec::new();
    collect_tensors(&model, "", &mut refs, 0);
    if refs.is_empty() {
        return Err(not_ckpt(path, "the model holds no tensors"));
    }
    let mut storages: HashMap<String, Vec<u8>> = HashMap::new();
    let mut tensors = HashMap::new();
    for (name, tr) in refs {
        let terr = |reason: String| WeightsError::Tensor { path: path.to_owned(), tensor: name.clone(), reason };
        let dtype = match tr.storage.kind.as_str() {
            "FloatStorage" => DType::F32,
            "HalfStorage" => DType::F16,
            "BFloat16Storage" => DType::BF16,
            "DoubleStorage" => DType::F64,
            "LongStorage" => DType::I64,
            other => return Err(terr(format!("unsupported storage type {other}"))),
        };
        let es = dtype.size_in_bytes();
        if !storages.contains_key(&tr.storage.key) {
            let entry = format!("{prefix}data/{}", tr.storage.key);
            let mut buf = Vec::new();
            zip.by_name(&entry)
                .and_then(|mut f| f.read_to_end(&mut buf).map_err(Into::into))
                .map_err(|e| terr(format!("storage `{entry}` unreadable ({e})")))?;
            if buf.len() < tr.storage.numel * es {
                return Err(terr(format!(
                    "storage `{entry}` holds {} bytes, {} expected (truncated file?)",
                    buf.len(),
                    tr.storage.numel * es
                )));
            }
            storages.insert(tr.storage.key.clone(), buf);
        }
        let data = &storages[&tr.storage.key];
        let numel: usize = tr.shape.iter().product();
        let mut out = Vec::with_capacity(numel * es);
        // gather element by element through the strides (tensors are small; most are contiguous)
        let mut idx = vec![0usize; tr.shape.len()];
        for _ in 0..numel {
            let off = tr.offset + idx.iter().zip(&tr.stride).map(|(i, s)| i * s).sum::<usize>();
            let b = off * es;
            if b + es > data.len() {
                return Err(terr("tensor view reaches past its storage".into()));
            }
            out.extend_from_slice(&data[b..b + es]);
            for d in (0..idx.len()).rev() {
                idx[d] += 1;
                if idx[d] < tr.shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        let t = Tensor::from_raw_buffer(&out, dtype, &tr.shape, &Device::Cpu).map_err(|e| terr(e.to_string()))?;
        tensors.insert(name, t);
    }

    let names = model.attr("names").and_then(|n| names_from(&n));
    let imgsz = root.get("train_args").and_then(|a| a.get("imgsz")).and_then(|v| v.as_int()).map(|v| v as usize);
    let strides = model.attr("stride").and_then(|s| match s {
        Value::Tensor(t) => tensors_from_ref(path, &zip_storage(&mut zip, &prefix, &t.storage.key).ok()?, &t).ok(),
        _ => None,
    });
    Ok(Checkpoint { path: path.to_owned(), format, tensors, names, imgsz, strides, metadata: BTreeMap::new(), sha256: String::new() })
}

fn zip_storage(zip: &mut zip::ZipArchive<std::io::Cursor<&[u8]>>, prefix: &str, key: &str) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    zip.by_name(&format!("{prefix}data/{key}"))?.read_to_end(&mut buf)?;
    Ok(buf)
}

/// Reads a small float tensor (e.g. the model's strides) into f64 values.
fn tensors_from_ref(path: &Path, data: &[u8], t: &pickle::TensorRef) -> Result<Vec<f64>, WeightsError> {
    let n: usize = t.shape.iter().product();
    let vals: Option<Vec<f64>> = (0..n)
        .map(|i| {
            let off = t.offset + i * t.stride.last().copied().unwrap_or(1);
            match t.storage.kind.as_str() {
                "FloatStorage" => data.get(off * 4..off * 4 + 4).map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64),
                "HalfStorage" => data.get(off * 2..off * 2 + 2).map(|b| half::f16::from_le_bytes(b.try_into().unwrap()).to_f64()),
                "DoubleStorage" => data.get(off * 8..off * 8 + 8).map(|b| f64::from_le_bytes(b.try_into().unwrap())),
                _ => None,
            }
        })
        .collect();
    vals.ok_or_else(|| WeightsError::Tensor { path: path.to_owned(), tensor: "stride".into(), reason: "unreadable".into() })
}

/// `{0: 'person', ...}` or `['person', ...]` into an ordered list.
fn names_from(v: &Value) -> Option<Vec<String>> {
    if let Some(items) = v.items() {
        return items.iter().map(|x| x.as_str().map(str::to_string)).collect();
    }
    let pairs = v.pairs()?;
    let mut out: Vec<(i64, String)> = pairs.iter().filter_map(|(k, v)| Some((k.as_int()?, v.as_str()?.to_string()))).collect();
    out.sort();
    if out.iter().enumerate().all(|(i, (k, _))| *k == i as i64) {
        Some(out.into_iter().map(|(_, s)| s).collect())
    } else {
        None
    }
}

/// Walks `_parameters`, `_buffers` and `_modules` like `nn.Module.state_dict()`.
fn collect_tensors(m: &Value, prefix: &str, out: &mut Vec<(String, Rc<pickle::TensorRef>)>, depth: usize) {
    if depth > 64 {
        return;
    }
    for key in ["_parameters", "_buffers"] {
        if let Some(d) = m.attr(key).and_then(|d| d.pairs()) {
            for (k, v) in d {
                if let (Some(k), Value::Tensor(t)) = (k.as_str(), &v) {
                    out.push((format!("{prefix}{k}"), t.clone()));
                }
            }
        }
    }
    if let Some(d) = m.attr("_modules").and_then(|d| d.pairs()) {
        for (k, v) in d {
            if let Some(k) = k.as_str() {
                collect_tensors(&v, &format!("{prefix}{k}."), out, depth + 1);
            }
        }
    }
}

use std::rc::Rc;

/// A checkpoint's tensors behind a `VarBuilder`-like prefix API ([`crate::model::Vb`]) that (1)
/// names the file in every error, (2) checks shapes, and (3) records which tensors were used, so
/// that left-over tensors (a checkpoint of another architecture) are reported, not ignored.
#[derive(Clone)]
pub struct TrackedTensors {
    path: PathBuf,
    tensors: Arc<HashMap<String, Tensor>>,
    used: Arc<Mutex<HashSet<String>>>,
}

impl TrackedTensors {
    pub fn new(path: &Path, tensors: HashMap<String, Tensor>) -> Self {
        Self { path: path.to_owned(), tensors: Arc::new(tensors), used: Arc::default() }
    }
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
    pub fn shape_of(&self, name: &str) -> Option<Vec<usize>> {
        self.tensors.get(name).map(|t| t.dims().to_vec())
    }
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.tensors.keys()
    }
    /// Fetches a tensor as f32, checking its shape.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor, WeightsError> {
        let t = self.tensors.get(name).ok_or_else(|| WeightsError::Missing {
            path: self.path.clone(),
            tensor: name.into(),
            expected: shape.to_vec(),
        })?;
        if t.dims() != shape {
            return Err(WeightsError::Shape {
                path: self.path.clone(),
                tensor: name.into(),
                expected: shape.to_vec(),
                found: t.dims().to_vec(),
            });
        }
        self.used.lock().unwrap().insert(name.to_string());
        t.to_dtype(DType::F32).map_err(|e| WeightsError::Tensor { path: self.path.clone(), tensor: name.into(), reason: e.to_string() })
    }
    /// Fetches a tensor whose shape the caller checks itself.
    pub fn get_any(&self, name: &str) -> Result<Tensor, WeightsError> {
        let shape =
            self.shape_of(name).ok_or_else(|| WeightsError::Missing { path: self.path.clone(), tensor: name.into(), expected: vec![] })?;
        self.get(name, &shape)
    }
    /// Marks tensors that the model knows but does not need (e.g. BatchNorm step counters).
    pub fn ignore(&self, name: &str) {
        if self.tensors.contains_key(name) {
            self.used.lock().unwrap().insert(name.to_string());
        }
    }
    /// Tensors never fetched, sorted.
    pub fn unused(&self) -> Vec<String> {
        let used = self.used.lock().unwrap();
        let mut v: Vec<String> = self.tensors.keys().filter(|k| !used.contains(*k)).cloned().collect();
        v.sort();
        v
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
}
