//! The CUDA kernels (`src/backend/cuda/kernels/`) run on the CPU: `tests/kernels/index_check.cpp`
//! includes the kernel sources under a host stand-in for CUDA (with the device's f16 rounding),
//! runs each launch for every thread of a small grid and compares with direct loops: channel
//! slices and concatenation, upsampling, the input in both layouts, the head's decode into one
//! output, the convolution epilogue in every vector width, channels-last pooling, CBFuse and the
//! score filtering; and `tests/kernels/letterbox_jpeg_check.cpp` runs the letterbox on JPEG planes
//! against libjpeg-turbo. The GPU checks the same kernels end to end through the parity steps of
//! `scripts/gpu_run.sh` and `yolo-edge jpeg-selfcheck`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds `tests/kernels/<name>.cpp` with the kernels and the CUDA stand-in on the include path
/// (and `libs` after it), runs it with `args` and asserts it printed "ok".
fn build_and_run(name: &str, libs: &[&str], args: &[PathBuf]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join(name);
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let built = Command::new(&cxx)
        // the kernels' `#pragma unroll` is the device compiler's; the vector types are read
        // through each other as on the device
        .args(["-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas", "-fno-strict-aliasing"])
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
    let ran = Command::new(&exe).args(args).output().unwrap();
    let out = String::from_utf8_lossy(&ran.stdout);
    assert!(ran.status.success() && out.starts_with("ok"), "{name} failed:\n{out}");
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
