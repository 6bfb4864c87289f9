#!/usr/bin/env bash
# nvJPEG planes converted by the letterbox (planar) against base (main 02e59e6, nvJPEG's RGB): batch-1 e2e alternating 4 runs
# (1080p 4:2:0), 2 runs on the 4:4:0 photo; batch 64 e2e; selfcheck with the photos; detections base vs planar; gpu_run.sh jpegcheck.
set -u
G=.dev/gpu-run
W=/tmp/w30; mkdir -p $W
for b in base planar; do xz -dc $G/dist/yolo-edge-$b.xz > $W/ye-$b; chmod +x $W/ye-$b; done
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
S=$OUT/summary.md
nvidia-smi --query-gpu=name --format=csv,noheader >> $S
B="--device cuda:0 --model $G/dev/yolov9t-ball.pt --dtype f16"
one() { # bin tag args...
  local b=$1 t=$2; shift 2
  timeout 90 $W/ye-$b bench $B "$@" --out $W/$b-$t > $W/$b-$t.md 2> $W/$b-$t.log
  echo "### $b $t (rc=$?) $*" >> $S; grep -E "^\| yolov9t \| f16 \| (model|e2e)" $W/$b-$t.md >> $S; grep -E "timed runs" $W/$b-$t.log >> $S
}
for r in 1 2 3 4; do for b in base planar; do
  one $b court-$r --input 640x384 --batches 1 --mode model,e2e --jpeg-decoder nvjpeg --images $G/dev/volleyball-court.jpg --iters 300
done; done
for r in 1 2; do for b in base planar; do
  one $b horses-$r --input 640x448 --batches 1 --mode model,e2e --jpeg-decoder nvjpeg --images $G/dev/horses.jpg --iters 300
done; done
for b in base planar; do one $b b64-1 --input 640x384 --batches 64 --mode e2e --jpeg-decoder nvjpeg --images $G/dev/volleyball-court.jpg --iters 20; done
timeout 120 $W/ye-planar jpeg-selfcheck --device cuda:0 $G/dev/horses.jpg $G/dev/volleyball-court.jpg > $W/self.md 2> $W/self.log
echo "selfcheck planar rc=$?" >> $S; sed -n '/^nvJPEG/,$p' $W/self.md >> $S
for b in base planar; do for bs in 1 2; do
  timeout 120 $W/ye-$b detect --model $G/dev/yolov9t-ball.pt --device cuda:0 --dtype f16 --jpeg-decoder nvjpeg --conf 0.001 --batch $bs \
    --json $W/jd-$b-$bs.jsonl $G/dev/horses.jpg $G/dev/volleyball-court.jpg $G/dev/volleyball-court.jpg > $W/jd-$b-$bs.log 2>&1
  echo "detect $b batch $bs conf 0.001 rc=$?" >> $S
done; done
python3 - $W <<'PY' >> $S
import json, sys
W = sys.argv[1]
def iou(a, b):
    ix = max(0, min(a[2], b[2]) - max(a[0], b[0])); iy = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    u = (a[2]-a[0])*(a[3]-a[1]) + (b[2]-b[0])*(b[3]-b[1]) - ix*iy
    return ix*iy/u if u > 0 else 0
for bs in (1, 2):
    A = [json.loads(l) for l in open(f"{W}/jd-base-{bs}.jsonl")]; P = [json.loads(l) for l in open(f"{W}/jd-planar-{bs}.jsonl")]
    for a, p in zip(A, P):
        da, dp = a["detections"], p["detections"]
        used, matched, worst_iou, worst_conf = set(), 0, 1.0, 0.0
        for d in da:
            cand = [(iou(d["box"], e["box"]), k) for k, e in enumerate(dp) if k not in used and e["class_id"] == d["class_id"] and abs(e["confidence"] - d["confidence"]) <= 1e-3]
            best = max(cand, default=(0, None))
            if best[1] is not None and best[0] >= 0.99:
                used.add(best[1]); matched += 1; worst_iou = min(worst_iou, best[0]); worst_conf = max(worst_conf, abs(dp[best[1]]["confidence"] - d["confidence"]))
        hi = lambda ds: sum(x["confidence"] >= 0.25 for x in ds)
        print(f"batch {bs} {a['image'].split('/')[-1]}: base {len(da)} boxes ({hi(da)} >= 0.25), planar {len(dp)} ({hi(dp)}); paired (class, IoU >= 0.99, |conf| <= 1e-3): {matched}; worst IoU {worst_iou:.4f}, conf {worst_conf:.5f}; top conf base {[round(x['confidence'],4) for x in da[:3]]} planar {[round(x['confidence'],4) for x in dp[:3]]}")
PY
python3 - $W <<'PY' >> $S
import glob, sys, statistics as st
rows = {}
for f in glob.glob(sys.argv[1] + '/*-*-*.md'):
    b, t, r = f.split('/')[-1][:-3].split('-', 2)
    for l in open(f):
        c = [x.strip() for x in l.split('|')]
        if len(c) > 8 and c[1] == 'yolov9t' and c[3] in ('model', 'e2e'):
            rows.setdefault((t, b, c[3]), []).append(float(c[7]))
for k in sorted(rows): print(k, 'p50s', rows[k], 'median', st.median(rows[k]))
PY
DIST=$G/dist-planar DEV=$G/dev STEPS=jpegcheck OUT=$W/gr timeout 200 bash $G/scripts/gpu_run.sh > /dev/null 2>&1; echo "gpu_run jpegcheck rc=$?" >> $S
grep -E "^(f16|f32|detect|graph)" $W/gr/summary.md >> $S
tar czf $OUT/raw.tgz -C $W --exclude 'ye-*' --exclude 'gr/work/yolo-edge*' .
grep -vE "^\s*$" $S | cut -c1-330
