#!/usr/bin/env bash
# 1) call1.sh: parity, rect parity, jpeg-selfcheck and the fuzz regression JPEGs in nvJPEG batches
#    (the nvJPEG fallback change, base binary 8938286 = dist/yolo-edge-cuda-sm90-cudnn.xz).
# 2) A/B of the vector NMS (279f2f1 = dist/ye-new.xz) against base, alternated, end to end on
#    nvJPEG, 1080p court photo at 640x384: random c (every anchor a candidate) and the real t.
set -u
G=.dev/gpu-run
bash $G/call1.sh > $OUT/call1-tail.txt 2>&1
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
for r in 1 2; do for b in base new; do
  [ $SECONDS -lt 430 ] || { echo "skipped c-$b-$r: ${SECONDS}s" >> $S; continue; }
  run "c-$b-$r" $W/ye-$b bench --device cuda:0 --variants c --dtype f16 --batches 1,64 --mode model,e2e --input 640x384 --jpeg-decoder nvjpeg --images $G/dev/volleyball-court.jpg --iters 300
done; done
rm -f $W/ye-*
tar czf $OUT/ab-raw.tgz -C $W .
(cd $OUT && tar czf call1-raw.tgz mix-* gpu-run.log && rm -f mix-* gpu-run.log)
grep -vE "^\s*$" $OUT/summary.md 2>/dev/null | cut -c1-160 | grep -vE "^(1920x1080|773x512|1000x597|333x333|50x900)" | tail -30
echo ======; cut -c1-200 $OUT/odd.md | tail -25
echo ======; grep -vE "^\s*$" $S | cut -c1-170 | tail -30
