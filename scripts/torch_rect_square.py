#!/usr/bin/env python3
"""PyTorch (ultralytics' YOLOv9, FP16) at several input shapes and batch sizes: what the rect letterbox of a 16:9
frame (640x384) buys the reference over the square one (640x640), model only, beside `yolo-edge bench --input`.

    VARIANTS=t,c SHAPES=640x640,640x384 BATCHES=1,8,64 MODES=fp16,fp16cl,compile OUT=dir python3 scripts/torch_rect_square.py

Modes: fp16 (eager, contiguous), fp16cl (eager, channels-last), compile (torch.compile mode="reduce-overhead", i.e.
inductor with CUDA graphs, channels-last; one compile per shape and batch). Each row: the median of ITERS timed passes
(CUDA events around one pass, after 5 untimed), ms and img/s, written as JSON lines to stdout and as a list to
OUT/torch_rect_square.json. Seeded random weights (the model's own init, fused), input torch.rand: the timing does
not depend on the values. Needs torch with CUDA and ultralytics 8.4.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

sys.modules.setdefault("polars", None)
sys.modules.setdefault("ultralytics_platform", None)

import torch  # noqa: E402
from ultralytics.nn.tasks import DetectionModel  # noqa: E402


def shapes() -> list[tuple[int, int]]:
    """WxH strings to (h, w)."""
    out = []
    for s in os.environ.get("SHAPES", "640x640,640x384").split(","):
        w, h = (int(v) for v in s.split("x"))
        out.append((h, w))
    return out


def main() -> None:
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    iters = int(os.environ.get("ITERS", "300"))
    batches = [int(b) for b in os.environ.get("BATCHES", "1,8,64").split(",")]
    res = []
    print(torch.__version__, torch.cuda.get_device_name(0), flush=True)
    for v in os.environ.get("VARIANTS", "t,c").split(","):
        torch.manual_seed(0)
        base = DetectionModel(f"yolov9{v}.yaml", nc=80, verbose=False).eval().fuse(verbose=False).to(dev).half()
        for mode in os.environ.get("MODES", "fp16,fp16cl,compile").split(","):
            cl = mode != "fp16"
            m = base.to(memory_format=torch.channels_last) if cl else base.to(memory_format=torch.contiguous_format)
            for h, w in shapes():
                for b in batches:
                    if mode == "compile":
                        torch._dynamo.reset()
                        run = torch.compile(m, mode="reduce-overhead")
                    else:
                        run = m
                    x = torch.rand(b, 3, h, w, device=dev, dtype=torch.half)
                    if cl:
                        x = x.contiguous(memory_format=torch.channels_last)
                    t0 = time.time()
                    with torch.inference_mode():
                        for _ in range(5):
                            run(x)
                        torch.cuda.synchronize()
                        warm = time.time() - t0
                        ts = []
                        for _ in range(max(5, min(iters, 4096 // b))):
                            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                            s.record()
                            run(x)
                            e.record()
                            e.synchronize()
                            ts.append(s.elapsed_time(e))
                    med = statistics.median(ts)
                    r = dict(variant=v, mode=mode, input=f"{w}x{h}", batch=b, ms=round(med, 4),
                             ips=round(b * 1000 / med, 1),
                             p99_ms=round(sorted(ts)[int(0.99 * (len(ts) - 1))], 4), warmup_s=round(warm, 1))
                    res.append(r)
                    print(json.dumps(r), flush=True)
                    del x, run
    json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "torch_rect_square.json"), "w"))


if __name__ == "__main__":
    main()
