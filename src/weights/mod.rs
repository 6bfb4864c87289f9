//! Checkpoint loading without Python: ultralytics `.pt` files (a zip holding a pickled
//! `DetectionModel`), the official WongKinYiu/yolov9 `.pt` files (same layout, other classes),
//! and safetensors with the same state-dict names, with or without yolo-edge metadata.
//! Every error names the file, and the tensor where there is one. A hostile file gets an error,
//! never a panic, a stack overflow or work and memory beyond budgets proportional to its size
//! (the limits below and in [`pickle`]; `docs/security.md`).

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
    #[error("{path}: damaged pickle in the checkpoint: {reason}")]
    Pickle { path: PathBuf, reason: pickle::PickleError },
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
        let bytes = read_model_file(path)?;
        Self::from_bytes(path, &bytes)
    }

    /// Reads a checkpoint from the bytes of a file; `path` only names it in errors.
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Self, WeightsError> {
        let sha256 = {
            use sha2::Digest;
            let d = sha2::Sha256::digest(bytes);
            d.iter().map(|b| format!("{b:02x}")).collect::<String>()
        };
        if bytes.len() < 8 {
            return Err(WeightsError::NotACheckpoint { path: path.to_owned(), reason: format!("file is only {} bytes", bytes.len()) });
        }
        let mut ck = if bytes.starts_with(b"PK") { load_pt(path, bytes)? } else { load_safetensors(path, bytes)? };
        ck.sha256 = sha256;
        Ok(ck)
    }
}

/// Reads a model file whole: a regular file of at most [`MAX_MODEL_FILE_BYTES`] (a FIFO or a
/// device such as `/dev/zero` is refused before anything is read).
pub fn read_model_file(path: &Path) -> Result<Vec<u8>, WeightsError> {
    crate::files::read_bounded(path, MAX_MODEL_FILE_BYTES).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData => not_ckpt(path, e.to_string()),
        _ => WeightsError::Io { path: path.to_owned(), source: e },
    })
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

/// The largest model file read (yolov9-e in f32 is about 240 MB).
pub const MAX_MODEL_FILE_BYTES: u64 = 4 << 30;

/// Most members a `.pt` archive may hold. torch.save writes one per tensor storage plus a
/// few (the yolov9t fixture has 1,383); the zip reader indexes every member.
pub const MAX_MEMBERS: usize = 100_000;
/// Largest `data.pkl` accepted (8 MiB, decompressed). The pickles of real YOLOv9 checkpoints
/// are 330-370 KiB (t, s, gelan-t). The parse of a hostile pickle takes up to about 90 bytes of
/// memory per pickle byte (a 16 MiB run of EMPTY_LIST opcodes: 1.5 GB), so this cap keeps the
/// worst case under 1 GB.
pub const MAX_PICKLE_BYTES: u64 = 8 << 20;
/// Largest zip member read (4 GiB, decompressed): more than any tensor storage of a detection
/// model.
pub const MAX_MEMBER_BYTES: u64 = 4 << 30;
/// Largest decompressed/compressed size ratio of a member (1024). torch.save stores members
/// uncompressed (ratio 1); weights that someone re-compressed shrink by less than 2.
pub const MAX_COMPRESSION_RATIO: u64 = 1024;
/// Bytes a `.pt` load may decompress and copy into tensors, per byte of the file (8), on top of
/// [`LOAD_BYTES_FLOOR`]. A torch.save archive holds its storages uncompressed, so a real
/// checkpoint needs about 2 bytes per file byte (the storages, then the tensors cut from them);
/// this budget is what bounds the memory of a load, whatever the file claims.
pub const LOAD_BYTES_PER_FILE_BYTE: u64 = 8;
/// Bytes any `.pt` load may decompress and copy, on top of [`LOAD_BYTES_PER_FILE_BYTE`] (64 MiB).
pub const LOAD_BYTES_FLOOR: u64 = 64 << 20;
/// Most values of the model's `stride` attribute read (a YOLO model has 3 or 4).
const MAX_STRIDES: usize = 64;
/// Deepest module nesting walked for tensors (YOLO tensor names have at most 6 module levels,
/// e.g. `model.22.cv2.0.0.conv`).
const MAX_MODULE_DEPTH: usize = 64;

type Zip<'a> = zip::ZipArchive<std::io::Cursor<&'a [u8]>>;

