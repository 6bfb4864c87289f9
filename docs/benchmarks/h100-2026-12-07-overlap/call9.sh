#!/usr/bin/env bash
# The letterbox queued behind the decode before the wait (new, 01d6c5c), and the pass too (ovl), against 8d9a609 (old): nvJPEG and
# the step profile at batch 1 end to end, c random and real t, ABBA; then jpeg-selfcheck and a
# mixed batch with fallback pictures, host decoder against nvJPEG, on the new binary.
set -u
G=.dev/gpu-run
S=$OUT/step.md
W=/tmp/we; mkdir -p $W
xz -dc $G/dist/ye-step.xz > $W/old; xz -dc $G/dist/ye-new.xz > $W/new; xz -dc $G/dist/ye-ovl.xz > $W/ovl; chmod +x $W/old $W/new $W/ovl
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name --format=csv,noheader >> $S
lscpu | grep -E "Model name|^CPU\(s\)" >> $S
C=$G/dev/volleyball-court.jpg; H=$G/dev/horses.jpg; O=$G/dev/odd
run() { local tag=$1 bin=$2; shift 2
  timeout 70 $W/$bin bench --device cuda:0 "$@" --dtype f16 --batches 1 --mode model,e2e --input 640x384 --jpeg-decoder nvjpeg --images $C --iters 200 \
    --out $W/$tag > $W/$tag.md 2> $W/$tag.log; echo "## $tag rc=$? at ${SECONDS}s" >> $S
  grep -E "^\| " $W/$tag.md | grep -vE "^\| *(model|---)" >> $S; grep -E "nvJPEG batch|detection step|e2e batch . timed" $W/$tag.log | sed 's/^ *//' >> $S
}
for bin in old ovl ovl old; do run "c-$bin-$SECONDS" $bin --variants c; done
{
echo "## jpeg-selfcheck (ovl)"
timeout 60 $W/ovl jpeg-selfcheck --device cuda:0 $O/*.jpg $H $C 2>&1 | tail -30; echo "rc=${PIPESTATUS[0]}"
} > $OUT/check.md 2>&1
tar czf $OUT/raw.tgz -C $W --exclude old --exclude new --exclude ovl .
cut -c1-250 $S | grep -v "^\s*$"
echo =====
cut -c1-200 $OUT/check.md | tail -30
