#!/usr/bin/env bash
# batch-1 end to end: base (main 02e59e6) against the pass queued behind the decode (new), alternating 4 runs each;
# nvJPEG asked for planar YUV (yuv binary, YE_X_YUV=1: timing only) against RGBI; selfcheck; detections base vs new.
set -u
G=.dev/gpu-run
W=/tmp/w29; mkdir -p $W
for b in base new yuv; do xz -dc $G/dist/yolo-edge-$b.xz > $W/ye-$b; chmod +x $W/ye-$b; done
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
S=$OUT/summary.md
nvidia-smi --query-gpu=name --format=csv,noheader >> $S
one() { # bin run [env]
  local b=$1 r=$2; shift 2
  env "$@" timeout 60 $W/ye-$b bench --device cuda:0 --model $G/dev/yolov9t-ball.pt --dtype f16 --batches 1 --mode model,e2e --input 640x384 \
    --jpeg-decoder nvjpeg --images $G/dev/volleyball-court.jpg --iters 300 --out $W/e2e-$b-$r > $W/e2e-$b-$r.md 2> $W/e2e-$b-$r.log
  echo "### $b run $r (rc=$?) $*" >> $S; grep -E "^\| yolov9t" $W/e2e-$b-$r.md >> $S; grep -E "timed runs" $W/e2e-$b-$r.log >> $S
}
for r in 1 2 3 4; do one base $r; one new $r; done
for r in 1 2; do one yuv rgb$r X=1; one yuv yuv$r YE_X_YUV=1; done
for b in base new; do
  for bs in 1 2; do
    timeout 120 $W/ye-$b detect --model $G/dev/yolov9t-ball.pt --device cuda:0 --dtype f16 --jpeg-decoder nvjpeg --conf 0.001 --batch $bs \
      --json $W/jd-$b-$bs.jsonl $G/dev/horses.jpg $G/dev/volleyball-court.jpg $G/dev/volleyball-court.jpg > $W/jd-$b-$bs.log 2>&1
    echo "detect $b batch $bs conf 0.001 rc=$? lines=$(wc -l < $W/jd-$b-$bs.jsonl) bytes=$(wc -c < $W/jd-$b-$bs.jsonl)" >> $S
  done
done
for bs in 1 2; do cmp $W/jd-base-$bs.jsonl $W/jd-new-$bs.jsonl >> $S 2>&1 && echo "batch $bs: detections identical base/new" >> $S; done
timeout 120 $W/ye-new jpeg-selfcheck --device cuda:0 > $W/self.md 2> $W/self.log; echo "selfcheck new rc=$?" >> $S; grep -A12 "score filter against" $W/self.md >> $S; tail -2 $W/self.md >> $S
tar czf $OUT/raw.tgz -C $W --exclude 'ye-*' .
python3 - $W <<'PY' >> $S
import glob, sys, statistics as st
rows = {}
for f in glob.glob(sys.argv[1] + '/e2e-*-*.md'):
    b, r = f.split('/')[-1][:-3].split('-')[1:3]
    name = b + ('' if b != 'yuv' else '-' + r.rstrip('0123456789'))
    for l in open(f):
        c = [x.strip() for x in l.split('|')]
        if len(c) > 8 and c[1] == 'yolov9t' and c[3] in ('model', 'e2e'):
            rows.setdefault((name, c[3]), []).append(float(c[7]))
for k in sorted(rows): print(k, 'p50s', rows[k], 'median', st.median(rows[k]))
PY
grep -vE "^\s*$" $S | cut -c1-260
