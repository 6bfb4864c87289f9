#!/usr/bin/env bash
# batch-1 e2e: where the pass's extra 0.11 ms on the device comes from (tl3: the graph replayed twice after the decode, YE_X_REPLAY=1); base against new (one-copy candidates) again.
set -u
G=.dev/gpu-run
W=/tmp/w8; mkdir -p $W
for b in base new tl3; do xz -dc $G/dist/yolo-edge-$b.xz > $W/ye-$b; chmod +x $W/ye-$b; done
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
S=$OUT/summary.md
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,pstate --format=csv,noheader >> $S
one() { # bin run [env]
  env ${3:-X=1} timeout 60 $W/ye-$1 bench --device cuda:0 --model $G/dev/yolov9t-ball.pt --dtype f16 --batches 1 --mode model,e2e --input 640x384 \
    --jpeg-decoder nvjpeg --images $G/dev/volleyball-court.jpg --iters 300 --out $W/e2e-$1-$2 > $W/e2e-$1-$2.md 2> $W/e2e-$1-$2.log
  echo "### $1 run $2 ${3:-} (rc=$?)" >> $S; grep -E "^\| yolov9t \| f16 \| (model|e2e)" $W/e2e-$1-$2.md >> $S
}
one tl3 r1 YE_X_REPLAY=1; one tl3 p1
echo "### tl3 replay timeline" >> $S; grep -E "XT e2e.*E " $W/e2e-tl3-r1.log >> $S
echo "### tl3 plain timeline" >> $S; grep -E "XT e2e.*E " $W/e2e-tl3-p1.log >> $S
for r in 1 2 3; do one base $r; one new $r; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,pstate --format=csv,noheader >> $S
tar czf $OUT/raw.tgz -C $W --exclude 'ye-*' .
python3 - $W <<'PY' >> $S
import glob, sys, statistics as st
rows = {}
for f in glob.glob(sys.argv[1] + '/e2e-*-*.md'):
    name = f.split('/')[-1].split('-')[1]
    for l in open(f):
        c = [x.strip() for x in l.split('|')]
        if len(c) > 8 and c[1] == 'yolov9t' and c[3] in ('model', 'e2e'):
            rows.setdefault((name, c[3]), []).append(float(c[7]))
for k in sorted(rows): print(k, 'p50s', rows[k], 'median', st.median(rows[k]))
PY
grep -vE "^\s*$" $S | cut -c1-260
