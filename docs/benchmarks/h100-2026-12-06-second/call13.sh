#!/usr/bin/env bash
# batch-1 end to end broken down: the latency runs' own nvJPEG profile and file preparation, three runs.
set -u
G=.dev/gpu-run
W=/tmp/w3; mkdir -p $W
xz -dc $G/dist/yolo-edge-prof.xz > $W/ye; chmod +x $W/ye
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
S=$OUT/summary.md
nvidia-smi --query-gpu=name --format=csv,noheader >> $S
for r in 1 2 3; do
  timeout 60 $W/ye bench --device cuda:0 --model $G/dev/yolov9t-ball.pt --dtype f16 --batches 1 --mode model,e2e --input 640x384 \
    --jpeg-decoder nvjpeg --images $G/dev/volleyball-court.jpg --iters 300 --out $W/e2e-$r > $W/e2e-$r.md 2> $W/e2e-$r.log
  echo "### run $r (rc=$?)" >> $S; grep -E "^\| yolov9t" $W/e2e-$r.md >> $S; grep -E "nvJPEG batch|e2e batch 1, timed" $W/e2e-$r.log >> $S
done
grep -vE "^\s*$" $S | cut -c1-300
