#!/usr/bin/env bash
# base (main 9bf7609) against final (one-copy candidates + letterbox streaming loads): batch-1 e2e alternating 4 runs each; final's model pass with and without nvJPEG set up; e2e batch 64; selfcheck; detections identical.
set -u
G=.dev/gpu-run
W=/tmp/w11; mkdir -p $W
for b in base final; do xz -dc $G/dist/yolo-edge-$b.xz > $W/ye-$b; chmod +x $W/ye-$b; done
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
S=$OUT/summary.md
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,pstate --format=csv,noheader >> $S
B="--device cuda:0 --model $G/dev/yolov9t-ball.pt --dtype f16 --input 640x384"
one() { # bin tag args...
  local b=$1 t=$2; shift 2
  timeout 90 $W/ye-$b bench $B "$@" --out $W/$b-$t > $W/$b-$t.md 2> $W/$b-$t.log
  echo "### $b $t (rc=$?) $*" >> $S; grep -E "^\| yolov9t \| f16 \| (model|e2e)" $W/$b-$t.md >> $S
}
for r in 1 2 3 4; do
  one base b1-$r --batches 1 --mode model,e2e --jpeg-decoder nvjpeg --images $G/dev/volleyball-court.jpg --iters 300
  one final b1-$r --batches 1 --mode model,e2e --jpeg-decoder nvjpeg --images $G/dev/volleyball-court.jpg --iters 300
done
for r in 1 2; do
  one final model-only-$r --batches 1 --mode model --iters 300
  one final model-cpujpeg-$r --batches 1 --mode model,e2e --jpeg-decoder cpu --images $G/dev/volleyball-court.jpg --iters 300
done
for b in base final; do one $b b64 --batches 64 --mode e2e --jpeg-decoder nvjpeg --images $G/dev/horses.jpg,$G/dev/volleyball-court.jpg --iters 20; done
for b in base final; do
  for bs in 1 2; do
    timeout 120 $W/ye-$b detect --model $G/dev/yolov9t-ball.pt --device cuda:0 --dtype f16 --jpeg-decoder nvjpeg --conf 0.001 --batch $bs \
      --json $W/jd-$b-$bs.jsonl $G/dev/horses.jpg $G/dev/volleyball-court.jpg $G/dev/volleyball-court.jpg > $W/jd-$b-$bs.log 2>&1
    echo "detect $b batch $bs conf 0.001 rc=$? lines=$(wc -l < $W/jd-$b-$bs.jsonl) bytes=$(wc -c < $W/jd-$b-$bs.jsonl)" >> $S
  done
done
for bs in 1 2; do cmp $W/jd-base-$bs.jsonl $W/jd-final-$bs.jsonl >> $S 2>&1 && echo "batch $bs: detections identical base/final" >> $S; done
timeout 120 $W/ye-final jpeg-selfcheck --device cuda:0 > $W/self.md 2> $W/self.log; echo "selfcheck final rc=$?" >> $S; tail -1 $W/self.md >> $S
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,pstate --format=csv,noheader >> $S
cp $W/self.md $OUT/selfcheck.md
tar czf $OUT/raw.tgz -C $W --exclude 'ye-*' .
python3 - $W <<'PY' >> $S
import glob, sys, statistics as st
rows = {}
for f in glob.glob(sys.argv[1] + '/*-b1-*.md'):
    name = f.split('/')[-1].split('-')[0]
    for l in open(f):
        c = [x.strip() for x in l.split('|')]
        if len(c) > 8 and c[1] == 'yolov9t' and c[3] in ('model', 'e2e'):
            rows.setdefault((name, c[3]), []).append(float(c[7]))
for k in sorted(rows): print(k, 'p50s', rows[k], 'median', st.median(rows[k]))
PY
grep -vE "^\s*$" $S | cut -c1-260
