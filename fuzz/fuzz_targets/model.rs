//! A model built from a checkpoint's tensors (`YoloV9::from_checkpoint`, what `Detector::load`
//! runs after a file is read): variant recognition, every layer's shape checks, grouped
//! convolutions inferred from weight shapes, BatchNorm folding or an already folded layer, the
//! head's class and box counts; then one pass on a 32x32 picture.
//!
//! The file readers are fuzzed by `pickle_pt` and `safetensors`; here the fuzzer edits the tensor
//! set of a real variant table (t, s or c, seeded random values, made once per process), so it
//! starts from checkpoints that load and works on the names and shapes a damaged or foreign file
//! could carry. The input is a variant byte, a flags byte (bit 0: fold every BatchNorm first, as
//! `yolo-edge convert` writes them; bits 1-2: the stored strides; bits 3-4: the class names), then
//! edits of five bytes each: an operation, a tensor index (two bytes, over the names in order)
//! and two arguments.
//!
//! Property: no panic, and **a model that loads runs**: a pass that fails after a successful load
//! would be a model that fails every picture the agent gives it, which the load must refuse.
#![no_main]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use candle_core::{DType, Device, Tensor};
use libfuzzer_sys::fuzz_target;
use yolo_edge::model::random::random_checkpoint;
use yolo_edge::model::{BuildOptions, Variant, YoloV9};
use yolo_edge::weights::{Checkpoint, SourceFormat};

/// Elements of the tensors the edits make, at most (zeros or one value, f32: 64 MiB).
const MAX_NEW_ELEMENTS: usize = 1 << 24;
/// Edits read from one input, at most.
const MAX_EDITS: usize = 24;
const VARIANTS: [Variant; 3] = [Variant::T, Variant::S, Variant::C];
/// The variant byte picks t five times in eight, s twice, c (with `CBLinear` and `CBFuse`) once:
/// building c takes about 15 times as long as t.
fn variant(byte: u8) -> Variant {
    match byte % 8 {
        0..=4 => Variant::T,
        5 | 6 => Variant::S,
        _ => Variant::C,
    }
}
const DTYPES: [DType; 6] = [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I64, DType::U8];
const FILLS: [f64; 6] = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e30, -1.0, 0.0];
/// Name endings a renamed tensor may get.
const ENDINGS: [&str; 8] =
    ["conv.weight", "conv.bias", "bn.weight", "bn.running_var", "weight", "bias", "cv1.conv.weight", "dfl.conv.weight"];

fn base(v: Variant) -> &'static HashMap<String, Tensor> {
    static BASES: OnceLock<Vec<HashMap<String, Tensor>>> = OnceLock::new();
    let bases = BASES
        .get_or_init(|| VARIANTS.iter().map(|&v| random_checkpoint(v, 7).expect("the variant tables make checkpoints").tensors).collect());
    &bases[VARIANTS.iter().position(|&x| x == v).unwrap()]
}

/// Every convolution's BatchNorm folded in, as `yolo-edge convert` writes it: `P.bn.*` go,
/// `P.conv.bias` (zeros) comes.
fn fold_all(t: &mut HashMap<String, Tensor>) {
    let prefixes: Vec<String> = t.keys().filter_map(|k| k.strip_suffix(".bn.weight")).map(str::to_owned).collect();
    for p in prefixes {
        for s in ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"] {
            t.remove(&format!("{p}.bn.{s}"));
        }
        if let Some(c2) = t.get(&format!("{p}.conv.weight")).and_then(|w| w.dims().first().copied()) {
            t.insert(format!("{p}.conv.bias"), Tensor::zeros(c2, DType::F32, &Device::Cpu).unwrap());
        }
    }
}

fn elements(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

struct Edits<'a> {
    tensors: HashMap<String, Tensor>,
    /// Elements of the tensors made so far.
    made: usize,
    data: &'a [u8],
}

