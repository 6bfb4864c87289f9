#!/usr/bin/env bash
# session 2026-12-05 night, call A: CUDA smoke of main's code (parity, batch-1 graph), nvJPEG with
# the kept support answers (jpegcheck), end to end real t at 1 and 64 (nvJPEG, 1080p -> 640x384,
# 300 runs; model-only beside it), the ladder of t, s and c beside PyTorch eager (both layouts).
set -u
G=.dev/gpu-run
T0=$(date +%s)
export STOP_AT=$((T0 + 300))
OUT=$OUT/a STEPS="info parity jpegcheck e2efeed ladder" PARITY_BATCHES="1" \
  E2E_MODELS="$G/dev/yolov9t-ball.pt" E2E_DECODERS=nvjpeg E2E_BATCHES=1,64 E2E_ITERS=300 E2E_TIMEOUT=100 \
  VARIANTS=t,s,c LADDER_EAGER_VARIANTS=t LADDER_TIMEOUT=150 TORCH_TIMEOUT=180 \
  DIST=$G/dist DEV=$G/dev WHL=$G/whl BIN_XZ=yolo-edge-main.xz timeout 470 bash scripts/gpu_run.sh > $OUT/a.log 2>&1
echo "total $(( $(date +%s)-T0 )) s" >> $OUT/a/summary.md
cp $OUT/a/summary.md $OUT/summary.md
grep -vE "^\s*$" $OUT/a/summary.md | cut -c1-400 | tail -90
