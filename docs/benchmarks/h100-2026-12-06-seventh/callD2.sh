#!/usr/bin/env bash
# (1) rect vs square at batch 1 and 8 on the whole GPU and on green contexts of 16 and 8 SMs
# (experiment binary: YE_X_SMS=N makes cudarc's context a green context of N SMs; unset = main's binary);
# (2) clocks sampled while the model runs in a process with the host decoder and one with nvJPEG.
set -u
G=.dev/gpu-run
S=$OUT/summary.md
W=/tmp/wd; mkdir -p $W
BIN=$W/ye; xz -dc $G/dist/ye-green.xz > $BIN; chmod +x $BIN
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader >> $S
run() { # tag, then env assignments and bench args
  local tag=$1; shift
  timeout ${TMO:-60} env "$@" --out $W/$tag > $W/$tag.md 2> $W/$tag.log; echo "## $tag rc=$? $(grep -m1 YE_X_SMS $W/$tag.log)" >> $S
  grep -E "^\| yolov9" $W/$tag.md >> $S
}
export RUST_BACKTRACE=1
for inp in 640x384 640x640; do
  run "sms0-$inp" $BIN bench --device cuda:0 --variants t,c --dtype f16 --batches 1,8 --mode model --warmup 5 --iters 300 --input $inp
done
for sms in 16 8; do
  for inp in 640x384 640x640; do
    run "sms$sms-$inp" YE_X_SMS=$sms $BIN bench --device cuda:0 --variants t,c --dtype f16 --batches 1,8 --mode model --warmup 5 --iters 300 --input $inp
  done
done
grep -v "^  *[0-9]*: \|^ *at /rustc\|^ *at /root/.cargo" $W/sms16-640x384.log | head -60 >> $S
echo "## c end to end at batch 1 on nvJPEG (random weights: every anchor a candidate)" >> $S
run "c-e2e" $BIN bench --device cuda:0 --variants c --dtype f16 --batches 1 --mode model,e2e --input 640x384 --jpeg-decoder nvjpeg --images $G/dev/volleyball-court.jpg --iters 300
grep -E "nvJPEG batch" $W/c-e2e.md $W/c-e2e.log | head >> $S
rm -f $BIN
tar czf $OUT/raw.tgz -C $W .
grep -vE "^\s*$" $S | cut -c1-160 | tail -80
