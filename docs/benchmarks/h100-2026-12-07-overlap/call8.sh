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
  timeout 70 $W/$bin bench --device cuda:0 "$@" --dtype f16 --batches 1 --mode model,e2e --input 640x384 --jpeg-decoder nvjpeg --images $C --iters 300 \
    --out $W/$tag > $W/$tag.md 2> $W/$tag.log; echo "## $tag rc=$? at ${SECONDS}s" >> $S
  grep -E "^\| " $W/$tag.md | grep -vE "^\| *(model|---)" >> $S; grep -E "nvJPEG batch|detection step|e2e batch . timed" $W/$tag.log | sed 's/^ *//' >> $S
}
for bin in old ovl new ovl old; do run "c-$bin-$SECONDS" $bin --variants c; done
for bin in ovl old; do run "t-$bin-$SECONDS" $bin --model $G/dev/yolov9t-ball.pt; done
{
echo "## jpeg-selfcheck (ovl)"
timeout 60 $W/ovl jpeg-selfcheck --device cuda:0 $O/*.jpg $H $C 2>&1 | tail -30; echo "rc=${PIPESTATUS[0]}"
for dec in cpu nvjpeg-ovl; do
  bin=${dec#nvjpeg-}; [ $dec = cpu ] && bin=ovl
  timeout 90 $W/$bin detect --model $G/dev/yolov9t-ball.pt --device cuda:0 --dtype f16 --jpeg-decoder ${dec%-*} --conf 0.01 --batch 4 \
    --json $W/mix-$dec.jsonl $H $O/tem-marker-two-frame-headers.jpg $C $O/zune-jpeg-0.5.15-mul-overflow.jpg \
    $O/tem-marker-two-frame-headers-2.jpg $H $O/progressive.jpg $C $O/rot6.jpg $O/small.jpg $O/zune-jpeg-0.5.15-mul-overflow-padded.jpg $H \
    > $W/mix-$dec.log 2>&1
  echo "detect $dec rc=$?"
done
for v in ovl; do python3 - $W/mix-cpu.jsonl $W/mix-nvjpeg-$v.jsonl <<'PY'
import json, sys
load = lambda p: [json.loads(l) for l in open(p) if l.strip()]
a, b = load(sys.argv[1]), load(sys.argv[2])
print("records", len(a), len(b))
def iou(p, q):
    x1, y1 = max(p[0], q[0]), max(p[1], q[1]); x2, y2 = min(p[2], q[2]), min(p[3], q[3])
    i = max(0, x2 - x1) * max(0, y2 - y1); u = (p[2]-p[0])*(p[3]-p[1]) + (q[2]-q[0])*(q[3]-q[1]) - i
    return i / u if u > 0 else 1.0
for ra, rb in zip(a, b):
    da, db = ra.get("detections") or [], rb.get("detections") or []
    k = lambda d: d.get("bbox") or d.get("box") or d.get("xyxy")
    worst, dconf = 1.0, 0.0
    for d in da:
        best = max(((iou(k(d), k(e)), e) for e in db if e.get("class_id") == d.get("class_id")), default=(0, None), key=lambda t: t[0])
        worst = min(worst, best[0]); dconf = max(dconf, abs(d["confidence"] - best[1]["confidence"]) if best[1] else 1)
    name = (ra.get("image") or ra.get("path") or "?").split("/")[-1]
    print(f"{name[:40]:40s} cpu {len(da):3d} nvjpeg {len(db):3d} errs {bool(ra.get('error'))}/{bool(rb.get('error'))} worst IoU {worst:.4f} dconf {dconf:.1e}")
PY
done
} > $OUT/check.md 2>&1
tar czf $OUT/raw.tgz -C $W --exclude old --exclude new --exclude ovl .
cut -c1-250 $S | grep -v "^\s*$"
echo =====
cut -c1-200 $OUT/check.md | tail -30
