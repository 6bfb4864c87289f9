#!/usr/bin/env python3
"""Golden for the rect letterbox: ultralytics `predict` at its defaults on photos of several aspect ratios.

    YOLO_EDGE_BIN=target/debug/yolo-edge ~/.cache/yolo-edge/ref-venv/bin/python scripts/make_rect_goldens.py

For each case the picture is decoded (and cropped) by yolo-edge itself (`yolo-edge letterbox --decoded --crop`),
so both sides start from the same pixels; the reference then does everything else its own way: `model.predict`
on the BGR array (LetterBox(auto=True) when the batch shares a shape, its NMS, `scale_boxes`), at its defaults
(imgsz 640, conf 0.25, iou 0.7, max_det 300) and again at conf 0.01 for many boxes near the threshold. The raw
output on the rect input (yolo-edge's rect letterbox pixels, `--fit rect`) is summarised as in the other goldens.
Writes tests/goldens/rect_yolov9t_ball.json.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import goldens_common as gc  # noqa: E402

# name, fixture, crop (x, y, w, h) or None: portrait, 4:3, 16:9, square and 3:2, sides not multiples of 32
CASES = [
    ("horses", "horses.jpg", None),
    ("court-16x9", "volleyball-court.jpg", None),
    ("court-portrait", "volleyball-court.jpg", (700, 40, 601, 1000)),
    ("horses-4x3", "horses.jpg", (20, 0, 680, 510)),
    ("horses-square", "horses.jpg", (100, 0, 509, 509)),
]


def rust_pixels(fixture: Path, crop, extra: list[str]) -> np.ndarray:
    with tempfile.TemporaryDirectory() as td:
        out = Path(td) / "p.npy"
        cmd = [os.environ.get("YOLO_EDGE_BIN", str(gc.REPO / "target" / "debug" / "yolo-edge")), "letterbox", str(fixture),
               "--out", str(out), *extra]
        if crop:
            cmd += ["--crop", ",".join(map(str, crop))]
        subprocess.run(cmd, check=True, capture_output=True, timeout=600)
        return np.load(out)


def boxes(r) -> list[dict]:
    b = r.boxes
    return [{"box": gc.f32list(b.xyxy[i].numpy()), "confidence": float(b.conf[i]), "class_id": int(b.cls[i])} for i in range(len(b))]


def main() -> None:
    import torch
    from ultralytics import YOLO

    torch.manual_seed(0)
    ckpt = gc.FIXTURES / "yolov9t-ball.pt"
    model = YOLO(str(ckpt))
    cases = []
    for name, fixture, crop in CASES:
        rgb = rust_pixels(gc.FIXTURES / fixture, crop, ["--decoded"])
        bgr = np.ascontiguousarray(rgb[:, :, ::-1])
        default = model.predict(bgr, device="cpu", verbose=False)[0]
        low = model.predict(bgr, device="cpu", conf=0.01, verbose=False)[0]
        lb = rust_pixels(gc.FIXTURES / fixture, crop, ["--fit", "rect"])
        with torch.no_grad():
            raw = gc.detect_output(model.model.float().eval()(gc.to_input([lb])))
        print(f"{name}: {rgb.shape[1]}x{rgb.shape[0]} -> input {lb.shape[1]}x{lb.shape[0]}, "
              f"{len(default.boxes)} boxes at 0.25, {len(low.boxes)} at 0.01")
        cases.append({
            "name": name, "image": fixture, "crop": crop, "width": int(rgb.shape[1]), "height": int(rgb.shape[0]),
            "decoded_sha256": gc.sha256(rgb.tobytes()), "input_shape": [int(lb.shape[0]), int(lb.shape[1])],
            "input_sha256": gc.sha256(lb.tobytes()),
            "predict_default": boxes(default), "predict_conf_0_01": boxes(low),
            "raw": gc.output_summary(raw, n_samples=512),
        })
    gc.write_json(gc.REPO / "tests" / "goldens" / "rect_yolov9t_ball.json", {
        "provenance": gc.provenance("yolo-edge letterbox --decoded (pixels), then ultralytics YOLO(ckpt).predict(bgr) at its "
                                    "defaults and at conf=0.01, device=cpu; raw: model.model on yolo-edge's --fit rect pixels"),
        "cases": cases,
    })


if __name__ == "__main__":
    main()
