#!/usr/bin/env bash
# PyTorch at 640x640 and 640x384, batch 1: eager channels-last fp16, then torch.compile reduce-overhead (CUDA graphs).
set -u
G=.dev/gpu-run
W=/tmp/wc; mkdir -p $W/site
python3 -m pip install -q --no-index --no-deps --target $W/site $G/whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$W/site YOLO_CONFIG_DIR=/tmp/ultra-cfg
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/torch.jsonl
VARIANTS=t,c SHAPES=640x640,640x384 BATCHES=1 MODES=fp16cl ITERS=300 OUT=$W timeout 70 python3 scripts/torch_rect_square.py >> $OUT/torch.jsonl 2> $OUT/eager.log
echo "eager rc=$?" >> $OUT/torch.jsonl
VARIANTS=t,c SHAPES=640x640,640x384 BATCHES=1 MODES=compile ITERS=300 OUT=$W timeout 250 python3 scripts/torch_rect_square.py >> $OUT/torch.jsonl 2> $OUT/compile.log
echo "compile rc=$?" >> $OUT/torch.jsonl
cat $OUT/torch.jsonl; tail -c 1500 $OUT/compile.log
