#!/usr/bin/env python3
"""Rect-letterbox parity on the GPU (issue 20): `yolo-edge detect` on CUDA, f32 and f16, against
ultralytics `predict` at its defaults on the same card, over the five cases of the rect goldens
(portrait, 4:3, 16:9, square and the 3:2 original; sides that are not multiples of 32).

Usage (on the GPU machine; ultralytics importable; YOLO_EDGE_BIN = the CUDA binary;
YOLO_EDGE_FIXTURES = the fixtures folder):
    python3 scripts/gpu_rect_parity.py --work DIR [--models real,t,c] [--device cuda:0]

For each model (`real`: the fixture checkpoint yolov9t-ball.pt; `t`, `c`: the seeded-random-weight
models of tests/goldens/random_yolov9{t,c}.json, rebuilt and checked against them by
scripts/make_rect_goldens.py's `seeded_model`) and each case:
  pictures   yolo-edge decodes (and crops) the fixture (`letterbox --decoded --crop`); the pixels go
             to both sides, to ours as a lossless PNG;
  reference  `YOLO(ckpt).predict(bgr, device=0, quantize=16 for f16)` at conf 0.25 (its default) and
             0.01 (iou 0.7, max_det 300), TF32 off so that f32 is f32; raw: the checkpoint's
             network in the same dtype on the same card, on yolo-edge's rect letterbox pixels;
  ours       `yolo-edge detect --device cuda:0 --dtype f32|f16` (rect is its default) at the same
             thresholds, one picture per call with `--raw-out`.
Box for box as tests/model/parity.rs `rect_parity`: the same number of boxes, each reference box
paired with its own one of ours of the same class with IoU >= 0.99 and confidence within 1e-3
(or, at most 1 % of them, the same box and confidence under another class: counted as class ties,
which random weights make where two classes score alike).
Raw outputs: relative L2 against the reference in the same dtype (f32 <= 2e-3, f16 reported).
Prints a Markdown table, writes DIR/rect_parity.json; exit 1 when an f32 case or a real-checkpoint
f16 case does not match box for box.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.modules.setdefault("polars", None)
sys.modules.setdefault("ultralytics_platform", None)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import goldens_common as gc  # noqa: E402
import make_rect_goldens as mrg  # noqa: E402


def iou(a, b) -> float:
    x1, y1, x2, y2 = max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
    u = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / u if u > 0 else 0.0


def rel_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def pair(theirs: list[tuple], mine: list[tuple]) -> dict:
    """Box for box: each reference (box, conf, cls) paired with an unused one of ours of the same
    class, IoU >= 0.99 and |dconf| <= 1e-3 (the best IoU among those)."""
    used = [False] * len(mine)
    unmatched, ties, worst_iou, worst_dconf = 0, 0, 1.0, 0.0

    def best(rb, rc, same_class):
        found = None
        for i, (mb, mc, mcls) in enumerate(mine):
            if used[i] or (mcls == rcls) != same_class:
                continue
            o, dc = iou(rb, mb), abs(mc - rc)
            if o >= 0.99 and dc <= 1e-3 and (found is None or o > found[1]):
                found = (i, o, dc)
        return found

    # for the unpaired: the nearest of ours of the same class (IoU, |dconf|), to say how far off
    near_iou, near_dconf = 1.0, 0.0
    for rb, rc, rcls in theirs:
        hit = best(rb, rc, True)
        if hit is None:
            # the same box and confidence under another class: a class whose score ties at that anchor
            hit = best(rb, rc, False)
            if hit is None:
                unmatched += 1
                same = [(iou(rb, mb), abs(mc - rc)) for mb, mc, mcls in mine if mcls == rcls]
                o, dc = max(same, default=(0.0, 1.0))
                near_iou, near_dconf = min(near_iou, o), max(near_dconf, dc)
                continue
            ties += 1
        used[hit[0]] = True
        worst_iou, worst_dconf = min(worst_iou, hit[1]), max(worst_dconf, hit[2])
    # as tests/model/parity.rs: at most 1 % of the boxes paired only as class ties
    ok = unmatched == 0 and len(theirs) == len(mine) and ties * 100 <= len(theirs)
    return {"ref": len(theirs), "ours": len(mine), "unmatched": unmatched, "class_ties": ties, "worst_iou": worst_iou,
            "worst_dconf": worst_dconf, "unpaired_nearest_iou": near_iou, "unpaired_nearest_dconf": near_dconf, "ok": ok}


def reference_boxes(r) -> list[tuple]:
    b = r.boxes
    return [(b.xyxy[i].tolist(), float(b.conf[i]), int(b.cls[i])) for i in range(len(b))]


def our_boxes(line: dict) -> list[tuple]:
    return [(d["box"], d["confidence"], d["class_id"]) for d in line.get("detections", [])]


def detect(binary: str, ck: Path, device: str, dtype: str, conf: float, pictures: list[Path], json_out: Path, raw_out: Path | None):
    cmd = [binary, "detect", "--model", str(ck), "--device", device, "--dtype", dtype, "--conf", str(conf), "--iou", "0.7",
           "--max-det", "300", "--json", str(json_out)]
    if raw_out is not None:
        cmd += ["--raw-out", str(raw_out)]
    r = subprocess.run([*cmd, *map(str, pictures)], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {(r.stderr or r.stdout)[-600:]}")
    return [json.loads(l) for l in json_out.read_text().splitlines() if l.strip()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True)
    ap.add_argument("--models", default="real,t,c")
    ap.add_argument("--device", default="cuda:0", help="cuda:N (cpu: a smoke test of the script without a GPU)")
    a = ap.parse_args()
    import torch
    from PIL import Image
    from ultralytics import YOLO

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    binary = mrg.yolo_edge_bin()
    tdev = torch.device(a.device)
    pdev = tdev.index if tdev.type == "cuda" else "cpu"
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    cases = []
    for name, fixture, crop in mrg.CASES:
        rgb = mrg.rust_pixels(gc.FIXTURES / fixture, crop, ["--decoded"])
        lb = mrg.rust_pixels(gc.FIXTURES / fixture, crop, ["--fit", "rect"])
        png = work / f"{name}.png"
        Image.fromarray(rgb).save(png)
        cases.append((name, rgb, lb, png))
    rows, ok = [], True
    tmp = Path(tempfile.mkdtemp(prefix="rect-parity-"))
    # the real checkpoint first: DetectionModel(yaml) flips the class-wide Detect.legacy
    for m in sorted(a.models.split(","), key=lambda m: m != "real"):
        t0 = time.time()
        if m == "real":
            ck = gc.FIXTURES / "yolov9t-ball.pt"
            yolo = YOLO(str(ck))
            label = "yolov9t-ball.pt"
        else:
            yolo, _ = mrg.seeded_model(m, tmp)
            ck = Path(yolo.ckpt_path)
            label = f"yolov9{m} (seeded)"
        net32 = copy.deepcopy(yolo.model).float().eval().to(tdev)
        for dt in ("f32", "f16"):
            net = net32 if dt == "f32" else copy.deepcopy(net32).half()
            # a predictor keeps the dtype of its first call: one model object per dtype
            yolo = YOLO(str(ck))
            low = detect(binary, ck, a.device, dt, 0.01, [c[3] for c in cases], work / f"{m}-{dt}-low.jsonl", None)
            for k, (name, rgb, lb, png) in enumerate(cases):
                raw_path = work / f"{m}-{dt}-{name}.npy"
                default = detect(binary, ck, a.device, dt, 0.25, [png], work / f"{m}-{dt}-{name}.jsonl", raw_path)[0]
                bgr = np.ascontiguousarray(rgb[:, :, ::-1])
                with torch.inference_mode():
                    x = gc.to_input([lb]).to(tdev)
                    ref_raw = gc.detect_output(net(x.half() if dt == "f16" else x)).float().cpu().numpy()
                    # ultralytics 8.4: `quantize=16` is FP16 (`half=True` before it)
                    fp = {"quantize": 16} if dt == "f16" else {}
                    ref_default = yolo.predict(bgr, device=pdev, verbose=False, **fp)[0]
                    ref_low = yolo.predict(bgr, device=pdev, conf=0.01, verbose=False, **fp)[0]
                ours_raw = np.load(raw_path)
                row = {
                    "model": label,
                    "dtype": dt,
                    "case": name,
                    "size": f"{rgb.shape[1]}x{rgb.shape[0]}",
                    "input": f"{lb.shape[1]}x{lb.shape[0]}",
                    "raw_rel_l2": rel_l2(ours_raw, ref_raw) if ours_raw.shape == ref_raw.shape else None,
                    "conf_0_25": pair(reference_boxes(ref_default), our_boxes(default)),
                    "conf_0_01": pair(reference_boxes(ref_low), our_boxes(low[k])),
                }
                must = dt == "f32" or m == "real"
                row["ok"] = row["conf_0_25"]["ok"] and row["conf_0_01"]["ok"] and (dt != "f32" or (row["raw_rel_l2"] or 1.0) <= 2e-3)
                ok &= row["ok"] or not must
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
        print(f"{label}: {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    (work / "rect_parity.json").write_text(json.dumps({"torch": torch.__version__, "device": str(tdev), "rows": rows}, indent=1))
    print("| model | dtype | case | picture | input | raw rel L2 | boxes at 0.25 (ref/ours/unpaired) | boxes at 0.01 (ref/ours/unpaired) | "
          "worst IoU | worst dconf | unpaired: nearest IoU, dconf | box for box |")
    print("|---|---|---|---|---|---:|---|---|---:|---:|---|---|")
    for r in rows:
        hi, lo = r["conf_0_25"], r["conf_0_01"]
        raw = "shape differs" if r["raw_rel_l2"] is None else f"{r['raw_rel_l2']:.2e}"
        unpaired = hi["unmatched"] + lo["unmatched"]
        near_iou = min(hi["unpaired_nearest_iou"], lo["unpaired_nearest_iou"])
        near = f"{near_iou:.4f}, {max(hi['unpaired_nearest_dconf'], lo['unpaired_nearest_dconf']):.1e}" if unpaired else "-"
        print(f"| {r['model']} | {r['dtype']} | {r['case']} | {r['size']} | {r['input']} | {raw} | "
              f"{hi['ref']}/{hi['ours']}/{hi['unmatched']}/{hi['class_ties']} | {lo['ref']}/{lo['ours']}/{lo['unmatched']}/{lo['class_ties']} | "
              f"{min(hi['worst_iou'], lo['worst_iou']):.4f} | {max(hi['worst_dconf'], lo['worst_dconf']):.1e} | {near} | {'yes' if r['ok'] else 'NO'} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
