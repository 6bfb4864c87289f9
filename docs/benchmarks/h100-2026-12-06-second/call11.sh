#!/usr/bin/env bash
# call B: the ladder of e (ours, graphs) beside PyTorch eager e (both layouts) at 1-256; then
# rect (640x384) vs square at batch 1 with cudnn_fusion for t and c.
set -u
G=.dev/gpu-run
T0=$(date +%s)
export STOP_AT=$((T0 + 420))
OUT=$OUT/b STEPS="info ladder" VARIANTS=e LADDER_EAGER_VARIANTS=none LADDER_ITERS=200 LADDER_TIMEOUT=150 TORCH_TIMEOUT=240 \
  DIST=$G/dist DEV=$G/dev WHL=$G/whl BIN_XZ=yolo-edge-new.xz timeout 430 bash scripts/gpu_run.sh > /tmp/b.log 2>&1
S=$OUT/summary.md
cat $OUT/b/summary.md >> $S
W=/tmp/w; mkdir -p $W; xz -dc $G/dist/yolo-edge-new.xz > $W/ye; chmod +x $W/ye
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
for v in t c; do for inp in 640x384 640x640; do
  left=$((T0 + 585 - $(date +%s))); [ $left -lt 20 ] && break 2
  timeout $left $W/ye bench --device cuda:0 --variants $v --dtype f16 --batches 1 --mode model --input $inp --cudnn-fusion on --iters 300 --out $W/fu-$v-$inp > $OUT/fusion-$v-$inp.md 2> $OUT/fusion-$v-$inp.log
  echo "### fusion $v $inp rc=$?" >> $S; grep -E "^\| yolov9" $OUT/fusion-$v-$inp.md >> $S
done; done
echo "total $(( $(date +%s)-T0 )) s" >> $S
grep -vE "^\s*$" $S | cut -c1-300 | tail -50
