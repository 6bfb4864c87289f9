#!/usr/bin/env bash
# the model pass with nvJPEG set up, batch 1 and 64: host decoder; hardware + default decoders, 2 lanes and 1; default decoders only, 2 lanes and 1.
set -u
G=.dev/gpu-run
W=/tmp/w15; mkdir -p $W
xz -dc $G/dist/yolo-edge-diag4.xz > $W/ye-diag; chmod +x $W/ye-diag
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
S=$OUT/summary.md
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,pstate --format=csv,noheader >> $S
B="--device cuda:0 --model $G/dev/yolov9t-ball.pt --dtype f16 --input 640x384 --batches 1,64 --iters 200 --mode model,e2e --images $G/dev/volleyball-court.jpg"
one() { # tag env args...
  local t=$1 e=$2; shift 2
  env $e timeout 100 $W/ye-diag bench $B "$@" --out $W/$t > $W/$t.md 2> $W/$t.log
  echo "### $t (rc=$?) $e $*" >> $S; grep -E "^\| yolov9t \| f16 \| model" $W/$t.md >> $S; grep -E "^XL|JPEG files|warning" $W/$t.log >> $S
}
one cpu X=1 --jpeg-decoder cpu
one hw2 X=1 --jpeg-decoder nvjpeg --jpeg-decoders 2
one hw1 X=1 --jpeg-decoder nvjpeg --jpeg-decoders 1
one def2 YE_X_NOHW=1 --jpeg-decoder nvjpeg --jpeg-decoders 2
one def1 YE_X_NOHW=1 --jpeg-decoder nvjpeg --jpeg-decoders 1
one cpu-b X=1 --jpeg-decoder cpu
tar czf $OUT/raw.tgz -C $W --exclude 'ye-*' .
grep -vE "^\s*$" $S | cut -c1-300
