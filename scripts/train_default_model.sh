#!/usr/bin/env bash
# Reproduces the default model, models/yolov9t-shapes.safetensors (see models/README.md):
#   1. the synthetic shapes dataset (scripts/make_shapes_dataset.py, seed 0, 3000/300/300),
#   2. YOLOv9-t from scratch with ultralytics 8.4.190 for a fixed time budget (4 min on one
#      H200, bf16 AMP), then ultralytics `val` of best.pt on the test split,
#   3. `yolo-edge convert` to FP16 safetensors and `yolo-edge eval` on the same test split.
# Needs python3 with numpy, opencv-python, torch and ultralytics==8.4.190, and cargo.
# Environment: OUT_DIR (runs/shapes), SEED (0), DEVICE (0; `cpu` works but is slow), MINUTES (4),
# WORKERS (number of CPUs), PYTHON (python3). Results: $OUT_DIR/metrics.json, $OUT_DIR/eval.json.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-runs/shapes}
SEED=${SEED:-0}
DEVICE=${DEVICE:-0}
MINUTES=${MINUTES:-4}
WORKERS=${WORKERS:-$(nproc)}
PYTHON=${PYTHON:-python3}
export YOLO_OFFLINE=1 PYTHONUNBUFFERED=1

"$PYTHON" scripts/make_shapes_dataset.py --out "$OUT_DIR/data" --seed "$SEED" --train 3000 --val 300 --test 300 --workers "$WORKERS"
"$PYTHON" scripts/train_default_model.py --data "$OUT_DIR/data/data.yaml" --project "$OUT_DIR" --imgsz 416 \
    --minutes "$MINUTES" --batch 64 --workers "$(( WORKERS > 2 ? WORKERS - 2 : 1 ))" --device "$DEVICE" --seed "$SEED"
cargo run --release --locked -- convert "$OUT_DIR/train/weights/best.pt" models/yolov9t-shapes.safetensors --dtype f16
cp "$OUT_DIR/train/results.csv" models/yolov9t-shapes.results.csv
cargo run --release --locked -- eval --model models/yolov9t-shapes.safetensors --data "$OUT_DIR/data" --split test --json "$OUT_DIR/eval.json"
