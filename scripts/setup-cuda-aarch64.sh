#!/usr/bin/env bash
# scripts/setup-cuda-aarch64.sh — the aarch64 CUDA 13.0 libraries that an aarch64 CUDA build of
# yolo-edge links against (JetPack 7.2 / CUDA 13 boards; scripts/build-cuda.sh 87 --aarch64),
# from NVIDIA's aarch64 PyPI wheels, plus a stub libcuda.so for aarch64 (the driver library is in
# no wheel; the board's driver provides it at run time). Kernels are compiled by the x86_64
# toolchain of scripts/setup-cuda-build.sh (nvcc with aarch64-linux-gnu-g++ as host compiler).
#
# Usage:  scripts/setup-cuda-aarch64.sh [--cudnn]
#   WHEELS: ${CUDA_WHEEL_PREFIX_AARCH64:-/opt/cuda-13.0-wheels-aarch64}; idempotent.
# Needs: python3 with pip, aarch64-linux-gnu-gcc (scripts/aarch64.sh setup), the x86_64 toolchain
# (for cuda.h, from which the stub's symbols are read).
set -euo pipefail
PREFIX="${CUDA_WHEEL_PREFIX_AARCH64:-/opt/cuda-13.0-wheels-aarch64}"
X86="${CUDA_WHEEL_PREFIX:-/opt/cuda-13.0-wheels}/nvidia/cu13"
WITH_CUDNN=0
[ "${1:-}" = --cudnn ] && WITH_CUDNN=1
die() { echo "setup-cuda-aarch64.sh: $*" >&2; exit 1; }
command -v aarch64-linux-gnu-gcc >/dev/null || die "aarch64-linux-gnu-gcc missing: scripts/aarch64.sh setup"
[ -f "$X86/include/cuda.h" ] || die "no x86_64 toolchain at $X86: scripts/setup-cuda-build.sh first"

PKGS=(nvidia-cuda-runtime==13.0.96 nvidia-cublas==13.1.0.3 nvidia-curand==10.4.0.35 nvidia-cuda-nvrtc==13.0.88)
[ "$WITH_CUDNN" = 1 ] && PKGS+=(nvidia-cudnn-cu13==9.19.0.56)
LIB="$PREFIX/nvidia/cu13/lib"
if [ ! -e "$LIB/libcublas.so.13" ] || { [ "$WITH_CUDNN" = 1 ] && [ ! -e "$PREFIX/nvidia/cudnn/lib/libcudnn.so.9" ]; }; then
  python3 -m pip install --no-deps --upgrade --target "$PREFIX" --only-binary=:all: \
    --platform manylinux_2_27_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64 \
    --platform manylinux_2_28_aarch64 "${PKGS[@]}" || die "pip could not install the aarch64 wheels"
fi
[ -e "$LIB/libcudart.so.13" ] || die "libcudart.so.13 not in the aarch64 wheels ($LIB)"
cd "$LIB"
ln -sfn libcudart.so.13 libcudart.so
ln -sfn libcublas.so.13 libcublas.so
ln -sfn libcublasLt.so.13 libcublasLt.so
ln -sfn libcurand.so.10 libcurand.so
ln -sfn libnvrtc.so.13 libnvrtc.so
if [ "$WITH_CUDNN" = 1 ]; then
  ln -sfn "$PREFIX/nvidia/cudnn/lib/libcudnn.so.9" libcudnn.so.9
  ln -sfn libcudnn.so.9 libcudnn.so
fi
# nvcc looks for a cross target's headers and libraries under targets/<dir>/ of its own tree
# (sbsa-linux for an aarch64 host compiler, aarch64-linux on older toolkits): the headers are the
# x86_64 toolchain's (the same files), the libraries these aarch64 ones
for t in sbsa-linux aarch64-linux; do
  mkdir -p "$X86/targets/$t"
  ln -sfn ../../include "$X86/targets/$t/include"
  ln -sfn "$LIB" "$X86/targets/$t/lib"
done
# the same stub as the x86_64 toolchain's, compiled for aarch64: SONAME libcuda.so.1
mkdir -p stubs
aarch64-linux-gnu-gcc -shared -fPIC -O0 -Wl,-soname,libcuda.so.1 -o stubs/libcuda.so "$X86/lib/stubs/libcuda_stub.c"
ln -sfn libcuda.so stubs/libcuda.so.1
file -L libcudart.so stubs/libcuda.so | sed 's/^/  /'
echo "setup-cuda-aarch64.sh: aarch64 libraries in $LIB"
