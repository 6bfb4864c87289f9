"""CPU reference for BENCHMARKS.md: ultralytics YOLOv9 (fused, eval, inference_mode) model-only
images/s at 640, median of N timed runs after warm-up. Same machine, same run as
`yolo-edge bench --device cpu` (see scripts/bench_cpu.sh).

    python scripts/bench_cpu_reference.py --variants t,s --batches 1,4 --iters 10
"""
import argparse, json, statistics, time

import torch
from ultralytics.nn.tasks import DetectionModel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="t,s")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rows = []
    for v in a.variants.split(","):
        m = DetectionModel(f"yolov9{v}.yaml", nc=80, verbose=False).eval().fuse(verbose=False)
        for b in map(int, a.batches.split(",")):
            x = torch.rand(b, 3, 640, 640)
            with torch.inference_mode():
                for _ in range(2):
                    m(x)
                ts = []
                for _ in range(a.iters):
                    t = time.perf_counter()
                    m(x)
                    ts.append(time.perf_counter() - t)
            med = statistics.median(ts)
            rows.append({"variant": v, "batch": b, "ms": med * 1e3, "img_s": b / med, "threads": a.threads, "torch": torch.__version__})
            print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
