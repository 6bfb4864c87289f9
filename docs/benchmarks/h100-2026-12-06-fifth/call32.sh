#!/usr/bin/env bash
# planes from nvJPEG's default backend too (planar2): the network's input against the reference's decoder (cv2) on the photos,
# 4:2:2 and 4:4:4 re-encodes of the court photo (hardware decoder) and progressive re-encodes (default backend).
set -u
G=.dev/gpu-run
W=/tmp/w32; mkdir -p $W/save
xz -dc $G/dist/yolo-edge-planar2.xz > $W/ye; chmod +x $W/ye
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
S=$OUT/summary.md
nvidia-smi --query-gpu=name --format=csv,noheader >> $S
P="horses volleyball-court court-422 court-444 court-prog horses-prog"
timeout 120 $W/ye jpeg-selfcheck --device cuda:0 --save $W/save $(for p in $P; do echo $G/dev/$p.jpg; done) > $W/self.md 2> $W/self.log
echo "selfcheck rc=$?" >> $S; grep -E "^(horses|volleyball|court|device)" $W/self.md >> $S
python3 - $W $G $P <<'PY' >> $S 2>&1
import subprocess, sys
import numpy as np
W, G, names = sys.argv[1], sys.argv[2], sys.argv[3:]
import cv2
print("reference decoder: cv2", cv2.__version__)
print("| picture | input | nvJPEG planes + letterbox max / mean / share differing | nvJPEG RGB | host decoder (zune-jpeg) |")
print("|---|---|---|---|---|")
for name in names:
    src = f"{G}/dev/{name}.jpg"
    cv2.imwrite(f"{W}/{name}.ref.png", cv2.imread(src))
    subprocess.run([f"{W}/ye", "letterbox", f"{W}/{name}.ref.png", "--fit", "rect", "--out", f"{W}/{name}.ref.npy"], check=True, capture_output=True)
    subprocess.run([f"{W}/ye", "letterbox", src, "--fit", "rect", "--out", f"{W}/{name}.host.npy"], check=True, capture_output=True)
    ref = np.load(f"{W}/{name}.ref.npy").astype(int)
    cells = []
    for p in (f"{W}/save/{name}.jpg.planes.npy", f"{W}/save/{name}.jpg.rgb.npy", f"{W}/{name}.host.npy"):
        try:
            x = np.load(p).astype(int).reshape(ref.shape)
        except Exception as e:
            cells.append(f"- ({type(e).__name__})"); continue
        d = np.abs(x - ref)
        cells.append(f"{d.max()} / {d.mean():.4f} / {(d > 0).mean():.4f}")
    print(f"| {name}.jpg | {ref.shape[1]}x{ref.shape[0]} | " + " | ".join(cells) + " |")
PY
tar czf $OUT/raw.tgz -C $W --exclude ye --exclude '*.png' .
grep -vE "^\s*$" $S | cut -c1-300
