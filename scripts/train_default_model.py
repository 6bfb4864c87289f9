#!/usr/bin/env python3
"""Train yolo-edge's default model (YOLOv9-t from scratch on the synthetic shapes set) with
ultralytics, then validate the best checkpoint on the test split with ultralytics `val`.

Usage (see scripts/train_default_model.sh for the whole recipe):
    python3 scripts/train_default_model.py --data data/shapes/data.yaml --project runs/shapes \
        --imgsz 416 --minutes 4 --batch 64 --workers 12 --device 0

Writes PROJECT/train/ (ultralytics' run: weights/best.pt, results.csv, args.yaml) and
PROJECT/metrics.json: training time and the test-split metrics of ultralytics `val`, once
with `rect=False` (square letterbox, what `yolo-edge eval` does) and once with ultralytics'
default `rect=True`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def box_metrics(m, names) -> dict:
    """The numbers of an ultralytics DetMetrics, overall and per class."""
    b = m.box
    per_class = {}
    for i, c in enumerate(m.ap_class_index):
        p, r, ap50, ap = b.class_result(i)
        per_class[names[int(c)]] = {"precision": p, "recall": r, "map50": ap50, "map50_95": ap}
    return {"precision": b.mp, "recall": b.mr, "map50": b.map50, "map50_95": b.map, "per_class": per_class}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--project", type=Path, required=True)
    ap.add_argument("--model", default="yolov9t.yaml")
    ap.add_argument("--imgsz", type=int, default=416)
    ap.add_argument("--minutes", type=float, default=4.0, help="training time budget (ultralytics `time`)")
    ap.add_argument("--epochs", type=int, default=300, help="upper bound; the time budget decides")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--device", default="0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--amp", default="bf16", help="bf16 (no AMP self-check download), True (fp16) or False")
    ap.add_argument("--fraction", type=float, default=1.0, help="fraction of the train split (smoke tests)")
    a = ap.parse_args(argv)

    from ultralytics import YOLO  # imported late: --help works without ultralytics

    amp = {"true": True, "false": False}.get(a.amp.lower(), a.amp)
    project = a.project.resolve()
    t0 = time.time()
    model = YOLO(a.model)
    model.train(
        data=str(a.data.resolve()),
        epochs=a.epochs,
        time=a.minutes / 60.0,
        imgsz=a.imgsz,
        batch=a.batch,
        workers=a.workers,
        device=a.device,
        seed=a.seed,
        amp=amp,
        pretrained=False,
        cache="ram",
        plots=False,
        deterministic=False,
        fraction=a.fraction,
        project=str(project),
        name="train",
        exist_ok=True,
        verbose=False,
    )
    train_s = time.time() - t0
    best = project / "train" / "weights" / "best.pt"
    print(f"training took {train_s:.0f} s -> {best}", flush=True)

    out = {"train_seconds": round(train_s, 1), "imgsz": a.imgsz, "model": a.model, "seed": a.seed, "amp": str(a.amp)}
    for rect in (False, True):
        v = YOLO(str(best)).val(
            data=str(a.data.resolve()),
            split="test",
            imgsz=a.imgsz,
            batch=32,
            conf=0.001,
            iou=0.7,
            rect=rect,
            device=a.device,
            plots=False,
            project=str(project),
            name=f"test_rect{int(rect)}",
            exist_ok=True,
        )
        out[f"test_rect_{str(rect).lower()}"] = box_metrics(v, v.names)
    (project / "metrics.json").write_text(json.dumps(out, indent=2))
    print(json.dumps({k: v for k, v in out.items() if not isinstance(v, dict)} | {
        k: {m: round(v[m], 4) for m in ("precision", "recall", "map50", "map50_95")} for k, v in out.items() if isinstance(v, dict)
    }, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("YOLO_OFFLINE", "1")
    sys.exit(main())
