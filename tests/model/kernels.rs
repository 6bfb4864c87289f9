//! The CUDA kernels (`src/backend/cuda/kernels/`) run on the CPU: `tests/kernels/index_check.cpp`
//! includes the kernel sources under a host stand-in for CUDA (with the device's f16 rounding),
//! runs each launch for every thread of a small grid and compares with direct loops: channel
//! slices and concatenation, upsampling, the input in both layouts, the head's decode into one
//! output, the convolution epilogue in every vector width, channels-last pooling, CBFuse and the
//! score filtering. The GPU checks the same kernels end to end through the parity steps of
//! `scripts/gpu_run.sh`.

use std::path::Path;
use std::process::Command;

#[test]
fn cuda_kernels_on_the_cpu() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("index_check");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let built = Command::new(&cxx)
        // the kernels' `#pragma unroll` is the device compiler's; the vector types are read
        // through each other as on the device
        .args(["-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas", "-fno-strict-aliasing"])
        .arg("-I")
        .arg(root.join("tests/kernels/shim"))
        .arg("-I")
        .arg(root.join("src/backend/cuda/kernels"))
        .arg(root.join("tests/kernels/index_check.cpp"))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C++ compiler '{cxx}': {e}"));
    assert!(built.status.success(), "index_check.cpp did not build:\n{}", String::from_utf8_lossy(&built.stderr));
    let ran = Command::new(&exe).output().unwrap();
    let out = String::from_utf8_lossy(&ran.stdout);
    assert!(ran.status.success() && out.starts_with("ok"), "kernel checks failed:\n{out}");
}
