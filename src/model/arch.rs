//! The five public YOLOv9 variants as explicit layer tables, transcribed from ultralytics'
//! `ultralytics/cfg/models/v9/yolov9{t,s,m,c,e}.yaml` (the GELAN networks of Wang, Yeh & Liao,
//! "YOLOv9: Learning What You Want to Learn Using Programmable Gradient Information", 2024;
//! WongKinYiu/yolov9 `models/detect/gelan-*.yaml`), and the recognition of a variant from the
//! tensors of a checkpoint.

use serde::Serialize;

/// One layer of the network graph, as a row of the reference's YAML: `[from, 1, module, args]`.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerSpec {
    /// Inputs: -1 is the previous layer, other values are absolute layer indices.
    pub from: Vec<isize>,
    pub kind: Kind,
}

/// The building blocks (ultralytics `nn/modules`), with their YAML arguments.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// `nn.Identity` (yolov9e's layer 0: the input again).
    Identity,
    /// `Conv(c2, k, s)`: conv + BatchNorm + SiLU.
    Conv { c2: usize, k: usize, s: usize },
    /// `ELAN1(c2, c3, c4)`.
    Elan1 { c2: usize, c3: usize, c4: usize },
    /// `RepNCSPELAN4(c2, c3, c4, n)`.
    RepNcspElan4 { c2: usize, c3: usize, c4: usize, n: usize },
    /// `AConv(c2)`: avg-pool 2x2/1 then a 3x3/2 conv.
    AConv { c2: usize },
    /// `ADown(c2)`.
    ADown { c2: usize },
    /// `SPPELAN(c2, c3)` with 5x5 max-pools.
    Sppelan { c2: usize, c3: usize },
    /// `nn.Upsample(None, 2, "nearest")`.
    Upsample,
    /// `Concat(1)`.
    Concat,
    /// `CBLinear(c2s)`: one 1x1 conv split into several outputs.
    CbLinear { c2s: Vec<usize> },
    /// `CBFuse(idx)`: sum of nearest-resized picks of earlier CBLinear outputs and the last input.
    CbFuse { idx: Vec<usize> },
    /// `Detect(nc)` on the listed levels.
    Detect,
}

/// A YOLOv9 variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    T,
    S,
    M,
    C,
    E,
}

impl Variant {
    pub const ALL: [Variant; 5] = [Variant::T, Variant::S, Variant::M, Variant::C, Variant::E];

    pub fn name(self) -> &'static str {
        match self {
            Variant::T => "yolov9t",
            Variant::S => "yolov9s",
            Variant::M => "yolov9m",
            Variant::C => "yolov9c",
            Variant::E => "yolov9e",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim().to_ascii_lowercase();
        let s = s.trim_start_matches("yolov9").trim_start_matches("gelan").trim_start_matches('-');
        Self::ALL.into_iter().find(|v| v.name().ends_with(s) && s.len() == 1)
    }

    /// The layer table of this variant.
    pub fn layers(self) -> Vec<LayerSpec> {
        match self {
            Variant::T => gelan_small(16, 32, [32, 32, 16], [64, 96, 128], 64, [48, 64]),
            Variant::S => gelan_small(32, 64, [64, 64, 32], [128, 192, 256], 128, [96, 128]),
            Variant::M => yolov9m(),
            Variant::C => yolov9c(),
            Variant::E => yolov9e(),
        }
    }
}

fn l(from: &[isize], kind: Kind) -> LayerSpec {
    LayerSpec { from: from.to_vec(), kind }
}
fn conv(c2: usize, k: usize, s: usize) -> Kind {
    Kind::Conv { c2, k, s }
}
fn rep(c2: usize, c3: usize, c4: usize, n: usize) -> Kind {
    Kind::RepNcspElan4 { c2, c3, c4, n }
}
/// RepNCSPELAN4 with the `[c, c, c/2, n]` argument pattern used throughout t/s/m.
fn rep_c(c: usize, n: usize) -> Kind {
    rep(c, c, c / 2, n)
}

