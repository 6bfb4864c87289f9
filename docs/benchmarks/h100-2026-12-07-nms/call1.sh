#!/usr/bin/env bash
# NMS by multiplies (nms) against 9bb5995 (base): c random and real t at batch 1 end to end
# (nvJPEG), alternated; the same detections from both binaries; a mixed batch with fallback
# pictures, host decoder against nvJPEG.
set -u
G=.dev/gpu-run
S=$OUT/step.md
W=/tmp/we; mkdir -p $W
for b in base nms; do xz -dc $G/dist/ye-$b.xz > $W/$b; chmod +x $W/$b; done
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name --format=csv,noheader >> $S
lscpu | grep -E "Model name|^CPU\(s\)|avx512f " | cut -c1-80 >> $S
lscpu | grep -o "avx512f" | head -1 >> $S
C=$G/dev/volleyball-court.jpg; H=$G/dev/horses.jpg; O=$G/dev/odd
run() { local tag=$1 bin=$2; shift 2
  timeout 70 $W/$bin bench --device cuda:0 "$@" --dtype f16 --batches 1 --mode model,e2e --input 640x384 --jpeg-decoder nvjpeg --images $C --iters 300 \
    --out $W/$tag > $W/$tag.md 2> $W/$tag.log; echo "## $tag rc=$? at ${SECONDS}s" >> $S
  grep -E "^\| " $W/$tag.md | grep -vE "^\| *(model|---)" >> $S; grep -E "nvJPEG batch|detection step|e2e batch . timed" $W/$tag.log | sed 's/^ *//' >> $S
}
for bin in base nms nms base base nms; do run "c-$bin-$SECONDS" $bin --variants c; done
for bin in nms base; do run "t-$bin-$SECONDS" $bin --model $G/dev/yolov9t-ball.pt; done
{
echo "## same detections, base and nms (crowded: random c at conf 0.001 and 0.25; real t at 0.01)"
for bin in base nms; do
  timeout 60 $W/$bin detect --model random:yolov9c --device cuda:0 --dtype f16 --conf 0.001 --json $W/det-c001-$bin.jsonl $H $C $O/*.jpg > $W/det-c001-$bin.log 2>&1; echo "c 0.001 $bin rc=$?"
  timeout 60 $W/$bin detect --model random:yolov9c --device cuda:0 --dtype f16 --json $W/det-c025-$bin.jsonl $H $C > $W/det-c025-$bin.log 2>&1; echo "c 0.25 $bin rc=$?"
  timeout 60 $W/$bin detect --model $G/dev/yolov9t-ball.pt --device cuda:0 --dtype f16 --conf 0.01 --json $W/det-t-$bin.jsonl $H $C $O/*.jpg > $W/det-t-$bin.log 2>&1; echo "t $bin rc=$?"
done
for k in c001 c025 t; do
  python3 - $W/det-$k-base.jsonl $W/det-$k-nms.jsonl $k <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]; b = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
n = sum(len(r.get("detections") or []) for r in a)
print(f"{sys.argv[3]}: records {len(a)}/{len(b)}, detections {n}/{sum(len(r.get('detections') or []) for r in b)}, identical: {a == b}")
PY
done
for dec in cpu nvjpeg; do
  timeout 90 $W/nms detect --model $G/dev/yolov9t-ball.pt --device cuda:0 --dtype f16 --jpeg-decoder $dec --conf 0.01 --batch 4 \
    --json $W/mix-$dec.jsonl $H $O/tem-marker-two-frame-headers.jpg $C $O/zune-jpeg-0.5.15-mul-overflow.jpg \
    $O/tem-marker-two-frame-headers-2.jpg $H $O/progressive.jpg $C $O/rot6.jpg $O/small.jpg $O/zune-jpeg-0.5.15-mul-overflow-padded.jpg $H \
    > $W/mix-$dec.log 2>&1
  echo "detect mixed batch $dec rc=$?"
done
python3 - $W/mix-cpu.jsonl $W/mix-nvjpeg.jsonl <<'PY'
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
    worst, dconf = 1.0, 0.0
    for d in da:
        best = max(((iou(d["box"], e["box"]), e) for e in db if e["class_id"] == d["class_id"]), default=(0, None), key=lambda t: t[0])
        worst = min(worst, best[0]); dconf = max(dconf, abs(d["confidence"] - best[1]["confidence"]) if best[1] else 1)
    name = (ra.get("image") or "?").split("/")[-1]
    print(f"{name[:40]:40s} cpu {len(da):3d} nvjpeg {len(db):3d} err {str(ra.get('error'))[:30]}/{str(rb.get('error'))[:30]} worst IoU {worst:.4f} dconf {dconf:.1e}")
PY
} > $OUT/check.md 2>&1
tar czf $OUT/raw.tgz -C $W --exclude base --exclude nms .
cut -c1-250 $S | grep -v "^\s*$"
echo =====
cut -c1-220 $OUT/check.md | tail -30
