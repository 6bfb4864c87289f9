#!/usr/bin/env bash
# CPU model-only benchmark: yolo-edge beside the reference (ultralytics) in the same run.
#   PY=/path/to/venv/bin/python [CARGO_TARGET_DIR=...] [ITERS=10] bash scripts/bench_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
ITERS=${ITERS:-10}
TARGET=${CARGO_TARGET_DIR:-target}
cargo build --release -q
for round in 1 2; do   # interleaved twice, so that load on a shared box hits both sides
  "$PY" scripts/bench_cpu_reference.py --variants t,s --batches 1,4 --iters "$ITERS"
  "$TARGET/release/yolo-edge" bench --device cpu --variants t,s --dtype f32 --batches 1,4 --mode model --warmup 2 --iters "$ITERS" --out "$TARGET/bench-cpu-$round"
done
