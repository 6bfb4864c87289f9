#!/usr/bin/env bash
# scripts/setup-cuda-build.sh — install the CUDA 13.0 *build* toolchain for
# `cargo build --release --features cuda[,cudnn]` from PyPI wheels, on a machine with no
# GPU and no system CUDA toolkit (x86-64 Linux, glibc >= 2.27, python3 with pip, gcc).
# Derived from the workplace's verified recipe (../shared/gpu/RECIPE.md); candle 0.11.1
# uses cudarc 0.19 with "cuda-version-from-build-system" + "dynamic-linking".
#
# Usage:
#   scripts/setup-cuda-build.sh [COMPUTE_CAP]     # default 90
#   WITH_CUDNN=1 scripts/setup-cuda-build.sh 87   # also fetch cuDNN 9.19 (~0.9 GB)
#   source "${CUDA_WHEEL_PREFIX:-/opt/cuda-13.0-wheels}/env.sh"
#
# COMPUTE_CAP is the compute capability of the TARGET GPU (nothing is detected here):
#   90 = H100 / H200 (Hopper)      89 = Ada (RTX 40xx, L4, L40)
#   87 = Jetson AGX/NX Orin        86 = Ampere consumer (RTX 30xx, A10, A40)
#   80 = A100 (Ampere datacenter)
# candle's kernels are compiled to arch-specific PTX (sm_XXa), which only JITs on that
# architecture: a binary runs on the GPU family it was built for, nothing else.
# The value is written into env.sh as the default of CUDA_COMPUTE_CAP; exporting
# CUDA_COMPUTE_CAP before a build overrides it (scripts/build-cuda.sh does that).
#
# nvcc MUST be 13.0.x: PTX of a newer nvcc (ISA > 9.0) will not JIT on an R580 driver.
# Idempotent.
set -euo pipefail

CAP="${1:-${CUDA_COMPUTE_CAP:-90}}"
case "$CAP" in 80|86|87|89|90) ;; *) echo "unsupported compute capability '$CAP' (80 86 87 89 90)" >&2; exit 2;; esac
PREFIX="${CUDA_WHEEL_PREFIX:-/opt/cuda-13.0-wheels}"
WITH_CUDNN="${WITH_CUDNN:-0}"
PY="${PYTHON:-python3}"

PKGS=(
  nvidia-cuda-nvcc==13.0.88      # nvcc, ptxas, fatbinary, nvlink, cudafe++
  nvidia-cuda-crt==13.0.88       # include/crt/* (host_config.h, ...) needed by nvcc
  nvidia-nvvm==13.0.88           # nvvm/bin/cicc + libdevice
  nvidia-cuda-runtime==13.0.96   # cuda_runtime.h, cuda_fp16.h, cuda.h, libcudart.so.13
  nvidia-cuda-cccl==13.0.85      # include/cccl (libcu++/CUB/Thrust), needed by CUDA 13 headers
  nvidia-cublas==13.1.0.3        # libcublas.so.13, libcublasLt.so.13 (linked by cudarc)
  nvidia-curand==10.4.0.35       # libcurand.so.10 (linked by cudarc)
  nvidia-cuda-nvrtc==13.0.88     # libnvrtc.so.13 (linked by cudarc)
)
if [ "$WITH_CUDNN" = 1 ]; then
  PKGS+=(nvidia-cudnn-cu13==9.19.0.56)  # libcudnn.so.9 (linked by cudarc with feature cudnn)
fi

echo ">> pip install --target $PREFIX ${PKGS[*]}"
mkdir -p "$PREFIX"
"$PY" -m pip install --no-deps --upgrade --target "$PREFIX" --only-binary=:all: \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux2010_x86_64 --platform manylinux_2_12_x86_64 --platform manylinux_2_28_x86_64 \
  "${PKGS[@]}"

