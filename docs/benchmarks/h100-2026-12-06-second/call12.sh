#!/usr/bin/env bash
# end to end batch 1 A/B: be6031e's binary vs the pinned slot table (+ one-file latency inline),
# alternated 3 times; one summary file back.
set -u
G=.dev/gpu-run
W=/tmp/w2; mkdir -p $W
for b in main pin; do xz -dc $G/dist/yolo-edge-$b.xz > $W/ye-$b; chmod +x $W/ye-$b; done
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
S=$OUT/summary.md
nvidia-smi --query-gpu=name --format=csv,noheader >> $S
for r in 1 2 3; do for b in main pin; do
  timeout 60 $W/ye-$b bench --device cuda:0 --model $G/dev/yolov9t-ball.pt --dtype f16 --batches 1 --mode model,e2e --input 640x384 \
    --jpeg-decoder nvjpeg --images $G/dev/volleyball-court.jpg --iters 300 --out $W/e2e-$b-$r > $W/e2e-$b-$r.md 2> $W/e2e-$b-$r.log
  echo "### $b run $r (rc=$?)" >> $S; grep -E "^\| yolov9t" $W/e2e-$b-$r.md >> $S; grep "nvJPEG batch" $W/e2e-$b-$r.log >> $S
done; done
tar czf $OUT/e2e.tgz --exclude='ye-*' -C /tmp w2
grep -vE "^\s*$" $S | cut -c1-300
