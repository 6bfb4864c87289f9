#!/usr/bin/env bash
# batch-1 end to end: base (main 9bf7609) against tl2 (one-copy candidates + host marks + CUDA events between the stages); alternating, 3 runs each.
set -u
G=.dev/gpu-run
W=/tmp/w7; mkdir -p $W
for b in base tl2; do xz -dc $G/dist/yolo-edge-$b.xz > $W/ye-$b; chmod +x $W/ye-$b; done
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
S=$OUT/summary.md
nvidia-smi --query-gpu=name --format=csv,noheader >> $S
one() { # bin run
  timeout 60 $W/ye-$1 bench --device cuda:0 --model $G/dev/yolov9t-ball.pt --dtype f16 --batches 1 --mode model,e2e --input 640x384 \
    --jpeg-decoder nvjpeg --images $G/dev/volleyball-court.jpg --iters 300 --out $W/e2e-$1-$2 > $W/e2e-$1-$2.md 2> $W/e2e-$1-$2.log
  echo "### $1 run $2 (rc=$?)" >> $S; grep -E "^\| yolov9t" $W/e2e-$1-$2.md >> $S; grep -E "timed runs" $W/e2e-$1-$2.log >> $S
}
for r in 1 2 3; do one base $r; one tl2 $r; done
for r in 1 2 3; do echo "### tl2 timeline (run $r)" >> $S; grep XT $W/e2e-tl2-$r.log >> $S; done
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
