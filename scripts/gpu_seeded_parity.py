"""GPU parity on seeded random weights (issue 3): yolo-edge f32 (and f16) on the GPU against
ultralytics on the CPU, for every variant, all made in the same run.

For each variant: ultralytics builds `yolov9{V}.yaml` (nc=80, legacy head), every weight comes
from the seeded splitmix64 rule of scripts/goldens_common.py, BatchNorm running statistics are
calibrated on the letterboxed fixtures (the same recipe as the committed goldens; with plain
random init the output barely depends on the input), the model is saved as an ultralytics-style
checkpoint (float32, pickled DetectionModel under 'model'), and
  reference = that model in float64 on the CPU (and float32, to show the reference's own error),
  ours      = `yolo-edge detect --device cuda:0 --dtype f32|f16 --raw-out` on the same pictures.
Threshold (issue 3): f32 relative L2 error <= 2e-3. f16 is reported (no threshold on random
weights: their activations are far larger than a trained model's).

Usage (on the GPU machine, ultralytics importable, YOLO_EDGE_BIN = the CUDA binary):
  python3 scripts/gpu_seeded_parity.py --images horses.jpg volleyball-court.jpg --variants t,s,m,c,e --work DIR
Writes DIR/seeded_parity.json and prints a Markdown table; exit 1 when a threshold fails.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.modules.setdefault("polars", None)
sys.modules.setdefault("ultralytics_platform", None)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import goldens_common as gc  # noqa: E402


def rel_l2(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", nargs="+", required=True)
    ap.add_argument("--variants", default="t,s,m,c,e")
    ap.add_argument("--work", required=True)
    ap.add_argument("--device", default="cuda:0")
    a = ap.parse_args()
    import torch
    from ultralytics.nn.tasks import DetectionModel

    binary = os.environ["YOLO_EDGE_BIN"]
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    arrs = [gc.rust_letterbox(Path(p), 640, allow_fallback=False)[0] for p in a.images]
    x = gc.to_input(arrs)
    rows = []
    ok = True
    for v in a.variants.split(","):
        t0 = time.time()
        model = DetectionModel(f"yolov9{v}.yaml", nc=80, verbose=False)
        gc.apply_seeded_weights(model)
        model.float()
        gc.calibrate_bn(model, x)
        for p in model.parameters():
            p.requires_grad = False
        model.names = {i: f"class{i}" for i in range(80)}
        model.args = {"imgsz": 640, "task": "detect"}
        with torch.no_grad():
            ref32 = gc.detect_output(model(x)).numpy()
            m64 = DetectionModel(f"yolov9{v}.yaml", nc=80, verbose=False)
            m64.load_state_dict(model.state_dict())
            m64 = m64.double().eval()
            ref64 = gc.detect_output(m64(x.double())).numpy()
        del m64
        ck = work / f"seeded-yolov9{v}.pt"
        torch.save({"model": model, "ema": None, "train_args": {"imgsz": 640}}, ck)
        row = {"variant": v, "torch_f32_vs_f64": rel_l2(ref32, ref64)}
        for dt in ("f32", "f16"):
            raw = work / f"raw-{v}-{dt}.npy"
            cmd = [binary, "detect", "--model", str(ck), "--device", a.device, "--dtype", dt, "--imgsz", "640", "--fit", "square",
                   "--batch", str(len(a.images)), "--raw-out", str(raw), *a.images]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            if r.returncode not in (0,) or not raw.exists():
                row[f"ours_{dt}"] = None
                row[f"error_{dt}"] = (r.stderr or r.stdout)[-400:]
                ok = False
                continue
            ours = np.load(raw)
            assert ours.shape == ref64.shape, (ours.shape, ref64.shape)
            row[f"ours_{dt}"] = rel_l2(ours, ref64)
        row["pass_f32"] = row.get("ours_f32") is not None and row["ours_f32"] <= 2e-3
        ok &= row["pass_f32"]
        row["seconds"] = round(time.time() - t0, 1)
        rows.append(row)
        ck.unlink()
        print(json.dumps(row), file=sys.stderr, flush=True)
    (work / "seeded_parity.json").write_text(json.dumps({"rows": rows, "torch": torch.__version__}, indent=1))
    print("| variant | ours f32 (GPU) vs torch f64 | ours f16 (GPU) vs torch f64 | torch f32 (CPU) vs f64 | f32 <= 2e-3 |")
    print("|---|---:|---:|---:|---|")
    f = lambda v: "failed" if v is None else f"{v:.2e}"  # noqa: E731
    for r in rows:
        print(f"| yolov9{r['variant']} | {f(r.get('ours_f32'))} | {f(r.get('ours_f16'))} | {r['torch_f32_vs_f64']:.2e} | {'yes' if r['pass_f32'] else 'NO'} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
