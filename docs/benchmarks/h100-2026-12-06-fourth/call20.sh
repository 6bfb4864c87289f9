#!/usr/bin/env bash
# (1) model-only batch 1: the graph's device time after N MB written through L2 (YE_X_FLUSH_MB); (2) e2e: tl4 (letterbox plain loads) against tl5 (letterbox streaming loads), graph device time after the decode.
set -u
G=.dev/gpu-run
W=/tmp/w10; mkdir -p $W
for b in tl4 tl5; do xz -dc $G/dist/yolo-edge-$b.xz > $W/ye-$b; chmod +x $W/ye-$b; done
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
S=$OUT/summary.md
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,pstate --format=csv,noheader >> $S
for mb in 0 4 12 24 48 96; do
  YE_X_FLUSH_MB=$mb timeout 60 $W/ye-tl5 bench --device cuda:0 --model $G/dev/yolov9t-ball.pt --dtype f16 --batches 1 --mode model --input 640x384 \
    --iters 300 --out $W/m-$mb > $W/m-$mb.md 2> $W/m-$mb.log
  echo "flush $mb MB: $(grep -E 'XT model b1 E graph' $W/m-$mb.log)" >> $S
done
for r in 1 2; do for b in tl4 tl5; do
  timeout 60 $W/ye-$b bench --device cuda:0 --model $G/dev/yolov9t-ball.pt --dtype f16 --batches 1 --mode model,e2e --input 640x384 \
    --jpeg-decoder nvjpeg --images $G/dev/volleyball-court.jpg --iters 300 --out $W/e-$b-$r > $W/e-$b-$r.md 2> $W/e-$b-$r.log
  echo "### $b run $r" >> $S; grep -E "^\| yolov9t \| f16 \| (model|e2e)" $W/e-$b-$r.md >> $S; grep -E "E letterbox|E graph" $W/e-$b-$r.log >> $S
done; done
timeout 120 $W/ye-tl5 jpeg-selfcheck --device cuda:0 > $W/self.md 2> $W/self.log; echo "selfcheck tl5 rc=$?" >> $S; tail -1 $W/self.md >> $S
tar czf $OUT/raw.tgz -C $W --exclude 'ye-*' .
grep -vE "^\s*$" $S | cut -c1-260