impl Edits<'_> {
    /// Replaces `name` by a tensor of `shape` and `dtype`, every element `fill`, within the
    /// element budget.
    fn make(&mut self, name: String, shape: &[usize], dtype: DType, fill: f64) -> Option<()> {
        let n = elements(shape)?;
        self.made = self.made.checked_add(n).filter(|&m| m <= MAX_NEW_ELEMENTS)?;
        let t = Tensor::full(fill, shape, &Device::Cpu).ok()?.to_dtype(dtype).ok()?;
        self.tensors.insert(name, t);
        Some(())
    }

    /// Every head tensor `model.D.<branch>.L.2.<weight|bias>` (the last convolution of each
    /// level's box or class branch): its output count set to `c2`.
    fn set_head_outputs(&mut self, branch: &str, c2: usize) -> Option<()> {
        let names: Vec<String> = self
            .tensors
            .keys()
            .filter(|k| k.contains(&format!(".{branch}.")) && (k.ends_with(".2.weight") || k.ends_with(".2.bias")))
            .cloned()
            .collect();
        for name in names {
            let (dims, dtype) = {
                let t = &self.tensors[&name];
                (t.dims().to_vec(), t.dtype())
            };
            let Some((_, rest)) = dims.split_first() else { continue };
            let shape: Vec<usize> = std::iter::once(c2).chain(rest.iter().copied()).collect();
            self.make(name, &shape, dtype, 0.0)?;
        }
        Some(())
    }

    fn apply(&mut self, e: &[u8]) -> Option<()> {
        let (op, at, x, y) = (e[0], u16::from_le_bytes([e[1], e[2]]) as usize, e[3], e[4]);
        let mut names: Vec<String> = self.tensors.keys().cloned().collect();
        names.sort_unstable();
        let name = names.get(at % names.len().max(1))?.clone();
        let (dims, dtype) = {
            let t = &self.tensors[&name];
            (t.dims().to_vec(), t.dtype())
        };
        match op % 9 {
            0 => {
                self.tensors.remove(&name);
            }
            // one dimension set to y (0 included)
            1 => {
                let mut shape = dims;
                if shape.is_empty() {
                    shape.push(y as usize);
                } else {
                    let d = x as usize % shape.len();
                    shape[d] = y as usize;
                }
                self.make(name, &shape, dtype, 0.0)?;
            }
            // the rank set to x % 6: dimensions kept, or y added
            2 => {
                let rank = x as usize % 6;
                let shape: Vec<usize> = (0..rank).map(|i| dims.get(i).copied().unwrap_or(y as usize)).collect();
                self.make(name, &shape, dtype, 0.0)?;
            }
            3 => {
                let t = self.tensors[&name].to_dtype(DTYPES[x as usize % DTYPES.len()]).ok()?;
                self.tensors.insert(name, t);
            }
            // a copy under another layer number, or with another ending
            4 => {
                let t = self.tensors[&name].clone();
                let renamed = if y & 1 == 0 {
                    let mut parts: Vec<String> = name.split('.').map(str::to_owned).collect();
                    if parts.len() > 1 {
                        parts[1] = (x % 48).to_string();
                    }
                    parts.join(".")
                } else {
                    let layer: Vec<&str> = name.splitn(3, '.').take(2).collect();
                    format!("{}.{}", layer.join("."), ENDINGS[x as usize % ENDINGS.len()])
                };
                self.tensors.insert(renamed, t);
            }
            5 => self.make(name, &dims, dtype, FILLS[x as usize % FILLS.len()])?,
            // the class count, in every level's class branch
            6 => self.set_head_outputs("cv3", x as usize)?,
            // the box branch's outputs (4 x reg_max)
            7 => self.set_head_outputs("cv2", x as usize)?,
            // a name of the input's own bytes (UTF-8 or not: lossy)
            _ => {
                let len = (x as usize % 16).min(self.data.len());
                let extra = String::from_utf8_lossy(&self.data[..len]).into_owned();
                let t = self.tensors[&name].clone();
                self.tensors.insert(format!("{name}{extra}"), t);
            }
        }
        Some(())
    }
}

fuzz_target!(|data: &[u8]| {
    let [v, flags, rest @ ..] = data else { return };
    let variant = variant(*v);
    let mut tensors = base(variant).clone();
    if flags & 1 == 1 {
        fold_all(&mut tensors);
    }
    let mut edits = Edits { tensors, made: 0, data: rest };
    for e in rest.chunks_exact(5).take(MAX_EDITS) {
        if edits.apply(e).is_none() {
            return; // over the element budget, or an edit with nothing to edit
        }
    }
    let strides = match (flags >> 1) & 3 {
        0 => None,
        1 => Some(vec![8.0, 16.0, 32.0]),
        2 => Some(vec![8.0, 16.0]),
        _ => Some(vec![f64::NAN, -8.0, 1e300]),
    };
    let names = match (flags >> 3) & 3 {
        0 => None,
        1 => Some(Vec::new()),
        2 => Some((0..80).map(|i| format!("c{i}")).collect()),
        _ => Some(vec!["\u{0}".into(); 3]),
    };
    let ck = Checkpoint {
        path: PathBuf::from("fuzz.safetensors"),
        format: if flags & 1 == 1 { SourceFormat::FusedSafetensors } else { SourceFormat::Safetensors },
        tensors: edits.tensors,
        names,
        imgsz: Some(640),
        strides,
        metadata: Default::default(),
        sha256: String::new(),
    };
    let Ok(model) = YoloV9::from_checkpoint(&ck, &BuildOptions::new(Device::Cpu, DType::F32)) else { return };
    let nc = model.info().nc;
    let x = Tensor::zeros((1, 3, 32, 32), DType::F32, &Device::Cpu).unwrap();
    let raw = model.forward(&x).unwrap_or_else(|e| panic!("a model that loaded failed its first pass: {e}"));
    // 32x32 at strides 8, 16 and 32: 16 + 4 + 1 anchors
    assert_eq!(raw.dims(), &[1, 4 + nc, 21], "raw output of a model with {nc} classes");
});
