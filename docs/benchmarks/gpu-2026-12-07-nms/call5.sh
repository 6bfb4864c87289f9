#!/usr/bin/env bash
# The real t alone, base against the vector NMS, three more rounds alternated (call4 read 0.1 ms
# slower for new in both of its rounds).
set -u
G=.dev/gpu-run
S=$OUT/ab.md
W=/tmp/we; mkdir -p $W
xz -dc $G/dist/yolo-edge-cuda-sm90-cudnn.xz > $W/ye-base; xz -dc $G/dist/ye-new.xz > $W/ye-new; chmod +x $W/ye-*
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name --format=csv,noheader >> $S
run() { local tag=$1; shift
  timeout 60 "$@" --out $W/$tag > $W/$tag.md 2> $W/$tag.log; echo "## $tag rc=$? at ${SECONDS}s" >> $S
  grep -E "^\| yolov9" $W/$tag.md >> $S; grep -E "nvJPEG batch 1, timed" $W/$tag.log | sed 's/.*ms per picture: //' >> $S
}
for r in 5 6 7; do for b in new base; do
  run "t-$b-$r" $W/ye-$b bench --device cuda:0 --model $G/dev/yolov9t-ball.pt --dtype f16 --batches 1 --mode model,e2e --input 640x384 --jpeg-decoder nvjpeg --images $G/dev/volleyball-court.jpg --iters 1000
done; done
rm -f $W/ye-*
tar czf $OUT/ab-raw.tgz -C $W .
grep -vE "^\s*$" $S | grep -vE "^\| yolov9. \(random\) \| f16 \| (1|64) \||^\| yolov9t-ball.pt \| f16 \| (1|64) \|" | cut -c1-120 | tail -40