/// yolov9t and yolov9s share one topology (ELAN1 stem, AConv downsampling, n=3).
fn gelan_small(c0: usize, c1: usize, elan: [usize; 3], p: [usize; 3], spp: usize, down: [usize; 2]) -> Vec<LayerSpec> {
    let [p3, p4, p5] = p;
    vec![
        l(&[-1], conv(c0, 3, 2)),                                        // 0-P1/2
        l(&[-1], conv(c1, 3, 2)),                                        // 1-P2/4
        l(&[-1], Kind::Elan1 { c2: elan[0], c3: elan[1], c4: elan[2] }), // 2
        l(&[-1], Kind::AConv { c2: p3 }),                                // 3-P3/8
        l(&[-1], rep_c(p3, 3)),                                          // 4
        l(&[-1], Kind::AConv { c2: p4 }),                                // 5-P4/16
        l(&[-1], rep_c(p4, 3)),                                          // 6
        l(&[-1], Kind::AConv { c2: p5 }),                                // 7-P5/32
        l(&[-1], rep_c(p5, 3)),                                          // 8
        l(&[-1], Kind::Sppelan { c2: p5, c3: spp }),                     // 9
        l(&[-1], Kind::Upsample),                                        // 10
        l(&[-1, 6], Kind::Concat),                                       // 11
        l(&[-1], rep_c(p4, 3)),                                          // 12
        l(&[-1], Kind::Upsample),                                        // 13
        l(&[-1, 4], Kind::Concat),                                       // 14
        l(&[-1], rep_c(p3, 3)),                                          // 15 (P3/8)
        l(&[-1], Kind::AConv { c2: down[0] }),                           // 16
        l(&[-1, 12], Kind::Concat),                                      // 17
        l(&[-1], rep_c(p4, 3)),                                          // 18 (P4/16)
        l(&[-1], Kind::AConv { c2: down[1] }),                           // 19
        l(&[-1, 9], Kind::Concat),                                       // 20
        l(&[-1], rep_c(p5, 3)),                                          // 21 (P5/32)
        l(&[15, 18, 21], Kind::Detect),                                  // 22
    ]
}

fn yolov9m() -> Vec<LayerSpec> {
    vec![
        l(&[-1], conv(32, 3, 2)),
        l(&[-1], conv(64, 3, 2)),
        l(&[-1], rep(128, 128, 64, 1)),
        l(&[-1], Kind::AConv { c2: 240 }),
        l(&[-1], rep_c(240, 1)),
        l(&[-1], Kind::AConv { c2: 360 }),
        l(&[-1], rep_c(360, 1)),
        l(&[-1], Kind::AConv { c2: 480 }),
        l(&[-1], rep_c(480, 1)),
        l(&[-1], Kind::Sppelan { c2: 480, c3: 240 }),
        l(&[-1], Kind::Upsample),
        l(&[-1, 6], Kind::Concat),
        l(&[-1], rep_c(360, 1)),
        l(&[-1], Kind::Upsample),
        l(&[-1, 4], Kind::Concat),
        l(&[-1], rep_c(240, 1)),
        // the YAML says 180; parse_model rounds every layer's c2 up to a multiple of 8
        l(&[-1], Kind::AConv { c2: 184 }),
        l(&[-1, 12], Kind::Concat),
        l(&[-1], rep_c(360, 1)),
        l(&[-1], Kind::AConv { c2: 240 }),
        l(&[-1, 9], Kind::Concat),
        l(&[-1], rep_c(480, 1)),
        l(&[15, 18, 21], Kind::Detect),
    ]
}

fn yolov9c() -> Vec<LayerSpec> {
    vec![
        l(&[-1], conv(64, 3, 2)),
        l(&[-1], conv(128, 3, 2)),
        l(&[-1], rep(256, 128, 64, 1)),
        l(&[-1], Kind::ADown { c2: 256 }),
        l(&[-1], rep(512, 256, 128, 1)),
        l(&[-1], Kind::ADown { c2: 512 }),
        l(&[-1], rep(512, 512, 256, 1)),
        l(&[-1], Kind::ADown { c2: 512 }),
        l(&[-1], rep(512, 512, 256, 1)),
        l(&[-1], Kind::Sppelan { c2: 512, c3: 256 }),
        l(&[-1], Kind::Upsample),
        l(&[-1, 6], Kind::Concat),
        l(&[-1], rep(512, 512, 256, 1)),
        l(&[-1], Kind::Upsample),
        l(&[-1, 4], Kind::Concat),
        l(&[-1], rep(256, 256, 128, 1)),
        l(&[-1], Kind::ADown { c2: 256 }),
        l(&[-1, 12], Kind::Concat),
        l(&[-1], rep(512, 512, 256, 1)),
        l(&[-1], Kind::ADown { c2: 512 }),
        l(&[-1, 9], Kind::Concat),
        l(&[-1], rep(512, 512, 256, 1)),
        l(&[15, 18, 21], Kind::Detect),
    ]
}