CUDA_ROOT="$PREFIX/nvidia/cu13"
[ -x "$CUDA_ROOT/bin/nvcc" ] || { echo "nvcc not found under $CUDA_ROOT" >&2; exit 1; }
chmod +x "$CUDA_ROOT"/bin/* "$CUDA_ROOT"/nvvm/bin/* 2>/dev/null || true

# 1. Make the wheel tree look like a normal toolkit.
#    nvcc.profile adds -I$TOP/targets/x86_64-linux/include and -isystem .../include/cccl,
#    and some tools look for lib64/.
mkdir -p "$CUDA_ROOT/targets/x86_64-linux"
ln -sfn ../../include "$CUDA_ROOT/targets/x86_64-linux/include"
ln -sfn ../../lib     "$CUDA_ROOT/targets/x86_64-linux/lib"
ln -sfn lib "$CUDA_ROOT/lib64"

# 2. Unversioned dev symlinks (the wheels only carry the SONAME files) so that
#    -lcudart -lcublas -lcublasLt -lcurand -lnvrtc [-lcudnn] resolve at link time.
cd "$CUDA_ROOT/lib"
ln -sfn libcudart.so.13   libcudart.so
ln -sfn libcublas.so.13   libcublas.so
ln -sfn libcublasLt.so.13 libcublasLt.so
ln -sfn libcurand.so.10   libcurand.so
ln -sfn libnvrtc.so.13    libnvrtc.so
if [ "$WITH_CUDNN" = 1 ]; then
  CUDNN_DIR=""
  for d in "$PREFIX/nvidia/cudnn/lib" "$CUDA_ROOT/lib"; do
    [ -e "$d/libcudnn.so.9" ] && { CUDNN_DIR="$d"; break; }
  done
  [ -n "$CUDNN_DIR" ] || { echo "libcudnn.so.9 not found in the cudnn wheel" >&2; exit 1; }
  [ "$CUDNN_DIR" = "$CUDA_ROOT/lib" ] || ln -sfn "$CUDNN_DIR/libcudnn.so.9" libcudnn.so.9
  ln -sfn libcudnn.so.9 libcudnn.so
fi

# 3. Stub libcuda.so (the driver library is not in any wheel; the real one comes with
#    the NVIDIA driver on the target). Export every cu* entry point named in cuda.h
#    (incl. the _v2/_v3 names the #defines map to) and give it the SONAME
#    libcuda.so.1, so the binary records NEEDED libcuda.so.1 just like with
#    the toolkit's own lib64/stubs/libcuda.so.
mkdir -p "$CUDA_ROOT/lib/stubs"
"$PY" - "$CUDA_ROOT/include/cuda.h" "$CUDA_ROOT/lib/stubs/libcuda_stub.c" <<'EOF'
import re, sys
src = open(sys.argv[1]).read()
names = set(re.findall(r'\b(cu[A-Z]\w*)\s*\(', src))                 # declarations
names |= set(re.findall(r'#\s*define\s+cu[A-Z]\w*\s+(cu[A-Z]\w*)', src))  # cuX -> cuX_v2
names |= set(re.findall(r'#\s*define\s+(cu[A-Z]\w*)\s+cu[A-Z]\w*', src))
names = sorted(n for n in names if not n.startswith('cudaError'))
with open(sys.argv[2], 'w') as f:
    f.write('/* generated stub for linking only; never load at run time */\n')
    for n in names:
        f.write(f'int {n}(void) {{ return 999; }}\n')
print(f'stub libcuda: {len(names)} symbols')
EOF
gcc -shared -fPIC -O0 -Wl,-soname,libcuda.so.1 -o "$CUDA_ROOT/lib/stubs/libcuda.so" "$CUDA_ROOT/lib/stubs/libcuda_stub.c"
ln -sfn libcuda.so "$CUDA_ROOT/lib/stubs/libcuda.so.1"

# 4. Environment file.
cat > "$PREFIX/env.sh" <<EOF
# source me before 'cargo build' of a candle/cudarc CUDA crate
export CUDA_ROOT="$CUDA_ROOT"
export CUDA_HOME="\$CUDA_ROOT" CUDA_PATH="\$CUDA_ROOT" CUDA_TOOLKIT_ROOT_DIR="\$CUDA_ROOT"
export PATH="\$CUDA_ROOT/bin:\$CUDA_ROOT/nvvm/bin:\$PATH"
export NVCC="\$CUDA_ROOT/bin/nvcc"
# compute capability of the TARGET GPU (no GPU here, so nvidia-smi cannot be asked).
# cudaforge turns 90 into sm_90a/compute_90a. For Jetson Orin use 87, Ada 89, Ampere 80/86.
export CUDA_COMPUTE_CAP="\${CUDA_COMPUTE_CAP:-$CAP}"
# pin the cudarc binding version instead of parsing 'nvcc --version' (same result: 13.0)
export CUDARC_CUDA_VERSION=13000
# link-time search path (cudarc also adds \$CUDA_ROOT/lib and lib/stubs itself)
export LIBRARY_PATH="\$CUDA_ROOT/lib:\$CUDA_ROOT/lib/stubs\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
# candle-kernels compiles ~16 big .cu files into libmoe.a; cudaforge uses 50% of cores by default
export CUDAFORGE_THREADS="\${CUDAFORGE_THREADS:-\$(nproc)}"
EOF
"$CUDA_ROOT/bin/nvcc" --version | tail -2
echo ">> done. source $PREFIX/env.sh"
