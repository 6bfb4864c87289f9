#!/usr/bin/env bash
# scripts/build-cuda.sh — release build of yolo-edge with CUDA (optionally cuDNN) for one GPU
# architecture, stripped and xz-compressed into dist/ (git-ignored).
#
# Usage:  scripts/build-cuda.sh [COMPUTE_CAP] [--cudnn] [--gstreamer] [--aarch64]
#   COMPUTE_CAP: 90 H100/H200 (default), 89 Ada, 87 Jetson Orin, 86/80 Ampere.
#   --gstreamer: with camera and video sources (feature `gstreamer`); the binary then also needs
#   the GStreamer 1.22+ libraries on the target (docs/cameras.md).
#   --aarch64: cross-built for aarch64 (a Jetson Orin on JetPack 7.2, CUDA 13: COMPUTE_CAP 87):
#   kernels by the x86_64 nvcc with aarch64-linux-gnu-g++ as host compiler, linked against the
#   aarch64 wheels of scripts/setup-cuda-aarch64.sh (needs scripts/aarch64.sh setup first).
#   JetPack 6 (CUDA 12.6) cannot be built here: docs/jetson.md.
# Needs the toolchain of scripts/setup-cuda-build.sh (run it once; it is idempotent).
# Output: dist/yolo-edge-cuda-sm<CAP>[-cudnn] and the same with .xz (about 5 MB).
# With the device-memory arena (feature `arena`, cudarc patched at build time) unless NO_ARENA=1.
# The binary needs the NVIDIA driver (libcuda.so.1) and CUDA 13.0 runtime libraries
# (cudart 13, cublas 13, curand 10; cudnn 9 with --cudnn) on the target.
set -euo pipefail
cd "$(dirname "$0")/.."
CAP="${1:-${CUDA_COMPUTE_CAP:-90}}"
FEATURES=cuda
SUFFIX=""
GST=""
CUDNN=""
AARCH64=""
for a in "${@:2}"; do
  case "$a" in
    --cudnn) FEATURES=cudnn; CUDNN=1; SUFFIX="-cudnn" ;;
    --gstreamer) GST=1 ;;
    --aarch64) AARCH64=1 ;;
    *) echo "build-cuda.sh: unknown option '$a' (--cudnn, --gstreamer, --aarch64)" >&2; exit 2 ;;
  esac
done
if [ -n "$GST" ]; then FEATURES="$FEATURES,gstreamer"; SUFFIX="$SUFFIX-gst"; fi
CARGO_TARGET=()
OUT_DIR_TRIPLE=""
STRIP=strip
if [ -n "$AARCH64" ]; then
  [ -z "$GST" ] || { echo "build-cuda.sh: --aarch64 with --gstreamer needs the arm64 GStreamer libraries: not supported" >&2; exit 2; }
  CARGO_TARGET=(--target aarch64-unknown-linux-gnu)
  OUT_DIR_TRIPLE=aarch64-unknown-linux-gnu/
  STRIP=aarch64-linux-gnu-strip
  SUFFIX="-aarch64$SUFFIX"
fi
case "$CAP" in 80|86|87|89|90) ;; *) echo "unsupported compute capability '$CAP' (80 86 87 89 90)" >&2; exit 2;; esac
# libjpeg-turbo (turbojpeg-sys) is built from its bundled source: cmake, and nasm for its x86-64 SIMD
TOOLS=(cmake)
[ -n "$AARCH64" ] || TOOLS+=(nasm)
for tool in "${TOOLS[@]}"; do
  command -v "$tool" >/dev/null || { echo "build-cuda.sh: '$tool' not found; libjpeg-turbo is built from source (apt-get install cmake nasm)" >&2; exit 1; }
done
PREFIX="${CUDA_WHEEL_PREFIX:-/opt/cuda-13.0-wheels}"
if [ -n "$CUDNN" ]; then
  # the toolchain without cuDNN (a plain setup run) cannot link the cuDNN build
  [ -f "$PREFIX/env.sh" ] && [ -e "$PREFIX/nvidia/cu13/lib/libcudnn.so" ] || WITH_CUDNN=1 bash scripts/setup-cuda-build.sh "$CAP"
else
  [ -f "$PREFIX/env.sh" ] || bash scripts/setup-cuda-build.sh "$CAP"
fi
# shellcheck disable=SC1091
source "$PREFIX/env.sh"
export CUDA_COMPUTE_CAP="$CAP"
if [ -n "$AARCH64" ]; then
  bash scripts/setup-cuda-aarch64.sh ${CUDNN:+--cudnn} || { echo "build-cuda.sh: scripts/setup-cuda-aarch64.sh failed (see above)" >&2; exit 1; }
  A="${CUDA_WHEEL_PREFIX_AARCH64:-/opt/cuda-13.0-wheels-aarch64}/nvidia/cu13/lib"
  # host code of the static kernels (candle's libmoe.a) for aarch64; link against aarch64 libraries
  export NVCC_CCBIN=aarch64-linux-gnu-g++
  # a cross gcc ignores LIBRARY_PATH: the search path goes to the linker through rustc
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-L native=$A -L native=$A/stubs"
fi
TARGET="${CARGO_TARGET_DIR:-target}"
# the device-memory arena (src/backend/arena.rs, feature `arena`) needs cudarc's allocation hook: the
# registry's cudarc with scripts/patches/cudarc-alloc-hook.patch applied, in the target folder;
# NO_ARENA=1 builds without it. Cargo.lock is restored afterwards (a path patch rewrites it).
if [ -z "${NO_ARENA:-}" ]; then
  mkdir -p "$TARGET"
  PATCHED_LINE=$(bash scripts/patch-cudarc.sh "$TARGET") || { echo "build-cuda.sh: scripts/patch-cudarc.sh failed (see above)" >&2; exit 1; }
  case "$PATCHED_LINE" in
    CUDARC_PATCHED=/*) CUDARC_PATCHED="${PATCHED_LINE#CUDARC_PATCHED=}" ;;
    *) echo "build-cuda.sh: scripts/patch-cudarc.sh printed '$PATCHED_LINE', not CUDARC_PATCHED=<path>" >&2; exit 1 ;;
  esac
  [ -f "$CUDARC_PATCHED/Cargo.toml" ] || { echo "build-cuda.sh: patched cudarc missing at $CUDARC_PATCHED" >&2; exit 1; }
  FEATURES="$FEATURES,arena"
  cp Cargo.lock "$TARGET/Cargo.lock.orig"
  trap 'cp "$TARGET/Cargo.lock.orig" Cargo.lock' EXIT
  cargo build --release "${CARGO_TARGET[@]}" --features "$FEATURES" --bin yolo-edge --config "patch.crates-io.cudarc.path=\"$CUDARC_PATCHED\""
else
  cargo build --release "${CARGO_TARGET[@]}" --features "$FEATURES" --bin yolo-edge
fi
mkdir -p dist
OUT="dist/yolo-edge-cuda-sm${CAP}${SUFFIX}"
cp "$TARGET/${OUT_DIR_TRIPLE}release/yolo-edge" "$OUT"
"$STRIP" "$OUT"
xz -6 -T0 -k -f "$OUT"
ls -la "$OUT" "$OUT.xz"
echo "NEEDED: $(readelf -d "$OUT" | awk '/NEEDED/ {gsub(/[\[\]]/,"",$5); printf "%s ", $5}')"
