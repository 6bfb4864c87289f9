#!/usr/bin/env python3
"""The reference's detection step on a raw output: ultralytics `non_max_suppression` at predict's
defaults (conf 0.25, IoU 0.7, max_det 300), on the CPU with 2 threads, median of 200 runs.

    cargo run --release --example nms_cost -- random:yolov9c PICTURE 0.25 /tmp/raw.npy
    ~/.cache/yolo-edge/ref-venv/bin/python scripts/nms_reference.py /tmp/raw.npy [--conf 0.25] [--rounds 3]

(CI's reference venv has ultralytics and torch.) Prints one line per round.
"""
import argparse
import statistics
import time

import numpy as np
import torch
from ultralytics.utils.nms import non_max_suppression


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw")
    ap.add_argument("--conf", type=float, default=0.25)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(2)
    raw = torch.from_numpy(np.load(a.raw))
    candidates = int((raw[0, 4:].amax(0) > a.conf).sum())
    for _ in range(a.rounds):
        times = []
        for _ in range(200):
            start = time.perf_counter()
            out = non_max_suppression(raw, conf_thres=a.conf, iou_thres=0.7, max_det=300)
            times.append((time.perf_counter() - start) * 1e3)
        print(f"{candidates} candidates at conf {a.conf}, {out[0].shape[0]} kept: {statistics.median(times):.3f} ms (median of 200)")


if __name__ == "__main__":
    main()