/// Bytes a load may still decompress and copy.
struct Budget {
    left: u64,
    total: u64,
    file: u64,
}

impl Budget {
    fn for_file(file_len: usize) -> Self {
        let file = file_len as u64;
        let total = file.saturating_mul(LOAD_BYTES_PER_FILE_BYTE).saturating_add(LOAD_BYTES_FLOOR);
        Budget { left: total, total, file }
    }
    fn spend(&mut self, bytes: u64, what: &str) -> Result<(), String> {
        if bytes > self.left {
            return Err(format!(
                "{what} needs {bytes} bytes, over the load budget ({} bytes for a {} byte file, {} left)",
                self.total, self.file, self.left
            ));
        }
        self.left -= bytes;
        Ok(())
    }
}

/// Reads one archive member, at most `max` bytes, charged to the budget. The size in the
/// member's header is checked first, and the stream is cut one byte past it, so a member that
/// lies about its size is caught without reading more.
fn read_member(zip: &mut Zip, name: &str, max: u64, budget: &mut Budget) -> Result<Vec<u8>, String> {
    let f = zip.by_name(name).map_err(|e| format!("`{name}` unreadable ({e})"))?;
    let declared = f.size();
    let cap = max.min(MAX_MEMBER_BYTES).min(f.compressed_size().saturating_mul(MAX_COMPRESSION_RATIO));
    if declared > cap {
        return Err(format!("`{name}` would decompress to {declared} bytes from {}, more than the {cap} allowed", f.compressed_size()));
    }
    budget.spend(declared, &format!("`{name}`"))?;
    let mut buf = Vec::new();
    f.take(declared.saturating_add(1)).read_to_end(&mut buf).map_err(|e| format!("`{name}` unreadable ({e})"))?;
    if buf.len() as u64 != declared {
        return Err(format!("`{name}` holds {} bytes or more, its header says {declared}", buf.len()));
    }
    Ok(buf)
}

/// Element count of a tensor view and the byte just past the last element it reaches, checked
/// against overflow.
fn view_extent(tr: &pickle::TensorRef, elem: u64) -> Result<(u64, u64), String> {
    let overflow = || format!("shape {:?}, stride {:?} and offset {} overflow 64 bits", tr.shape, tr.stride, tr.offset);
    let mut numel: u64 = 1;
    for &d in &tr.shape {
        numel = numel.checked_mul(d as u64).ok_or_else(overflow)?;
    }
    if numel == 0 {
        return Ok((0, 0));
    }
    let mut last = tr.offset as u64;
    for (&d, &s) in tr.shape.iter().zip(&tr.stride) {
        last = (d as u64 - 1).checked_mul(s as u64).and_then(|x| last.checked_add(x)).ok_or_else(overflow)?;
    }
    let end = last.checked_add(1).and_then(|x| x.checked_mul(elem)).ok_or_else(overflow)?;
    Ok((numel, end))
}

