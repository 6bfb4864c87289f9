//! Seeded random YOLOv9 weights, bit-identical to `scripts/make_goldens.py`: a splitmix64 stream
//! keyed by the FNV-1a hash of each tensor's name, scaled by the tensor's role.

use std::collections::HashMap;

use candle_core::{Device, Tensor};

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

fn fnv1a64(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

/// Uniform values in [0, 1) for the stream named `name`.
pub fn uniforms(name: &str, n: usize) -> Vec<f64> {
    let h = fnv1a64(name);
    (0..n as u64)
        .map(|i| {
            let mut z = h.wrapping_add((i + 1).wrapping_mul(GOLDEN));
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 40) as f64 / (1u64 << 24) as f64
        })
        .collect()
}

/// The value rule of the golden script for one state-dict entry; `None` for entries it leaves
/// alone (BatchNorm statistics, which are calibrated, and the fixed DFL projection).
pub fn tensor_for(name: &str, shape: &[usize]) -> Option<Tensor> {
    if name.ends_with("running_mean")
        || name.ends_with("running_var")
        || name.ends_with("num_batches_tracked")
        || name.ends_with("dfl.conv.weight")
    {
        return None;
    }
    let n: usize = shape.iter().product();
    let u = uniforms(name, n);
    let vals: Vec<f32> = if name.ends_with(".bn.weight") {
        u.iter().map(|u| (0.5 + u) as f32).collect()
    } else if name.ends_with(".bn.bias") || (name.ends_with(".bias") && shape.len() == 1) {
        u.iter().map(|u| ((2.0 * u - 1.0) * 0.5) as f32).collect()
    } else if name.ends_with(".weight") && shape.len() == 4 {
        let fan_in = (shape[1] * shape[2] * shape[3]) as f64;
        let g = (3.0 / fan_in).sqrt();
        u.iter().map(|u| ((2.0 * u - 1.0) * g) as f32).collect()
    } else {
        panic!("no seeded rule for {name} {shape:?}");
    };
    Some(Tensor::from_vec(vals, shape, &Device::Cpu).unwrap())
}

/// All seeded tensors of a state dict described as `[name, shape]` pairs, plus the DFL projection.
pub fn state_dict(entries: &[(String, Vec<usize>)]) -> HashMap<String, Tensor> {
    let mut out = HashMap::new();
    for (name, shape) in entries {
        if let Some(t) = tensor_for(name, shape) {
            out.insert(name.clone(), t);
        } else if name.ends_with("dfl.conv.weight") {
            let reg = shape[1];
            out.insert(name.clone(), Tensor::arange(0f32, reg as f32, &Device::Cpu).unwrap().reshape(shape.as_slice()).unwrap());
        }
    }
    out
}

#[test]
fn stream_is_stable() {
    // pinned values (also printed by scripts/make_goldens.py --selftest)
    let u = uniforms("model.0.conv.weight", 3);
    assert!(u.iter().all(|v| (0.0..1.0).contains(v)));
    assert_ne!(u[0], u[1]);
    assert_eq!(fnv1a64(""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a64("a"), 0xaf63_dc4c_8601_ec8c);
}
