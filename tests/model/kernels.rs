//! The CUDA kernels (`src/backend/cuda/kernels/`) run on the CPU: `tests/kernels/index_check.cpp`
//! includes the kernel sources under a host stand-in for CUDA (with the device's f16 rounding),
//! runs each launch for every thread of a small grid and compares with direct loops: channel
//! slices and concatenation, upsampling, the input in both layouts, the head's decode into one
//! output, the convolution epilogue in every vector width, channels-last pooling, CBFuse and the
//! score filtering; `tests/kernels/letterbox_jpeg_check.cpp` runs the letterbox on JPEG planes
//! against libjpeg-turbo; and `tests/kernels/nms_check.cpp` runs the device NMS (shared memory and
//! barriers: a host thread per device thread) for a comparison with `postprocess::nms`. The GPU checks the same kernels end to end through the parity steps of
//! `scripts/gpu_run.sh` and `yolo-edge jpeg-selfcheck`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds `tests/kernels/<name>.cpp` with the kernels and the CUDA stand-in on the include path
/// (and `libs` after it), runs it with `args` and asserts it printed "ok".
fn build_and_run(name: &str, libs: &[&str], args: &[PathBuf]) {
    let dir = tempfile::tempdir().unwrap();
    run_built(&build(name, libs, dir.path()), args);
}

/// Runs a harness [`build`] made with `args` and asserts it printed "ok".
fn run_built(exe: &Path, args: &[PathBuf]) {
    let name = exe.file_name().unwrap_or_default().to_string_lossy();
    let ran = Command::new(exe).args(args).output().unwrap();
    let out = String::from_utf8_lossy(&ran.stdout);
    assert!(ran.status.success() && out.starts_with("ok"), "{name} failed:\n{out}");
}

/// Builds `tests/kernels/<name>.cpp` into `dir` and returns the executable.
fn build(name: &str, libs: &[&str], dir: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = dir.join(name);
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let built = Command::new(&cxx)
        // the kernels' `#pragma unroll` is the device compiler's; the vector types are read
        // through each other as on the device; no multiply-add contracted (the device's
        // explicitly rounded operations stay separate)
        .args([
            "-std=c++17",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wno-unknown-pragmas",
            "-fno-strict-aliasing",
            "-ffp-contract=off",
            "-pthread",
        ])
        .arg("-I")
        .arg(root.join("tests/kernels/shim"))
        .arg("-I")
        .arg(root.join("src/backend/cuda/kernels"))
        .arg(root.join(format!("tests/kernels/{name}.cpp")))
        .args(libs)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C++ compiler '{cxx}': {e}"));
    assert!(built.status.success(), "{name}.cpp did not build:\n{}", String::from_utf8_lossy(&built.stderr));
    exe
}

#[test]
fn cuda_kernels_on_the_cpu() {
    build_and_run("index_check", &[], &[]);
}

/// The letterbox kernel reading a JPEG's planes gives libjpeg-turbo's RGB byte for byte (made
/// pictures at 4:4:4, 4:2:2, 4:4:0 and 4:2:0, and the two real photos of the fixtures: a 1080p
/// 4:2:0 and a 4:4:0). Needs libjpeg-turbo's headers and library (`libjpeg62-turbo-dev`).
#[test]
fn letterbox_planes_are_libjpeg_turbo() {
    let photos: Vec<PathBuf> = ["volleyball-court.jpg", "horses.jpg"].into_iter().map(crate::common::fixture).collect();
    build_and_run("letterbox_jpeg_check", &["-ljpeg"], &photos);
}

/// The device NMS (`nms.cu`: the score filter into per-picture rows, the counting sort, the
/// chunked greedy pass with its shared kept list) run on the CPU by `tests/kernels/nms_check.cpp`
/// keeps what `postprocess::nms` keeps, bit for bit and in its order: three pictures of 1500
/// anchors of `postprocess::crowded_output` (five classes, hundreds of tied scores, NaN and
/// infinite scores and sides); thresholds and `max_det`
/// that keep none, one, hundreds and the device's bound (1024), and once with only the best 400
/// candidates entering NMS; f32 and f16 outputs. (`yolo-edge jpeg-selfcheck` checks the same on
/// the GPU.)
#[test]
fn device_nms_is_the_host_nms() {
    use yolo_edge::vision::postprocess::{self, Candidate, Thresholds};
    let dir = tempfile::tempdir().unwrap();
    let exe = build("nms_check", &[], dir.path());
    let (b, nc, a) = (3usize, 5usize, 1500usize);
    let no = 4 + nc;
    let raw = postprocess::crowded_output(b, nc, a);
    let bits = |c: &Candidate| (c.xywh.map(f32::to_bits), c.score.to_bits(), c.class_id);
    let all = postprocess::MAX_NMS;
    for (f16, conf, iou, max_det, max_nms) in [
        (false, 0.25f32, 0.7f32, 300usize, all),
        (false, 0.001, 0.0, 1024, all),
        (false, -1.0, 0.5, 300, 400),
        (false, 0.9, 0.7, 1, all),
        (false, 0.5, 0.7, 0, all),
        (false, 2.0, 0.7, 300, all),
        (true, 0.25, 0.45, 300, all),
    ] {
        let case = format!("f16 {f16}, conf {conf}, iou {iou}, max_det {max_det}, max_nms {max_nms}");
        let values: Vec<f32> = if f16 { raw.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect() } else { raw.clone() };
        let mut file = Vec::new();
        for v in [b, no, a, max_det, max_nms, usize::from(f16)] {
            file.extend((v as u32).to_le_bytes());
        }
        for v in [conf, iou].iter().chain(&values) {
            file.extend(v.to_le_bytes());
        }
        let (case_path, kept_path) = (dir.path().join("case.bin"), dir.path().join("kept.bin"));
        std::fs::write(&case_path, &file).unwrap();
        run_built(&exe, &[case_path, kept_path.clone()]);
        let kept = std::fs::read(&kept_path).unwrap();
        let floats: Vec<f32> = kept[4..].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        let got = postprocess::kept_from_rows(&floats, b);
        let th = Thresholds { conf, iou, max_det };
        let mut kept_in_all = 0;
        let cands = postprocess::candidates_on_host(&values, (b, no, a), conf);
        for (n, (got, cands)) in got.iter().zip(cands).enumerate() {
            let want: Vec<_> = postprocess::nms_of_best(cands, &th, max_nms).iter().map(|(c, _)| bits(c)).collect();
            let got: Vec<_> = got.iter().map(bits).collect();
            assert_eq!(got.len(), want.len(), "{case}: picture {n} kept {} boxes, the host {}", got.len(), want.len());
            if let Some(k) = (0..got.len()).find(|&k| got[k] != want[k]) {
                panic!("{case}: picture {n}, kept box {k}: {:?}, the host's {:?}", got[k], want[k]);
            }
            kept_in_all += want.len();
        }
        match (max_det, conf) {
            (0, _) | (_, 2.0) => assert_eq!(kept_in_all, 0, "{case}"),
            (1, _) => assert_eq!(kept_in_all, b, "{case}"),
            _ => assert!(kept_in_all > 3 * 30, "{case}: {kept_in_all} kept: the case crowds too little"),
        }
    }
}
