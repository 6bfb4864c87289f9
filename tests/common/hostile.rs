//! Hostile model files, written opcode by opcode: pickles and torch.save-like zip archives
//! built to attack the loader (deep nesting, shared and cyclic graphs, impossible tensors, zip
//! bombs). Shared by the one-shot loader tests (`tests/model/bad_input.rs`) and the running
//! agent's tests (`tests/agent.rs`).
#![allow(dead_code)]

use std::io::Write;

/// A protocol-2 pickle, written opcode by opcode.
pub struct Pickle(pub Vec<u8>);

impl Pickle {
    pub fn new() -> Self {
        Pickle(b"\x80\x02".to_vec())
    }
    pub fn raw(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    pub fn str(self, s: &str) -> Self {
        self.raw(b"X").raw(&(s.len() as u32).to_le_bytes()).raw(s.as_bytes())
    }
    pub fn int(self, i: i64) -> Self {
        self.raw(b"\x8a\x08").raw(&i.to_le_bytes())
    }
    pub fn ints(self, v: &[i64]) -> Self {
        v.iter().fold(self.raw(b"("), |p, &i| p.int(i)).raw(b"t")
    }
    pub fn global(self, module: &str, name: &str) -> Self {
        self.raw(format!("c{module}\n{name}\n").as_bytes())
    }
    pub fn memo_put(self, k: u32) -> Self {
        self.raw(b"r").raw(&k.to_le_bytes())
    }
    pub fn memo_get(self, k: u32) -> Self {
        self.raw(b"j").raw(&k.to_le_bytes())
    }
    /// `_rebuild_tensor_v2(storage, offset, shape, stride)` on float storage `key` of `numel` elements.
    pub fn tensor(self, key: &str, numel: i64, offset: i64, shape: &[i64], stride: &[i64]) -> Self {
        self.global("torch._utils", "_rebuild_tensor_v2")
            .raw(b"((")
            .str("storage")
            .global("torch", "FloatStorage")
            .str(key)
            .str("cpu")
            .int(numel)
            .raw(b"tQ")
            .int(offset)
            .ints(shape)
            .ints(stride)
            .raw(b"tR")
    }
    /// An object of `class` with an empty state dict on the stack (closed by BUILD, `b`).
    pub fn module(self, class: &str) -> Self {
        let (m, n) = class.rsplit_once('.').unwrap();
        self.global(m, n).raw(b")\x81}")
    }
}

pub const DETECTION_MODEL: &str = "ultralytics.nn.tasks.DetectionModel";

/// A DetectionModel whose `_parameters` holds one tensor `w`, written by `tensor`.
pub fn model_with(tensor: impl FnOnce(Pickle) -> Pickle) -> Vec<u8> {
    tensor(Pickle::new().module(DETECTION_MODEL).str("_parameters").raw(b"}").str("w")).raw(b"ssb.").0
}

/// A torch.save-like zip archive (`m/data.pkl`, `m/data/<key>`), members stored.
pub fn pt(pkl: &[u8], storages: &[(&str, &[u8])]) -> Vec<u8> {
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let stored = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    z.start_file("m/data.pkl", stored).unwrap();
    z.write_all(pkl).unwrap();
    for (key, data) in storages {
        z.start_file(format!("m/data/{key}"), stored).unwrap();
        z.write_all(data).unwrap();
    }
    z.finish().unwrap().into_inner()
}

/// An archive whose member `name` is `mib` MiB of zeros, deflated (about 1 KiB per MiB).
pub fn zip_bomb(pkl: &[u8], name: &str, mib: usize) -> Vec<u8> {
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let deflated = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    if name != "data.pkl" {
        z.start_file("m/data.pkl", deflated).unwrap();
        z.write_all(pkl).unwrap();
    }
    z.start_file(format!("m/{name}"), deflated).unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..mib {
        z.write_all(&zeros).unwrap();
    }
    z.finish().unwrap().into_inner()
}

/// Lists nested `n` deep.
pub fn nested_lists(n: usize) -> Vec<u8> {
    pt(&[&b"\x80\x02"[..], &vec![b']'; n], &vec![b'a'; n - 1], b"."].concat(), &[])
}

/// Tuples nested `n` deep.
pub fn nested_tuples(n: usize) -> Vec<u8> {
    pt(&[&b"\x80\x02N"[..], &vec![0x85; n], b"."].concat(), &[])
}

/// A chain of `n` lists linked through the memo, so that no single step looks deep.
pub fn memo_chain(n: u32) -> Vec<u8> {
    let mut p = Pickle::new();
    for i in 0..=n {
        p = p.raw(b"]").memo_put(i).raw(b"0");
    }
    for i in 0..n {
        p = p.memo_get(i).memo_get(i + 1).raw(b"a0");
    }
    pt(&p.memo_get(0).raw(b".").0, &[])
}

/// Two dicts merged into each other by BUILD in turn: Fibonacci growth, 2^100 items by the end.
pub fn build_doubling() -> Vec<u8> {
    let mut p = Pickle::new().raw(b"})K\x00s").memo_put(1).raw(b"})K\x00s").memo_put(2);
    for _ in 0..140 {
        p = p.memo_get(1).memo_get(2).raw(b"b0").memo_get(2).memo_get(1).raw(b"b0");
    }
    pt(&p.memo_get(1).raw(b".").0, &[])
}

/// Module i holds module i-1 twice (`a` and `b`): 2^levels paths to the one tensor.
pub fn shared_modules(levels: u32) -> Vec<u8> {
    let mut p = Pickle::new()
        .module("torch.nn.modules.module.Module")
        .str("_parameters")
        .raw(b"}")
        .str("w")
        .tensor("0", 10, 0, &[10], &[1])
        .raw(b"ssb")
        .memo_put(0)
        .raw(b"0");
    for i in 1..=levels {
        p = p
            .module("torch.nn.modules.module.Module")
            .str("_modules")
            .raw(b"}(")
            .str("a")
            .memo_get(i - 1)
            .str("b")
            .memo_get(i - 1)
            .raw(b"usb")
            .memo_put(i)
            .raw(b"0");
    }
    let pkl = p.module(DETECTION_MODEL).str("_modules").raw(b"}").str("model").memo_get(levels).raw(b"ssb.").0;
    pt(&pkl, &[("0", &[0u8; 40])])
}

/// A DetectionModel whose `_modules` holds the model itself: a cycle.
pub fn self_module() -> Vec<u8> {
    let (m, n) = DETECTION_MODEL.rsplit_once('.').unwrap();
    let pkl =
        Pickle::new().global(m, n).raw(b")\x81").memo_put(0).raw(b"}").str("_modules").raw(b"}").str("model").memo_get(0).raw(b"ssb.").0;
    pt(&pkl, &[])
}

/// 256 MiB of tensor storage deflated into a few hundred KiB.
pub fn storage_bomb() -> Vec<u8> {
    let pkl = model_with(|p| p.tensor("0", 64 << 20, 0, &[64 << 20], &[1]));
    zip_bomb(&pkl, "data/0", 256)
}

/// A tensor of 10^12 elements on a storage of ten.
pub fn trillion_elements() -> Vec<u8> {
    pt(&model_with(|p| p.tensor("0", 10, 0, &[1_000_000, 1_000_000], &[1_000_000, 1])), &[("0", &[0u8; 40])])
}

/// Modules nested `levels` deep, each under one long memoised key of `key_len` bytes, every one
/// holding the same `_parameters` dict of `tensors` entries: listed without bounds, the names
/// alone would take about levels² x tensors x key_len / 2 bytes (16 GiB for 64, 1000, 8000),
/// from a file of a few KiB.
pub fn long_module_paths(levels: u32, tensors: u32, key_len: usize) -> Vec<u8> {
    const MODULE: &str = "torch.nn.modules.module.Module";
    // memo 0: the tensor, 1: the long key, 2: the shared `_parameters`, 3 + i: module i
    let mut p = Pickle::new().tensor("0", 10, 0, &[10], &[1]).memo_put(0).raw(b"0").str(&"k".repeat(key_len)).memo_put(1).raw(b"0");
    p = p.raw(b"}(");
    for i in 0..tensors {
        p = p.str(&format!("w{i}")).memo_get(0);
    }
    p = p.raw(b"u").memo_put(2).raw(b"0");
    p = p.module(MODULE).str("_parameters").memo_get(2).raw(b"sb").memo_put(3).raw(b"0");
    for i in 1..levels {
        p = p
            .module(MODULE)
            .str("_parameters")
            .memo_get(2)
            .raw(b"s")
            .str("_modules")
            .raw(b"}")
            .memo_get(1)
            .memo_get(3 + i - 1)
            .raw(b"ssb")
            .memo_put(3 + i)
            .raw(b"0");
    }
    let pkl = p.module(DETECTION_MODEL).str("_modules").raw(b"}").str("model").memo_get(3 + levels - 1).raw(b"ssb.").0;
    pt(&pkl, &[("0", &[0u8; 40])])
}

/// `modules` modules that all share one `_modules` dict holding every one of them: each module
/// is walked once, but reading the shared dict anew for each would cost modules² entries.
pub fn shared_modules_dict(modules: u32) -> Vec<u8> {
    const MODULE: &str = "torch.nn.modules.module.Module";
    // memo 0: the shared `_modules` dict, 1 + i: module i
    let mut p = Pickle::new().raw(b"}").memo_put(0).raw(b"0");
    for i in 0..modules {
        p = p.module(MODULE).str("_modules").memo_get(0).raw(b"sb").memo_put(1 + i).raw(b"0");
    }
    // fill the shared dict: SETITEMS on it, after every module exists
    p = p.memo_get(0).raw(b"(");
    for i in 0..modules {
        p = p.str(&format!("m{i}")).memo_get(1 + i);
    }
    p = p.raw(b"u0");
    let pkl = p.module(DETECTION_MODEL).str("_modules").memo_get(0).raw(b"sb.").0;
    pt(&pkl, &[])
}
