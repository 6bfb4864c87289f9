#!/usr/bin/env bash
# why the model pass is slower once nvJPEG is set up: dlopen only, one default decoder, the whole setup; a dummy device allocation instead.
set -u
G=.dev/gpu-run
W=/tmp/w14; mkdir -p $W
xz -dc $G/dist/yolo-edge-diag3.xz > $W/ye-diag; chmod +x $W/ye-diag
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
S=$OUT/summary.md
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,pstate --format=csv,noheader >> $S
B="--device cuda:0 --model $G/dev/yolov9t-ball.pt --dtype f16 --input 640x384 --batches 1 --iters 300"
one() { # tag env args...
  local t=$1 e=$2; shift 2
  env $e timeout 90 $W/ye-diag bench $B "$@" --out $W/$t > $W/$t.md 2> $W/$t.log
  echo "### $t (rc=$?) $e $*" >> $S; grep -E "^\| yolov9t \| f16 \| model" $W/$t.md >> $S; grep -E "^XL|JPEG files|warning" $W/$t.log >> $S
}
J="--mode model,e2e --images $G/dev/volleyball-court.jpg"
for r in 1 2; do
  one cpu-$r X=1 $J --jpeg-decoder cpu
  one api-$r YE_X_STOP=api $J --jpeg-decoder auto
  one default-$r YE_X_STOP=default $J --jpeg-decoder auto
  one full-$r X=1 $J --jpeg-decoder nvjpeg
  one dummy-$r YE_X_DUMMY_MB=300 $J --jpeg-decoder cpu
done
tar czf $OUT/raw.tgz -C $W --exclude 'ye-*' .
grep -vE "^\s*$" $S | cut -c1-300