fn yolov9e() -> Vec<LayerSpec> {
    let cbf = |idx: &[usize]| Kind::CbFuse { idx: idx.to_vec() };
    let cbl = |c2s: &[usize]| Kind::CbLinear { c2s: c2s.to_vec() };
    vec![
        l(&[-1], Kind::Identity),                            // 0
        l(&[-1], conv(64, 3, 2)),                            // 1-P1/2
        l(&[-1], conv(128, 3, 2)),                           // 2-P2/4
        l(&[-1], rep(256, 128, 64, 2)),                      // 3
        l(&[-1], Kind::ADown { c2: 256 }),                   // 4-P3/8
        l(&[-1], rep(512, 256, 128, 2)),                     // 5
        l(&[-1], Kind::ADown { c2: 512 }),                   // 6-P4/16
        l(&[-1], rep(1024, 512, 256, 2)),                    // 7
        l(&[-1], Kind::ADown { c2: 1024 }),                  // 8-P5/32
        l(&[-1], rep(1024, 512, 256, 2)),                    // 9
        l(&[1], cbl(&[64])),                                 // 10
        l(&[3], cbl(&[64, 128])),                            // 11
        l(&[5], cbl(&[64, 128, 256])),                       // 12
        l(&[7], cbl(&[64, 128, 256, 512])),                  // 13
        l(&[9], cbl(&[64, 128, 256, 512, 1024])),            // 14
        l(&[0], conv(64, 3, 2)),                             // 15-P1/2
        l(&[10, 11, 12, 13, 14, -1], cbf(&[0, 0, 0, 0, 0])), // 16
        l(&[-1], conv(128, 3, 2)),                           // 17-P2/4
        l(&[11, 12, 13, 14, -1], cbf(&[1, 1, 1, 1])),        // 18
        l(&[-1], rep(256, 128, 64, 2)),                      // 19
        l(&[-1], Kind::ADown { c2: 256 }),                   // 20-P3/8
        l(&[12, 13, 14, -1], cbf(&[2, 2, 2])),               // 21
        l(&[-1], rep(512, 256, 128, 2)),                     // 22
        l(&[-1], Kind::ADown { c2: 512 }),                   // 23-P4/16
        l(&[13, 14, -1], cbf(&[3, 3])),                      // 24
        l(&[-1], rep(1024, 512, 256, 2)),                    // 25
        l(&[-1], Kind::ADown { c2: 1024 }),                  // 26-P5/32
        l(&[14, -1], cbf(&[4])),                             // 27
        l(&[-1], rep(1024, 512, 256, 2)),                    // 28
        l(&[-1], Kind::Sppelan { c2: 512, c3: 256 }),        // 29
        l(&[-1], Kind::Upsample),                            // 30
        l(&[-1, 25], Kind::Concat),                          // 31
        l(&[-1], rep(512, 512, 256, 2)),                     // 32
        l(&[-1], Kind::Upsample),                            // 33
        l(&[-1, 22], Kind::Concat),                          // 34
        l(&[-1], rep(256, 256, 128, 2)),                     // 35 (P3/8)
        l(&[-1], Kind::ADown { c2: 256 }),                   // 36
        l(&[-1, 32], Kind::Concat),                          // 37
        l(&[-1], rep(512, 512, 256, 2)),                     // 38 (P4/16)
        l(&[-1], Kind::ADown { c2: 512 }),                   // 39
        l(&[-1, 29], Kind::Concat),                          // 40
        l(&[-1], rep(512, 1024, 512, 2)),                    // 41 (P5/32)
        l(&[35, 38, 41], Kind::Detect),                      // 42
    ]
}