/// Copies a tensor view (shape, stride, offset) out of its storage, row-major.
fn gather(tr: &pickle::TensorRef, data: &[u8], es: usize, numel: usize) -> Option<Vec<u8>> {
    if numel == 0 {
        return Some(Vec::new());
    }
    let mut contiguous = true;
    let mut expect = 1usize;
    for (&d, &s) in tr.shape.iter().zip(&tr.stride).rev() {
        if d > 1 && s != expect {
            contiguous = false;
        }
        expect = expect.checked_mul(d)?;
    }
    let start = tr.offset.checked_mul(es)?;
    if contiguous {
        return data.get(start..start.checked_add(numel.checked_mul(es)?)?).map(<[u8]>::to_vec);
    }
    let mut out = Vec::with_capacity(numel.checked_mul(es)?);
    let mut idx = vec![0usize; tr.shape.len()];
    for _ in 0..numel {
        let off = tr.offset + idx.iter().zip(&tr.stride).map(|(i, s)| i * s).sum::<usize>();
        out.extend_from_slice(data.get(off * es..off * es + es)?);
        for d in (0..idx.len()).rev() {
            idx[d] += 1;
            if idx[d] < tr.shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Some(out)
}

fn load_pt(path: &Path, bytes: &[u8]) -> Result<Checkpoint, WeightsError> {
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(|e| not_ckpt(path, format!("damaged zip archive ({e})")))?;
    if zip.len() > MAX_MEMBERS {
        return Err(not_ckpt(path, format!("zip archive of {} members, more than the {MAX_MEMBERS} allowed", zip.len())));
    }
    let mut budget = Budget::for_file(bytes.len());
    let pkl_name = zip
        .file_names()
        .filter_map(|n| n.ok().map(|n| n.into_owned()))
        .find(|n| n.ends_with("data.pkl"))
        .ok_or_else(|| not_ckpt(path, "zip archive without data.pkl (not a torch.save file)"))?;
    let prefix = pkl_name.strip_suffix("data.pkl").unwrap_or("").to_string();
    let pkl = read_member(&mut zip, &pkl_name, MAX_PICKLE_BYTES, &mut budget)
        .map_err(|e| not_ckpt(path, format!("cannot read data.pkl: {e}")))?;
    let root = pickle::parse(&pkl).map_err(|reason| WeightsError::Pickle { path: path.to_owned(), reason })?;
    drop(pkl);

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

    let refs = collect_tensors(&model).map_err(|reason| not_ckpt(path, &reason))?;
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
        let entry = format!("{prefix}data/{}", tr.storage.key);
        let storage_bytes = (tr.storage.numel as u64)
            .checked_mul(es as u64)
            .ok_or_else(|| terr(format!("storage `{entry}` of {} elements overflows 64 bits", tr.storage.numel)))?;
        if !storages.contains_key(&tr.storage.key) {
            let buf = read_member(&mut zip, &entry, MAX_MEMBER_BYTES, &mut budget).map_err(|e| terr(format!("storage {e}")))?;
            storages.insert(tr.storage.key.clone(), buf);
        }
        let data = storages.get(&tr.storage.key).map(Vec::as_slice).unwrap_or_default();
        if (data.len() as u64) < storage_bytes {
            return Err(terr(format!(
                "storage `{entry}` holds {} bytes, {} elements of {es} bytes expected (truncated file?)",
                data.len(),
                tr.storage.numel
            )));
        }
        let (numel, end) = view_extent(&tr, es as u64).map_err(&terr)?;
        if end > data.len() as u64 {
            return Err(terr(format!(
                "view (offset {}, shape {:?}, stride {:?}) reaches byte {end} of a {} byte storage",
                tr.offset,
                tr.shape,
                tr.stride,
                data.len()
            )));
        }
        let out_bytes = numel.checked_mul(es as u64).ok_or_else(|| terr("tensor size overflows 64 bits".into()))?;
        budget.spend(out_bytes, &format!("a tensor of shape {:?}", tr.shape)).map_err(&terr)?;
        let numel = usize::try_from(numel).map_err(|_| terr("tensor too large".into()))?;
        let out = gather(&tr, data, es, numel).ok_or_else(|| terr("tensor view reaches past its storage".into()))?;
        let t = Tensor::from_raw_buffer(&out, dtype, &tr.shape, &Device::Cpu).map_err(|e| terr(e.to_string()))?;
        tensors.insert(name, t);
    }

    let names = model.attr("names").and_then(|n| names_from(&n));
    let imgsz = root.get("train_args").and_then(|a| a.get("imgsz")).and_then(|v| v.as_int()).and_then(|v| usize::try_from(v).ok());
    let stride_attr = model.attr("stride");
    let strides = match &stride_attr {
        Some(Value::Tensor(t)) => {
            let data = read_member(&mut zip, &format!("{prefix}data/{}", t.storage.key), MAX_MEMBER_BYTES, &mut budget).ok();
            data.and_then(|d| small_floats(&d, t))
        }
        _ => None,
    };
    Ok(Checkpoint { path: path.to_owned(), format, tensors, names, imgsz, strides, metadata: BTreeMap::new(), sha256: String::new() })
}

/// Reads a small 1-D float tensor (e.g. the model's strides) into f64 values; `None` when it
/// is not one or does not fit its storage.
fn small_floats(data: &[u8], t: &pickle::TensorRef) -> Option<Vec<f64>> {
    let n = match t.shape.as_slice() {
        [] => 1,
        [n] if *n <= MAX_STRIDES => *n,
        _ => return None,
    };
    let step = t.stride.last().copied().unwrap_or(1);
    (0..n)
        .map(|i| {
            let off = i.checked_mul(step)?.checked_add(t.offset)?;
            let bytes = |w: usize| data.get(off.checked_mul(w)?..off.checked_mul(w)?.checked_add(w)?);
            match t.storage.kind.as_str() {
                "FloatStorage" => Some(f32::from_le_bytes(bytes(4)?.try_into().ok()?) as f64),
                "HalfStorage" => Some(half::f16::from_le_bytes(bytes(2)?.try_into().ok()?).to_f64()),
                "DoubleStorage" => Some(f64::from_le_bytes(bytes(8)?.try_into().ok()?)),
                _ => None,
            }
        })
        .collect()
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

/// Longest tensor name (and so module path) accepted, in bytes. Real names are short
/// (`model.22.cv3.2.2.weight`, under 64 bytes); the bound keeps a file that nests modules under
/// one long memoised key from making names that grow with the square of the depth.
pub const MAX_TENSOR_NAME: usize = 512;
/// Most tensors a checkpoint may name: the largest YOLOv9 (e, unfused) has about 1,900.
pub const MAX_TENSORS: usize = 100_000;
/// Most `_parameters`, `_buffers` and `_modules` entries the walk reads, over all modules
/// (YOLOv9-e: about 4,000). Modules that share one large dict would otherwise cost the product
/// of their counts.
pub const MAX_WALK_ENTRIES: usize = 1_000_000;

/// Walks `_parameters`, `_buffers` and `_modules` like `nn.Module.state_dict()`, iteratively,
/// at most [`MAX_MODULE_DEPTH`] modules deep, and each module once (a module shared by two
/// parents is listed under the first path found, so a graph of shared modules costs its size,
/// not the number of its paths). Names are at most [`MAX_TENSOR_NAME`] bytes, at most
/// [`MAX_TENSORS`] of them are listed and at most [`MAX_WALK_ENTRIES`] entries read, whatever
/// dicts the modules share.
fn collect_tensors(model: &Value) -> Result<Vec<(String, Rc<pickle::TensorRef>)>, String> {
    let too_long = |name: &str| {
        let head: String = name.chars().take(40).collect();
        format!("a tensor or module name of more than {MAX_TENSOR_NAME} bytes (`{}...`)", head.escape_debug())
    };
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut entries = 0usize;
    let mut read = |d: Value| {
        entries = entries.saturating_add(d.item_count().unwrap_or(0));
        if entries > MAX_WALK_ENTRIES {
            return Err(format!("a module graph of more than {MAX_WALK_ENTRIES} entries"));
        }
        Ok(d.pairs())
    };
    let mut todo = vec![(model.clone(), String::new(), 0usize)];
    while let Some((m, prefix, depth)) = todo.pop() {
        if depth > MAX_MODULE_DEPTH || !m.identity().is_some_and(|id| seen.insert(id)) {
            continue;
        }
        for key in ["_parameters", "_buffers"] {
            if let Some(d) = m.attr(key).map(&mut read).transpose()?.flatten() {
                for (k, v) in d {
                    if let (Some(k), Value::Tensor(t)) = (k.as_str(), &v) {
                        if prefix.len() + k.len() > MAX_TENSOR_NAME {
                            return Err(too_long(&format!("{prefix}{k}")));
                        }
                        if out.len() == MAX_TENSORS {
                            return Err(format!("more than {MAX_TENSORS} tensors"));
                        }
                        out.push((format!("{prefix}{k}"), t.clone()));
                    }
                }
            }
        }
        if let Some(d) = m.attr("_modules").map(&mut read).transpose()?.flatten() {
            // reversed, so that the stack pops the modules in their order
            for (k, v) in d.into_iter().rev() {
                if v.identity().is_some_and(|id| seen.contains(&id)) {
                    continue;
                }
                if let Some(k) = k.as_str() {
                    if prefix.len() + k.len() + 1 > MAX_TENSOR_NAME {
                        return Err(too_long(&format!("{prefix}{k}")));
                    }
                    todo.push((v.clone(), format!("{prefix}{k}."), depth + 1));
                }
            }
        }
    }
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_paths_to_devices_and_fifos_are_refused_before_reading() {
        let e = Checkpoint::load(Path::new("/dev/zero")).unwrap_err().to_string();
        assert!(e.contains("/dev/zero") && e.contains("not a regular file"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let e = Checkpoint::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let e = Checkpoint::load(&dir.path().join("missing.pt")).unwrap_err().to_string();
        assert!(e.contains("cannot read"), "{e}");
    }
}
