#!/usr/bin/env bash
# NMS on the device (new: the commit that has `src/backend/cuda/nms.rs`, or later) against the
# host NMS (base: 9ad7ba9): the device NMS's self-check; c random and the real t at batches 1 and
# 64 end to end (nvJPEG), alternated; the same detections from both binaries on the photos and
# the odd JPEGs; a mixed batch, host decoder against nvJPEG. Staging (README.md beside this file):
#   .dev/gpu-run/dist/ye-base.xz, ye-new.xz   scripts/build-cuda.sh 90 --cudnn at each commit
#   .dev/gpu-run/dev/                         ../shared/fixtures' horses.jpg, volleyball-court.jpg,
#                                             yolov9t-ball.pt; odd/: fuzz/regressions/picture/*.jpg
#                                             and fuzz/seeds/picture/*.jpg
# Run: the device tool's run(command="mkdir -p $OUT && bash docs/benchmarks/pending-device-nms/call.sh",
#      carry=[".dev/gpu-run"]); about 300 s.
set -u
G=.dev/gpu-run
S=$OUT/step.md
W=/tmp/we; mkdir -p $W
for b in base new; do xz -dc $G/dist/ye-$b.xz > $W/$b; chmod +x $W/$b; done
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name --format=csv,noheader >> $S
lscpu | grep -E "Model name|^CPU\(s\)" | cut -c1-80 >> $S
C=$G/dev/volleyball-court.jpg; H=$G/dev/horses.jpg; O=$G/dev/odd
echo "## jpeg-selfcheck (new)" >> $S
timeout 90 $W/new jpeg-selfcheck --device cuda:0 $O/*.jpg $H $C > $OUT/selfcheck.md 2>&1; echo "rc=$?" >> $S
grep -A20 "device NMS against" $OUT/selfcheck.md >> $S; grep -E "score filter and NMS|score filter:" $OUT/selfcheck.md >> $S
run() { local tag=$1 bin=$2; shift 2
  timeout 80 $W/$bin bench --device cuda:0 "$@" --dtype f16 --batches 1,64 --mode model,e2e --input 640x384 --jpeg-decoder nvjpeg --images $C --iters 300 \
    --out $W/$tag > $W/$tag.md 2> $W/$tag.log; echo "## $tag rc=$? at ${SECONDS}s" >> $S
  grep -E "^\| yolov9" $W/$tag.md | grep -E "\| (model|e2e) \|" >> $S; grep -E "detection step|nvJPEG batch 1, timed" $W/$tag.log | sed 's/^ *//' | cut -c1-400 >> $S
}
for bin in base new new base base new; do run "c-$bin-$SECONDS" $bin --variants c; done
for bin in new base; do run "t-$bin-$SECONDS" $bin --model $G/dev/yolov9t-ball.pt; done
{
echo "## same detections, base and new (real t at conf 0.001, 0.01 and 0.25; batch 1 and 4)"
for bin in base new; do
  for conf in 0.001 0.01 0.25; do for batch in 1 4; do
    timeout 60 $W/$bin detect --model $G/dev/yolov9t-ball.pt --device cuda:0 --dtype f16 --conf $conf --batch $batch --json $W/det-$conf-$batch-$bin.jsonl $H $C $O/*.jpg > $W/det-$conf-$batch-$bin.log 2>&1
    echo "t $conf batch $batch $bin rc=$?"
  done; done
done
for conf in 0.001 0.01 0.25; do for batch in 1 4; do
  python3 - $W/det-$conf-$batch-base.jsonl $W/det-$conf-$batch-new.jsonl "$conf/$batch" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]; b = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
n = sum(len(r.get("detections") or []) for r in a)
print(f"conf/batch {sys.argv[3]}: records {len(a)}/{len(b)}, detections {n}/{sum(len(r.get('detections') or []) for r in b)}, identical: {a == b}")
PY
done; done
for dec in cpu nvjpeg; do
  timeout 90 $W/new detect --model $G/dev/yolov9t-ball.pt --device cuda:0 --dtype f16 --jpeg-decoder $dec --conf 0.01 --batch 4 \
    --json $W/mix-$dec.jsonl $H $O/tem-marker-two-frame-headers.jpg $C $O/zune-jpeg-0.5.15-mul-overflow.jpg \
    $O/tem-marker-two-frame-headers-2.jpg $H $O/progressive.jpg $C $O/rot6.jpg $O/small.jpg $O/zune-jpeg-0.5.15-mul-overflow-padded.jpg $H \
    > $W/mix-$dec.log 2>&1
  echo "detect mixed batch $dec rc=$?"
done
python3 - $W/mix-cpu.jsonl $W/mix-nvjpeg.jsonl <<'PY'
import json, sys
load = lambda p: [json.loads(l) for l in open(p) if l.strip()]
a, b = load(sys.argv[1]), load(sys.argv[2])
print("records", len(a), len(b), "identical", a == b)
for ra, rb in zip(a, b):
    name = (ra.get("image") or "?").split("/")[-1]
    print(f"{name[:40]:40s} cpu {len(ra.get('detections') or []):3d} nvjpeg {len(rb.get('detections') or []):3d} err {str(ra.get('error'))[:40]}/{str(rb.get('error'))[:40]}")
PY
} > $OUT/check.md 2>&1
tar czf $OUT/raw.tgz -C $W --exclude base --exclude new .
python3 - $S <<'PY'
import re, sys
rows, tag = {}, None
for line in open(sys.argv[1]):
    m = re.match(r"## (\w)-(\w+)-\d+ rc", line)
    if m: tag = m.group(1) + "-" + m.group(2); continue
    f = [x.strip() for x in line.split("|")]
    if tag and len(f) > 8 and f[3] in ("model", "e2e"):
        rows.setdefault(tag, {}).setdefault(f"{f[3]}{f[4]}", []).append(f[7])
    m = re.search(r"candidates copied back ([0-9.]+), per-picture lists ([0-9.]+), NMS and boxes ([0-9.]+)", line)
    if tag and m: rows[tag].setdefault("cand/lists/nms", []).append("/".join(m.groups()))
print("| run | model 1 | e2e 1 | model 64 | e2e 64 | step (cand/lists/nms) |")
for k, v in rows.items():
    print(f"| {k} | {v.get('model1')} | {v.get('e2e1')} | {v.get('model64')} | {v.get('e2e64')} | {v.get('cand/lists/nms')} |")
PY
echo =====
grep -E "differing|OK|FAILED|rc=" $S | head -30
cut -c1-200 $OUT/check.md | tail -32