/// Output channels of every layer (`parse_model`'s `ch` list); CBLinear layers have several.
pub fn channels(layers: &[LayerSpec], input: usize) -> Vec<Vec<usize>> {
    let mut ch: Vec<Vec<usize>> = Vec::with_capacity(layers.len());
    for (i, layer) in layers.iter().enumerate() {
        let src = |f: isize, ch: &Vec<Vec<usize>>| -> Vec<usize> {
            if f < 0 {
                if i == 0 {
                    vec![input]
                } else {
                    ch[i - 1].clone()
                }
            } else {
                ch[f as usize].clone()
            }
        };
        let c = match &layer.kind {
            Kind::Identity | Kind::Upsample => src(layer.from[0], &ch),
            Kind::Conv { c2, .. }
            | Kind::Elan1 { c2, .. }
            | Kind::RepNcspElan4 { c2, .. }
            | Kind::AConv { c2 }
            | Kind::ADown { c2 }
            | Kind::Sppelan { c2, .. } => vec![*c2],
            Kind::Concat => vec![layer.from.iter().map(|&f| src(f, &ch)[0]).sum()],
            Kind::CbLinear { c2s } => c2s.clone(),
            Kind::CbFuse { .. } => src(*layer.from.last().unwrap(), &ch),
            Kind::Detect => vec![0],
        };
        ch.push(c);
    }
    ch
}

/// Recognises the variant from the checkpoint's tensor names and shapes: the layer count and the
/// output channels of every parameterised layer must match the table.
pub fn detect_variant(shape_of: &dyn Fn(&str) -> Option<Vec<usize>>) -> Result<Variant, String> {
    let mut tried = Vec::new();
    for v in Variant::ALL {
        let layers = v.layers();
        let ch = channels(&layers, 3);
        let detect = layers.len() - 1;
        let head = format!("model.{detect}.cv2.0.0.conv.weight");
        let past = format!("model.{}.", detect + 1);
        let mut ok = shape_of(&head).is_some() && shape_of(&format!("{past}conv.weight")).is_none();
        for (i, layer) in layers.iter().enumerate().take(detect) {
            if !ok {
                break;
            }
            let probe = match &layer.kind {
                Kind::Conv { .. } => Some((format!("model.{i}.conv.weight"), ch[i][0])),
                Kind::Elan1 { .. } | Kind::RepNcspElan4 { .. } => Some((format!("model.{i}.cv4.conv.weight"), ch[i][0])),
                Kind::AConv { .. } => Some((format!("model.{i}.cv1.conv.weight"), ch[i][0])),
                Kind::ADown { .. } => Some((format!("model.{i}.cv1.conv.weight"), ch[i][0] / 2)),
                Kind::Sppelan { .. } => Some((format!("model.{i}.cv5.conv.weight"), ch[i][0])),
                Kind::CbLinear { .. } => Some((format!("model.{i}.conv.weight"), ch[i].iter().sum())),
                _ => None,
            };
            if let Some((name, c_out)) = probe {
                ok = shape_of(&name).map(|s| s.first() == Some(&c_out)).unwrap_or(false);
            }
        }
        if ok {
            return Ok(v);
        }
        tried.push(v.name());
    }
    Err(format!(
        "the tensors match none of {} (expected `model.N.` layers of a YOLOv9 detection model; first conv: {:?})",
        tried.join(", "),
        shape_of("model.0.conv.weight").or_else(|| shape_of("model.1.conv.weight"))
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variant_names_parse() {
        assert_eq!(Variant::parse("yolov9t"), Some(Variant::T));
        assert_eq!(Variant::parse("gelan-c"), Some(Variant::C));
        assert_eq!(Variant::parse("e"), Some(Variant::E));
        assert_eq!(Variant::parse("yolov8n"), None);
    }

    #[test]
    fn channels_follow_parse_model() {
        let ch = channels(&Variant::T.layers(), 3);
        assert_eq!(ch[11], vec![128 + 96]); // concat of upsampled SPPELAN (128) and layer 6 (96)
        assert_eq!(ch[15], vec![64]);
        let ch = channels(&Variant::E.layers(), 3);
        assert_eq!(ch[0], vec![3]);
        assert_eq!(ch[14], vec![64, 128, 256, 512, 1024]);
        assert_eq!(ch[16], vec![64]);
        assert_eq!(ch[41], vec![512]);
    }
}
