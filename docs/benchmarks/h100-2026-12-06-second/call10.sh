#!/usr/bin/env bash
# call A: end to end batch 1 A/B (be6031e's binary vs this change), alternated 3 times; the new
# binary at 1 and 64; jpeg-selfcheck (bit-exact device letterbox) and torch.compile beside ours.
set -u
G=.dev/gpu-run
T0=$(date +%s)
W=/tmp/w; mkdir -p $W
for b in main new; do xz -dc $G/dist/yolo-edge-$b.xz > $W/ye-$b; chmod +x $W/ye-$b; done
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
S=$OUT/summary.md
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $S
(which nsys ncu; ls /usr/local/cuda/bin 2>/dev/null | grep -E "nsys|ncu") >> $S 2>&1
for r in 1 2 3; do for b in main new; do
  timeout 60 $W/ye-$b bench --device cuda:0 --model $G/dev/yolov9t-ball.pt --dtype f16 --batches 1 --mode model,e2e --input 640x384 \
    --jpeg-decoder nvjpeg --images $G/dev/volleyball-court.jpg --iters 300 --out $W/e2e-$b-$r > $OUT/e2e-$b-$r.md 2> $OUT/e2e-$b-$r.log
  echo "### $b run $r (rc=$?)" >> $S; grep -E "^\| yolov9t" $OUT/e2e-$b-$r.md >> $S; grep "nvJPEG batch" $OUT/e2e-$b-$r.log >> $S
done; done
echo "A/B done at $(( $(date +%s)-T0 )) s" >> $S
timeout 60 $W/ye-new bench --device cuda:0 --model $G/dev/yolov9t-ball.pt --dtype f16 --batches 64 --mode model,e2e --input 640x384 \
  --jpeg-decoder nvjpeg --images $G/dev/volleyball-court.jpg --iters 300 --out $W/e2e-new-64 > $OUT/e2e-new-64.md 2> $OUT/e2e-new-64.log
echo "### new batch 64 (rc=$?)" >> $S; grep -E "^\| yolov9t" $OUT/e2e-new-64.md >> $S; grep "nvJPEG batch" $OUT/e2e-new-64.log >> $S
timeout 100 $W/ye-new bench --device cuda:0 --variants t,s,c --dtype f16 --batches 1,8,64 --mode model --iters 200 --out $W/ours-tsc > $OUT/ours-tsc.md 2> $OUT/ours-tsc.log
echo "### ours t,s,c at 1, 8, 64 beside torch.compile (rc=$?)" >> $S; cat $OUT/ours-tsc.md >> $S
export STOP_AT=$((T0 + 560))
OUT=$OUT/a STEPS="jpegcheck compile" COMPILE_TIMEOUT=250 DIST=$G/dist DEV=$G/dev WHL=$G/whl BIN_XZ=yolo-edge-new.xz \
  timeout $((T0 + 570 - $(date +%s))) bash scripts/gpu_run.sh > /tmp/w/a.log 2>&1
cat $OUT/a/summary.md >> $S
echo "total $(( $(date +%s)-T0 )) s" >> $S
grep -vE "^\s*$" $S | cut -c1-300 | tail -80
