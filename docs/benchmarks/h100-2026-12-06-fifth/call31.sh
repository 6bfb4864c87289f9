#!/usr/bin/env bash
# planar vs base (nvJPEG RGB) vs the reference's decoder (cv2 = libjpeg-turbo): letterboxed pixels and detections against ultralytics
# predict on the two photos (f32, f16; conf 0.01); batch 64 e2e alternating 2 runs each; batch 1 e2e 2 more runs each.
set -u
G=.dev/gpu-run
W=/tmp/w31; mkdir -p $W/save $W/site
for b in base planar; do xz -dc $G/dist/yolo-edge-$b.xz > $W/ye-$b; chmod +x $W/ye-$b; done
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
python3 -m pip install -q --no-index --no-deps --target $W/site $G/whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$W/site YOLO_CONFIG_DIR=/tmp/ultra-cfg
S=$OUT/summary.md
nvidia-smi --query-gpu=name --format=csv,noheader >> $S
timeout 120 $W/ye-planar jpeg-selfcheck --device cuda:0 --save $W/save $G/dev/horses.jpg $G/dev/volleyball-court.jpg > $W/self.md 2> $W/self.log
echo "selfcheck rc=$?" >> $S; grep -E "^(horses|volleyball)" $W/self.md >> $S; ls $W/save >> $S
for d in f32 f16; do
  for dec in base:nvjpeg planar:nvjpeg planar:cpu; do b=${dec%%:*}; j=${dec##*:}
    timeout 120 $W/ye-$b detect --model $G/dev/yolov9t-ball.pt --device cuda:0 --dtype $d --jpeg-decoder $j --conf 0.01 --iou 0.7 --max-det 300 \
      --json $W/det-$b-$j-$d.jsonl $G/dev/horses.jpg $G/dev/volleyball-court.jpg > $W/det-$b-$j-$d.log 2>&1; echo "detect $b $j $d rc=$?" >> $S
  done
done
python3 - $W $G <<'PY' >> $S 2>&1
import json, subprocess, sys
import numpy as np
W, G = sys.argv[1], sys.argv[2]
try:
    import cv2
    dec = lambda p: cv2.imread(p)[:, :, ::-1]
    write_png = lambda p, rgb: cv2.imwrite(p, rgb[:, :, ::-1])
    print("reference decoder: cv2", cv2.__version__)
except Exception as e:
    from PIL import Image
    dec = lambda p: np.asarray(Image.open(p).convert("RGB"))
    write_png = lambda p, rgb: Image.fromarray(rgb).save(p)
    print("reference decoder: PIL (cv2 not importable:", e, ")")
print("| photo | input | nvJPEG planes + letterbox max / mean / share differing | nvJPEG RGB | host decoder (zune-jpeg) |")
print("|---|---|---|---|---|")
for name in ("horses", "volleyball-court"):
    src = f"{G}/dev/{name}.jpg"
    write_png(f"{W}/{name}.ref.png", np.ascontiguousarray(dec(src)))
    subprocess.run([f"{W}/ye-planar", "letterbox", f"{W}/{name}.ref.png", "--fit", "rect", "--out", f"{W}/{name}.ref.npy"], check=True, capture_output=True)
    subprocess.run([f"{W}/ye-planar", "letterbox", src, "--fit", "rect", "--out", f"{W}/{name}.host.npy"], check=True, capture_output=True)
    ref = np.load(f"{W}/{name}.ref.npy").astype(int)
    cells = []
    for p in (f"{W}/save/{name}.jpg.planes.npy", f"{W}/save/{name}.jpg.rgb.npy", f"{W}/{name}.host.npy"):
        x = np.load(p).astype(int).reshape(ref.shape)
        d = np.abs(x - ref)
        cells.append(f"{d.max()} / {d.mean():.4f} / {(d > 0).mean():.4f}")
    print(f"| {name}.jpg | {ref.shape[1]}x{ref.shape[0]} | " + " | ".join(cells) + " |")
sys.modules.setdefault("polars", None); sys.modules.setdefault("ultralytics_platform", None)
import torch
torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
from ultralytics import YOLO
def iou(a, b):
    ix = max(0, min(a[2], b[2]) - max(a[0], b[0])); iy = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    u = (a[2]-a[0])*(a[3]-a[1]) + (b[2]-b[0])*(b[3]-b[1]) - ix*iy
    return ix*iy/u if u > 0 else 0
m = YOLO(f"{G}/dev/yolov9t-ball.pt")
print("| dtype | photo | reference boxes | ours: base nvJPEG RGB | planar nvJPEG planes | host decoder |")
print("|---|---|---:|---|---|---|")
for d in ("f32", "f16"):
    ours = {k: [json.loads(l) for l in open(f"{W}/det-{k}-{d}.jsonl")] for k in ("base-nvjpeg", "planar-nvjpeg", "planar-cpu")}
    for i, name in enumerate(("horses", "volleyball-court")):
        r = m.predict(f"{G}/dev/{name}.jpg", device=0, half=(d == "f16"), conf=0.01, iou=0.7, max_det=300, verbose=False)[0]
        ref = [(r.boxes.xyxy[k].tolist(), float(r.boxes.conf[k]), int(r.boxes.cls[k])) for k in range(len(r.boxes))]
        cells = []
        for k in ("base-nvjpeg", "planar-nvjpeg", "planar-cpu"):
            dets = [(x["box"], x["confidence"], x["class_id"]) for x in ours[k][i]["detections"]]
            used, exact, worst_iou, worst_conf = set(), 0, 1.0, 0.0
            for b, c, cl in ref:
                cand = [(iou(b, e[0]), j) for j, e in enumerate(dets) if j not in used and e[2] == cl]
                best = max(cand, default=(0.0, None))
                if best[1] is None:
                    worst_iou = 0.0; continue
                used.add(best[1]); dc = abs(dets[best[1]][1] - c)
                worst_iou = min(worst_iou, best[0]); worst_conf = max(worst_conf, dc)
                exact += best[0] >= 0.99 and dc <= 1e-3
            cells.append(f"{len(dets)} boxes, {exact} within IoU 0.99 / conf 1e-3; worst IoU {worst_iou:.3f}, conf {worst_conf:.4f}")
        print(f"| {d} | {name}.jpg | {len(ref)} | " + " | ".join(cells) + " |")
PY
B="--device cuda:0 --model $G/dev/yolov9t-ball.pt --dtype f16 --input 640x384"
one() { local b=$1 t=$2; shift 2
  timeout 90 $W/ye-$b bench $B "$@" --out $W/$b-$t > $W/$b-$t.md 2> $W/$b-$t.log
  echo "### $b $t (rc=$?) $*" >> $S; grep -E "^\| yolov9t \| f16 \| (model|e2e)" $W/$b-$t.md >> $S; grep -E "timed runs" $W/$b-$t.log >> $S
}
for r in 1 2; do for b in base planar; do
  one $b b64-$r --batches 64 --mode e2e --jpeg-decoder nvjpeg --images $G/dev/volleyball-court.jpg --iters 20
  one $b court-$r --batches 1 --mode model,e2e --jpeg-decoder nvjpeg --images $G/dev/volleyball-court.jpg --iters 300
done; done
python3 - $W <<'PY' >> $S
import glob, sys, statistics as st
rows = {}
for f in glob.glob(sys.argv[1] + '/*-*-*.md'):
    b, t, r = f.split('/')[-1][:-3].split('-', 2)
    for l in open(f):
        c = [x.strip() for x in l.split('|')]
        if len(c) > 8 and c[1] == 'yolov9t' and c[3] in ('model', 'e2e'):
            rows.setdefault((t, b, c[3]), []).append((float(c[7]), float(c[8])))
for k in sorted(rows): print(k, 'p50 ms, img/s', rows[k])
PY
tar czf $OUT/raw.tgz -C $W --exclude 'ye-*' --exclude site .
grep -vE "^\s*$" $S | cut -c1-400
