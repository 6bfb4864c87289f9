#!/usr/bin/env bash
# A/B of the NMS change: main's binary (base) against the change (new), alternated, end to end on
# nvJPEG, 1080p court photo at 640x384: random c (every anchor a candidate) and the real t.
set -u
G=.dev/gpu-run
S=$OUT/summary.md
W=/tmp/we; mkdir -p $W
for b in base new; do xz -dc $G/dist/ye-$b.xz > $W/ye-$b; chmod +x $W/ye-$b; done
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name --format=csv,noheader >> $S
run() { local tag=$1; shift
  timeout ${TMO:-90} "$@" --out $W/$tag > $W/$tag.md 2> $W/$tag.log; echo "## $tag rc=$?" >> $S
  grep -E "^\| yolov9" $W/$tag.md >> $S; grep -E "nvJPEG batch 1, timed" $W/$tag.log | sed 's/.*ms per picture: //' >> $S
}
for r in 1 2; do for b in base new; do
  run "c-$b-$r" $W/ye-$b bench --device cuda:0 --variants c --dtype f16 --batches 1,64 --mode model,e2e --input 640x384 --jpeg-decoder nvjpeg --images $G/dev/volleyball-court.jpg --iters 300
  run "t-$b-$r" $W/ye-$b bench --device cuda:0 --model $G/dev/yolov9t-ball.pt --dtype f16 --batches 1 --mode model,e2e --input 640x384 --jpeg-decoder nvjpeg --images $G/dev/volleyball-court.jpg --iters 300
done; done
rm -f $W/ye-*
tar czf $OUT/raw.tgz -C $W .
grep -vE "^\s*$" $S | cut -c1-170 | tail -80
