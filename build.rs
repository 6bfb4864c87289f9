//! Build script: with the `cuda` feature, compiles the project's own CUDA kernels
//! (`src/backend/cuda/kernels/*.cu`) to PTX for `CUDA_COMPUTE_CAP` with the toolchain's nvcc, to be
//! embedded in the binary and JIT-compiled by the driver on first use (like candle's kernels).
//! The default CPU build does nothing here and needs no CUDA.

use std::path::PathBuf;
use std::process::Command;

/// The kernels under `src/backend/cuda/kernels/`, each compiled to `$OUT_DIR/<name>.ptx`.
const KERNELS: &[&str] = &["epilogue", "candidates", "input", "pool", "head", "fuse", "letterbox", "nhwc", "nms"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/backend/cuda/kernels");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=NVCC");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let cap = cap.trim().trim_start_matches("sm_").trim_end_matches('a');
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    for name in KERNELS {
        let src = format!("src/backend/cuda/kernels/{name}.cu");
        let ptx = out.join(format!("{name}.ptx"));
        let status = Command::new(&nvcc)
            .args(["--ptx", "-O3", "-std=c++17"])
            .arg(format!("-arch=compute_{cap}"))
            .arg("-o")
            .arg(&ptx)
            .arg(&src)
            .status()
            .unwrap_or_else(|e| panic!("cannot run nvcc ('{nvcc}'): {e}; source scripts/setup-cuda-build.sh's env.sh or set NVCC"));
        assert!(status.success(), "nvcc failed on {src} ({status})");
    }
}
