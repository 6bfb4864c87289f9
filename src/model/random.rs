//! Full-size YOLOv9 models with seeded random weights, for speed and memory measurements where
//! no checkpoint is at hand (`--model random:yolov9e`).
//!
//! The tensor names and shapes of each variant come from ultralytics' own state dict
//! (`src/assets/manifests/yolov9{t,s,m,c,e}.json`, written by `scripts/make_shape_manifests.py`),
//! so the model is built through the ordinary checkpoint loader. Values: convolution weights
//! uniform in ±sqrt(3 / fan_in) (unit-variance preserving), BatchNorm gamma 1, beta small,
//! running mean 0 and variance 1, the DFL projection 0..reg_max-1. The detections of such a
//! model mean nothing; its speed and memory are those of the real architecture.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use candle_core::{Device, Tensor};
use serde::Deserialize;

use crate::model::Variant;
use crate::weights::{Checkpoint, SourceFormat};

/// Why a random model could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RandomModelError {
    #[error("`{0}` is not a random model spec (expected random:yolov9t|s|m|c|e)")]
    BadSpec(String),
    #[error("shape manifest of {variant} is damaged: {reason}")]
    Manifest { variant: &'static str, reason: String },
    #[error("creating tensor {name}: {source}")]
    Tensor { name: String, source: candle_core::Error },
}

#[derive(Deserialize)]
struct Manifest {
    tensors: Vec<(String, Vec<usize>)>,
}

fn manifest_text(v: Variant) -> &'static str {
    match v {
        Variant::T => include_str!("../assets/manifests/yolov9t.json"),
        Variant::S => include_str!("../assets/manifests/yolov9s.json"),
        Variant::M => include_str!("../assets/manifests/yolov9m.json"),
        Variant::C => include_str!("../assets/manifests/yolov9c.json"),
        Variant::E => include_str!("../assets/manifests/yolov9e.json"),
    }
}

/// Parses `random:yolov9e` (also `random:e`); `None` when `spec` is not a random-model spec.
pub fn parse_spec(spec: &str) -> Option<Result<Variant, RandomModelError>> {
    let rest = spec.strip_prefix("random:")?;
    Some(Variant::parse(rest).ok_or_else(|| RandomModelError::BadSpec(spec.to_string())))
}

/// splitmix64 stream: uniform values in [0, 1).
struct SplitMix(u64);

impl SplitMix {
    fn next_f32(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u32 << 24) as f32
    }
}

fn fnv1a64(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

/// The value of every element of one state-dict entry.
fn values(name: &str, shape: &[usize], seed: u64) -> Vec<f32> {
    let n: usize = shape.iter().product();
    let mut rng = SplitMix(fnv1a64(name) ^ seed);
    let mut uni = |lo: f32, hi: f32| (0..n).map(|_| lo + (hi - lo) * rng.next_f32()).collect::<Vec<f32>>();
    if name.ends_with("running_mean") {
        vec![0.0; n]
    } else if name.ends_with("running_var") {
        vec![1.0; n]
    } else if name.ends_with("dfl.conv.weight") {
        (0..n).map(|i| i as f32).collect()
    } else if name.ends_with(".bn.weight") {
        uni(0.9, 1.1)
    } else if name.ends_with(".bias") && shape.len() == 1 {
        uni(-0.1, 0.1)
    } else if shape.len() == 4 {
        let fan_in = (shape[1] * shape[2] * shape[3]).max(1) as f32;
        let g = (3.0 / fan_in).sqrt();
        uni(-g, g)
    } else {
        uni(-0.1, 0.1)
    }
}

/// A checkpoint of `variant` (80 classes) with seeded random values, on the CPU in FP32.
pub fn random_checkpoint(variant: Variant, seed: u64) -> Result<Checkpoint, RandomModelError> {
    let m: Manifest = serde_json::from_str(manifest_text(variant))
        .map_err(|e| RandomModelError::Manifest { variant: variant.name(), reason: e.to_string() })?;
    if m.tensors.is_empty() {
        return Err(RandomModelError::Manifest { variant: variant.name(), reason: "no tensors".into() });
    }
    let mut tensors = HashMap::with_capacity(m.tensors.len());
    for (name, shape) in m.tensors {
        let t = Tensor::from_vec(values(&name, &shape, seed), shape.as_slice(), &Device::Cpu)
            .map_err(|source| RandomModelError::Tensor { name: name.clone(), source })?;
        tensors.insert(name, t);
    }
    let mut metadata = BTreeMap::new();
    metadata.insert("random_weights".to_string(), format!("seed={seed}"));
    Ok(Checkpoint {
        path: PathBuf::from(format!("random:{}", variant.name())),
        format: SourceFormat::Safetensors,
        tensors,
        names: None,
        imgsz: Some(640),
        strides: None,
        metadata,
        sha256: format!("random-{}-seed{seed}", variant.name()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs() {
        assert!(matches!(parse_spec("random:yolov9e"), Some(Ok(Variant::E))));
        assert!(matches!(parse_spec("random:t"), Some(Ok(Variant::T))));
        assert!(matches!(parse_spec("random:yolov9x"), Some(Err(RandomModelError::BadSpec(_)))));
        assert!(parse_spec("model.pt").is_none());
    }

    #[test]
    fn values_are_seeded_and_bounded() {
        let a = values("model.0.conv.weight", &[16, 3, 3, 3], 1);
        let b = values("model.0.conv.weight", &[16, 3, 3, 3], 1);
        let c = values("model.0.conv.weight", &[16, 3, 3, 3], 2);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let g = (3.0f32 / 27.0).sqrt();
        assert!(a.iter().all(|v| v.abs() <= g));
        assert!(values("model.1.bn.running_var", &[4], 0).iter().all(|&v| v == 1.0));
        assert_eq!(values("model.22.dfl.conv.weight", &[1, 16, 1, 1], 0)[15], 15.0);
    }

    #[test]
    fn every_manifest_has_the_variants_parameter_count() {
        // element counts of ultralytics' 80-class state dicts (BN statistics included, counters not)
        for (v, want) in [
            (Variant::T, 2_144_688usize),
            (Variant::S, 7_349_152),
            (Variant::M, 20_258_872),
            (Variant::C, 25_643_136),
            (Variant::E, 58_307_968),
        ] {
            let m: Manifest = serde_json::from_str(manifest_text(v)).unwrap();
            let n: usize = m.tensors.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
            assert_eq!(n, want, "{}", v.name());
        }
    }

    #[test]
    fn random_t_builds_and_runs() {
        let _memory = crate::process_memory_test_lock();
        use crate::model::{BuildOptions, YoloV9};
        let ck = random_checkpoint(Variant::T, 0).unwrap();
        let m = YoloV9::from_checkpoint(&ck, &BuildOptions::new(Device::Cpu, candle_core::DType::F32)).unwrap();
        assert_eq!(m.info().variant, Variant::T);
        let x = Tensor::rand(0f32, 1f32, (1, 3, 64, 64), &Device::Cpu).unwrap();
        let y = m.forward(&x).unwrap();
        assert_eq!(y.dims(), &[1, 84, 8 * 8 + 4 * 4 + 2 * 2]);
        let v: Vec<f32> = y.flatten_all().unwrap().to_vec1().unwrap();
        assert!(v.iter().all(|x| x.is_finite()));
    }
}
