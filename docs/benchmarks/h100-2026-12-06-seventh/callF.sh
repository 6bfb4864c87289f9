#!/usr/bin/env bash
# parity on the card after the NMS change (main at 3076341): real checkpoint (raw outputs, detections),
# rect parity against predict (real, seeded t and c), nvJPEG + device letterbox self-check.
set -u
G=.dev/gpu-run
export DIST=$G/dist DEV=$G/dev WHL=$G/whl
RECT_TIMEOUT=240 PARITY_BATCHES=1 STEPS="info parity rectparity jpegcheck" OUT=/tmp/wf timeout 420 bash scripts/gpu_run.sh > $OUT/gpu-run.log 2>&1
echo "gpu_run rc=$?" >> $OUT/gpu-run.log
cp /tmp/wf/summary.md $OUT/summary.md
grep -vE "^\s*$" $OUT/summary.md | cut -c1-200 | grep -vE "^(1920x1080|773x512|1000x597|333x333|50x900)" | tail -60
