//! The index arithmetic of the CUDA kernels (`src/backend/cuda/kernels/`), checked on the CPU:
//! `tests/kernels/index_check.cpp` includes the kernel sources under a host stand-in for CUDA,
//! runs each launch for every thread of a small grid and compares with direct loops (channel
//! slices and concatenation, upsampling, input layouts, the head's decode into one output). The
//! GPU itself checks the same kernels through the parity steps of `scripts/gpu_run.sh`.

use std::path::Path;
use std::process::Command;

#[test]
fn cuda_kernels_index_arithmetic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("index_check");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let built = Command::new(&cxx)
        .args(["-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror"])
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
    assert!(ran.status.success() && out.starts_with("ok"), "kernel index checks failed:\n{out}");
}
