#!/usr/bin/env bash
# one shared hardware nvJPEG handle (states per lane, no default handle: YE_X_HWONLY) against the usual set-up and the host decoder: the model pass and e2e at batch 1.
set -u
G=.dev/gpu-run
W=/tmp/w17; mkdir -p $W
xz -dc $G/dist/yolo-edge-diag6.xz > $W/ye-diag; chmod +x $W/ye-diag
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
S=$OUT/summary.md
nvidia-smi --query-gpu=name --format=csv,noheader >> $S
B="--device cuda:0 --model $G/dev/yolov9t-ball.pt --dtype f16 --input 640x384 --batches 1 --iters 300 --mode model,e2e --images $G/dev/volleyball-court.jpg"
one() { local t=$1 e=$2; shift 2
  env $e timeout 60 $W/ye-diag bench $B "$@" --out $W/$t > $W/$t.md 2> $W/$t.log
  echo "### $t (rc=$?) $e $* $(grep -E '^XL' $W/$t.log | sort | uniq -c | tr '\n' ' ')" >> $S; grep -E "^\| yolov9t \| f16 \| (model|e2e)" $W/$t.md >> $S; grep -E "timed runs" $W/$t.log >> $S
}
for r in 1 2; do
  one cpu-$r X=1 --jpeg-decoder cpu
  one usual-$r X=1 --jpeg-decoder nvjpeg
  one hwonly1-$r YE_X_HWONLY=1 --jpeg-decoder nvjpeg --jpeg-decoders 1
  one hwonly2-$r YE_X_HWONLY=1 --jpeg-decoder nvjpeg --jpeg-decoders 2
done
tar czf $OUT/raw.tgz -C $W --exclude 'ye-*' .
grep -vE "^\s*$" $S | cut -c1-400
