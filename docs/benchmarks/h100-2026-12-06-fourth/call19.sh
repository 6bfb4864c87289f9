#!/usr/bin/env bash
# model-only batch 1: the graph's device time after the GPU sat idle for YE_X_IDLE_US (host spin before each launch).
set -u
G=.dev/gpu-run
W=/tmp/w9; mkdir -p $W
xz -dc $G/dist/yolo-edge-tl4.xz > $W/ye-tl4; chmod +x $W/ye-tl4
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
S=$OUT/summary.md
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,pstate --format=csv,noheader >> $S
for r in 1 2; do for us in 0 50 200 500 1100 3000; do
  YE_X_IDLE_US=$us timeout 60 $W/ye-tl4 bench --device cuda:0 --model $G/dev/yolov9t-ball.pt --dtype f16 --batches 1 --mode model --input 640x384 \
    --iters 300 --out $W/m-$us-$r > $W/m-$us-$r.md 2> $W/m-$us-$r.log
  echo "idle $us us run $r: $(grep -E 'XT model b1 E graph' $W/m-$us-$r.log)" >> $S
done; done
tar czf $OUT/raw.tgz -C $W --exclude 'ye-*' .
grep -vE "^\s*$" $S | cut -c1-260
