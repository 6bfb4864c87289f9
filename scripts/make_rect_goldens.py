#!/usr/bin/env python3
"""Goldens for the rect letterbox: ultralytics `predict` at its defaults on photos of several aspect ratios.

    YOLO_EDGE_BIN=target/debug/yolo-edge ~/.cache/yolo-edge/ref-venv/bin/python scripts/make_rect_goldens.py
    YOLO_EDGE_BIN=target/debug/yolo-edge ~/.cache/yolo-edge/ref-venv/bin/python scripts/make_rect_goldens.py --models t,c

`--models` (default `real,t,c`) picks the goldens: `real` writes tests/goldens/rect_yolov9t_ball.json (the fixture
checkpoint yolov9t-ball.pt); `t` and `c` write tests/goldens/rect_random_yolov9{t,c}.json for the seeded-random-weight
models of the random goldens (scripts/README.md: `DetectionModel("yolov9{V}.yaml", nc=80)`, `seeded_value` weights,
BatchNorm statistics calibrated on the two fixtures letterboxed square at 640 by yolo-edge, exactly as
scripts/make_goldens.py does; the script checks its model against tests/goldens/random_yolov9{V}.json first). The
seeded model is saved, float32, as an ultralytics checkpoint in a temporary directory and loaded with `YOLO(path)`, so
`predict` runs on it as on any checkpoint (AutoBackend, fused).

For each case the picture is decoded (and cropped) by yolo-edge itself (`yolo-edge letterbox --decoded --crop`) and
the script asserts those pixels equal the reference loader's (`cv2.imread`) byte for byte; the reference then does
everything else its own way: `model.predict` on the BGR array (LetterBox(auto=True) when the batch shares a shape,
its NMS, `scale_boxes`), at its defaults (imgsz 640, conf 0.25, iou 0.7, max_det 300) and again at conf 0.01 for many
boxes near the threshold. The raw output on the rect input (yolo-edge's rect letterbox pixels, `--fit rect`) is
summarised as in the other goldens (512 samples; 256 for the seeded models). Random weights score nearly every anchor above 0.25, so their lists are
max_det (300) boxes long: to keep those files small the boxes are rows `[x1, y1, x2, y2, confidence, class_id]` (f32
values as their shortest round-trip decimals), and a conf-0.01 list equal to the default one is written as
`{"same_as": "predict_default"}`. Tests: tests/model/parity.rs, `rect_letterbox_*`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import goldens_common as gc  # noqa: E402

OUT = gc.REPO / "tests" / "goldens"

# name, fixture, crop (x, y, w, h) or None: portrait, 4:3, 16:9, square and 3:2, sides not multiples of 32
CASES = [
    ("horses", "horses.jpg", None),
    ("court-16x9", "volleyball-court.jpg", None),
    ("court-portrait", "volleyball-court.jpg", (700, 40, 601, 1000)),
    ("horses-4x3", "horses.jpg", (20, 0, 680, 510)),
    ("horses-square", "horses.jpg", (100, 0, 509, 509)),
]


def yolo_edge_bin() -> str:
    return os.environ.get("YOLO_EDGE_BIN", str(gc.REPO / "target" / "debug" / "yolo-edge"))


def rust_pixels(fixture: Path, crop, extra: list[str]) -> np.ndarray:
    with tempfile.TemporaryDirectory() as td:
        out = Path(td) / "p.npy"
        cmd = [yolo_edge_bin(), "letterbox", str(fixture), "--out", str(out), *extra]
        if crop:
            cmd += ["--crop", ",".join(map(str, crop))]
        subprocess.run(cmd, check=True, capture_output=True, timeout=600)
        return np.load(out)


def decoded_pixels(fixture: Path, crop) -> np.ndarray:
    """yolo-edge's decoded (and cropped) RGB pixels, asserted equal to cv2.imread's (the reference's loader)."""
    import cv2

    rgb = rust_pixels(fixture, crop, ["--decoded"])
    ref = cv2.imread(str(fixture))[:, :, ::-1]
    if crop:
        x, y, w, h = crop
        ref = ref[y : y + h, x : x + w]
    assert np.array_equal(rgb, ref), f"{fixture.name} {crop}: yolo-edge's decode differs from cv2.imread's"
    return rgb


def boxes(r) -> list[dict]:
    b = r.boxes
    return [{"box": gc.f32list(b.xyxy[i].numpy()), "confidence": float(b.conf[i]), "class_id": int(b.cls[i])} for i in range(len(b))]


def f32short(v) -> float:
    """The shortest decimal that reads back as the same float32 (9 significant digits at most)."""
    return float(str(np.float32(v)))


def box_rows(r) -> list[list]:
    """Compact boxes for the seeded goldens (300 a list): [x1, y1, x2, y2, confidence, class_id], f32 values written
    as their shortest round-trip decimals."""
    b = r.boxes
    return [[*(f32short(v) for v in b.xyxy[i].numpy()), f32short(b.conf[i]), int(b.cls[i])] for i in range(len(b))]


def seeded_model(variant: str, tmp: Path):
    """The seeded, BN-calibrated model of tests/goldens/random_yolov9{variant}.json, saved and loaded as a checkpoint."""
    import json

    import torch
    import ultralytics
    from ultralytics import YOLO
    from ultralytics.cfg import DEFAULT_CFG_DICT
    from ultralytics.nn.tasks import DetectionModel

    golden = json.loads((OUT / f"random_yolov9{variant}.json").read_text())
    arrs = []
    for name, want in zip(gc.IMAGES, golden["inputs"]):
        a, _ = gc.rust_letterbox(gc.FIXTURES / name, 640, allow_fallback=False)
        assert gc.sha256(a.tobytes()) == want["pixels_sha256"], f"{name}: letterbox differs from the random golden's input"
        arrs.append(a)
    x = gc.to_input(arrs)
    model = DetectionModel(f"yolov9{variant}.yaml", nc=80, verbose=False)
    assert [[k, list(v.shape)] for k, v in model.state_dict().items()] == golden["state_dict"]
    gc.apply_seeded_weights(model)
    model.float()
    gc.calibrate_bn(model, x)
    with torch.no_grad():
        out = gc.detect_output(model(x)).numpy().ravel()
    got, want = out[golden["sample_idx"]], np.asarray(golden["samples"])
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    assert rel < 1e-5, f"yolov9{variant}: the model differs from random_yolov9{variant}.json (rel {rel:.2e})"
    train_args = {**DEFAULT_CFG_DICT, "model": f"yolov9{variant}.yaml", "imgsz": 640, "task": "detect", "mode": "train"}
    model.args = dict(train_args)
    for p in model.parameters():
        p.requires_grad = False
    path = tmp / f"seeded-yolov9{variant}.pt"
    torch.save({"date": datetime(2025, 1, 1).isoformat(), "version": ultralytics.__version__, "epoch": -1,
                "model": model, "ema": None, "optimizer": None, "train_args": train_args}, path)
    print(f"yolov9{variant}: seeded model matches random_yolov9{variant}.json (rel {rel:.1e})")
    return YOLO(str(path)), model.eval()


def run_cases(yolo, net, pixels, compact: bool = False) -> list[dict]:
    import torch

    cases = []
    for (name, fixture, crop), (rgb, lb) in zip(CASES, pixels):
        bgr = np.ascontiguousarray(rgb[:, :, ::-1])
        default = yolo.predict(bgr, device="cpu", verbose=False)[0]
        low = yolo.predict(bgr, device="cpu", conf=0.01, verbose=False)[0]
        with torch.no_grad():
            raw = gc.detect_output(net(gc.to_input([lb])))
        print(f"  {name}: {rgb.shape[1]}x{rgb.shape[0]} -> input {lb.shape[1]}x{lb.shape[0]}, "
              f"{len(default.boxes)} boxes at 0.25, {len(low.boxes)} at 0.01")
        if compact:
            d, lo = box_rows(default), box_rows(low)
            # at max_det boxes above 0.25 the lower threshold keeps exactly the same list: written once
            dets = {"predict_default": d, "predict_conf_0_01": {"same_as": "predict_default"} if lo == d else lo}
        else:
            dets = {"predict_default": boxes(default), "predict_conf_0_01": boxes(low)}
        cases.append({
            "name": name, "image": fixture, "crop": crop, "width": int(rgb.shape[1]), "height": int(rgb.shape[0]),
            "decoded_sha256": gc.sha256(rgb.tobytes()), "input_shape": [int(lb.shape[0]), int(lb.shape[1])],
            "input_sha256": gc.sha256(lb.tobytes()),
            **dets,
            "raw": gc.output_summary(raw, n_samples=256 if compact else 512),
        })
    assert any(c["predict_conf_0_01"] for c in cases), "no boxes in any case, even at conf 0.01"
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="real,t,c", help="comma list of: real, t, c (and any other yolov9 variant)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    import torch
    from ultralytics import YOLO

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    pixels = [(decoded_pixels(gc.FIXTURES / f, crop), rust_pixels(gc.FIXTURES / f, crop, ["--fit", "rect"]))
              for _, f, crop in CASES]
    how = ("yolo-edge letterbox --decoded (pixels, asserted equal to cv2.imread's byte for byte), then ultralytics "
           "YOLO(ckpt).predict(bgr) at its defaults and at conf=0.01, device=cpu; raw: model.model on yolo-edge's --fit rect pixels")
    # the real checkpoint first: DetectionModel(yaml) flips the class-wide Detect.legacy
    for m in sorted(a.models.split(","), key=lambda m: m != "real"):
        if m == "real":
            print("yolov9t-ball.pt")
            yolo = YOLO(str(gc.FIXTURES / "yolov9t-ball.pt"))
            gc.write_json(OUT / "rect_yolov9t_ball.json", {
                "provenance": gc.provenance(how), "cases": run_cases(yolo, yolo.model.float().eval(), pixels)})
            continue
        with tempfile.TemporaryDirectory() as td:
            yolo, net = seeded_model(m, Path(td))
            cases = run_cases(yolo, net, pixels, compact=True)
        n_default = sum(len(c["predict_default"]) for c in cases)
        n = gc.write_json(OUT / f"rect_random_yolov9{m}.json", {
            "provenance": gc.provenance(
                how + f"; ckpt: the seeded, BN-calibrated yolov9{m} of random_yolov9{m}.json (nc=80), saved float32 as "
                "an ultralytics checkpoint and loaded with YOLO(path)"),
            "variant": f"yolov9{m}",
            "random_golden": f"random_yolov9{m}.json",
            "predict_default_note": (f"{n_default} boxes at the default conf 0.25 over all cases" if n_default else
                                     "no boxes at the default conf 0.25 in any case; predict_conf_0_01 carries the comparison"),
            "boxes_format": "[x1, y1, x2, y2, confidence, class_id] in the picture's pixels, descending confidence; "
                            "{\"same_as\": KEY}: the same list as KEY",
            "cases": cases,
        })
        print(f"rect_random_yolov9{m}.json: {n / 1e3:.0f} KB")


if __name__ == "__main__":
    main()
