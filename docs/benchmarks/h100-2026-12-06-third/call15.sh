#!/usr/bin/env bash
# batch-1 end to end: main (prof) against the copy-free header check (X0), + letterbox queued before the decode wait (X1), + no wait at all (X2); alternating, 3 runs each.
set -u
G=.dev/gpu-run
W=/tmp/w5; mkdir -p $W
xz -dc $G/dist/yolo-edge-prof.xz > $W/ye-main; xz -dc $G/dist/yolo-edge-defer.xz > $W/ye-x; chmod +x $W/ye-*
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
S=$OUT/summary.md
nvidia-smi --query-gpu=name --format=csv,noheader >> $S
one() { # name bin defer run
  YE_X_DEFER=$3 timeout 60 $W/$2 bench --device cuda:0 --model $G/dev/yolov9t-ball.pt --dtype f16 --batches 1 --mode model,e2e --input 640x384 \
    --jpeg-decoder nvjpeg --images $G/dev/volleyball-court.jpg --iters 300 --out $W/e2e-$1-$4 > $W/e2e-$1-$4.md 2> $W/e2e-$1-$4.log
  echo "### $1 run $4 (rc=$?)" >> $S; grep -E "^\| yolov9t" $W/e2e-$1-$4.md >> $S; grep -E "timed runs|XT" $W/e2e-$1-$4.log >> $S
}
for r in 1 2 3; do
  one main ye-main 0 $r; one x0 ye-x 0 $r; one x1 ye-x 1 $r; one x2 ye-x 2 $r
done
for m in 0 2; do
  YE_X_DEFER=$m timeout 120 $W/ye-x detect --model $G/dev/yolov9t-ball.pt --device cuda:0 --dtype f16 --jpeg-decoder nvjpeg --conf 0.01 --batch 1 \
    --json $W/jd-$m.jsonl $G/dev/horses.jpg $G/dev/volleyball-court.jpg $G/dev/volleyball-court.jpg > $W/jd-$m.log 2>&1
  echo "detect defer=$m rc=$? lines=$(wc -l < $W/jd-$m.jsonl)" >> $S
done
cmp $W/jd-0.jsonl $W/jd-2.jsonl >> $S 2>&1 && echo "detections identical with and without the wait" >> $S
YE_X_DEFER=2 timeout 120 $W/ye-x jpeg-selfcheck --device cuda:0 > $W/self.md 2> $W/self.log; echo "selfcheck defer=2 rc=$?" >> $S; tail -2 $W/self.md >> $S
tar czf $OUT/raw.tgz -C $W --exclude 'ye-*' .
python3 - $W <<'PY' >> $S
import glob, re, sys, statistics as st
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
