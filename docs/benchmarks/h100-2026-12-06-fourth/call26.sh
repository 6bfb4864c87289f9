#!/usr/bin/env bash
# what about a second nvJPEG handle slows the model pass: one default handle + state (fast), plus one more state / handle / 8 MB pinned / 8 MB device / a stream.
set -u
G=.dev/gpu-run
W=/tmp/w16; mkdir -p $W
xz -dc $G/dist/yolo-edge-diag5.xz > $W/ye-diag; chmod +x $W/ye-diag
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
S=$OUT/summary.md
nvidia-smi --query-gpu=name --format=csv,noheader >> $S
B="--device cuda:0 --model $G/dev/yolov9t-ball.pt --dtype f16 --input 640x384 --batches 1 --iters 300 --mode model,e2e --images $G/dev/volleyball-court.jpg --jpeg-decoder nvjpeg --jpeg-decoders 1"
for x in none state handle pinned devmem stream none2; do
  YE_X_NOHW=1 YE_X_EXTRA=$x timeout 60 $W/ye-diag bench $B --out $W/$x > $W/$x.md 2> $W/$x.log
  echo "### $x (rc=$?) $(grep -E '^XL' $W/$x.log)" >> $S; grep -E "^\| yolov9t \| f16 \| model" $W/$x.md >> $S
done
tar czf $OUT/raw.tgz -C $W --exclude 'ye-*' .
grep -vE "^\s*$" $S | cut -c1-300
