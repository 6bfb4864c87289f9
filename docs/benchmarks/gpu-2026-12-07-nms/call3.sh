#!/usr/bin/env bash
# The nvJPEG fallback on the card: jpeg-selfcheck on the fuzz regression JPEGs and odd seeds, and
# detect with the host decoder against nvJPEG, odd pictures mixed into batches of 4 with the photos
# (binary of 279f2f1).
set -u
G=.dev/gpu-run
DIST=$G/dist DEV=$G/dev
mkdir -p /tmp/w3; xz -dc $DIST/ye-new.xz > /tmp/w3/yolo-edge; chmod +x /tmp/w3/yolo-edge; BIN=/tmp/w3/yolo-edge
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
H=$DEV/horses.jpg; C=$DEV/volleyball-court.jpg; O=$DEV/odd
{
echo "## jpeg-selfcheck on the fuzz regressions and odd seeds"
timeout 60 $BIN jpeg-selfcheck --device cuda:0 $O/*.jpg $H $C 2>&1 | tail -40; echo "rc=${PIPESTATUS[0]}"
echo "## detect, host decoder vs nvJPEG, odd pictures mixed into batches of 4 with the photos"
for dec in cpu nvjpeg; do
  timeout 90 $BIN detect --model $DEV/yolov9t-ball.pt --device cuda:0 --dtype f16 --jpeg-decoder $dec --conf 0.01 --batch 4 \
    --json $OUT/mix-$dec.jsonl $H $O/tem-marker-two-frame-headers.jpg $C $O/zune-jpeg-0.5.15-mul-overflow.jpg \
    $O/tem-marker-two-frame-headers-2.jpg $H $O/progressive.jpg $C $O/rot6.jpg $O/small.jpg $O/zune-jpeg-0.5.15-mul-overflow-padded.jpg $H \
    > $OUT/mix-$dec.log 2>&1
  echo "detect $dec rc=$?"; grep -iE "error|fail|corrupt|panic" $OUT/mix-$dec.log | cut -c1-220 | head -12
done
python3 - $OUT/mix-cpu.jsonl $OUT/mix-nvjpeg.jsonl <<'PY'
import json, sys
def load(p):
    out = []
    for l in open(p):
        l = l.strip()
        if l: out.append(json.loads(l))
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
print("records", len(a), len(b))
def iou(p, q):
    x1, y1 = max(p[0], q[0]), max(p[1], q[1]); x2, y2 = min(p[2], q[2]), min(p[3], q[3])
    i = max(0, x2 - x1) * max(0, y2 - y1); u = (p[2]-p[0])*(p[3]-p[1]) + (q[2]-q[0])*(q[3]-q[1]) - i
    return i / u if u > 0 else 1.0
for ra, rb in zip(a, b):
    da, db = ra.get("detections") or [], rb.get("detections") or []
    keyb = lambda d: d.get("bbox") or d.get("box") or d.get("xyxy")
    worst = 1.0; dconf = 0.0
    for d in da:
        best = max(((iou(keyb(d), keyb(e)), e) for e in db if e.get("class_id") == d.get("class_id")), default=(0, None), key=lambda t: t[0])
        worst = min(worst, best[0]); dconf = max(dconf, abs(d["confidence"] - best[1]["confidence"]) if best[1] else 1)
    name = (ra.get("image") or ra.get("path") or "?").split("/")[-1]
    print(f"{name:45s} cpu {len(da):3d} nvjpeg {len(db):3d} err cpu {str(ra.get('error'))[:60]!s:60s} nvjpeg {str(rb.get('error'))[:60]!s:60s} worst IoU {worst:.4f} dconf {dconf:.2e}")
PY
} > $OUT/odd.md 2>&1
cut -c1-230 $OUT/odd.md | tail -45
