#!/usr/bin/env python3
"""yolo-edge `bench` beside PyTorch on one GPU: the table issue 20's Proof asks for.

    python3 scripts/bench_compare.py --ours OUT/bench.json [--eager OUT-eager/bench.json] \
        --torch torch_bench.json [--compile torch_compile.json]

`--ours`: `yolo-edge bench --mode model --dtype f16` (CUDA graphs for every batch, the default);
`--eager`: the same with `--cuda-graphs off`; `--torch`: ../shared/gpu/torch-anchor/bench_torch.py
(MODES=fp16,fp16cl: eager, both layouts); `--compile`: bench_compile.py (torch.compile,
reduce-overhead). Prints one Markdown row per (variant, batch): our p50 / p99 wall time, device
(CUDA-event) p50, img/s, PyTorch eager's best layout, torch.compile where measured, the ratios,
and memory per picture with graphs and eager; then the checks: every batch >= 1.5x eager's best
and >= torch.compile, throughput never lower at a larger batch, batch-1 p99 <= 1.3x p50.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict


def rows_of(path):
    if not path or not os.path.exists(path):
        return {}
    d = json.load(open(path))
    out = {}
    for r in d["rows"]:
        if r.get("status") != "ok" or r.get("mode") != "model":
            continue
        # "yolov9t (random)" -> "t"
        v = r["model"].split()[0].removeprefix("random:").removeprefix("yolov9")
        out[(v, r["batch"])] = r
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True)
    ap.add_argument("--eager")
    ap.add_argument("--torch", required=True)
    ap.add_argument("--compile")
    a = ap.parse_args()
    ours, eager = rows_of(a.ours), rows_of(a.eager)
    torch_best: dict = {}
    for r in json.load(open(a.torch)):
        if r.get("oom"):
            continue
        k = (r["variant"], r["batch"])
        if k not in torch_best or r["ips"] > torch_best[k]["ips"]:
            torch_best[k] = r
    comp = {}
    if a.compile:
        for r in json.load(open(a.compile)):
            comp[(r["variant"], r["batch"])] = r
    print("| variant | batch | p50 ms | p99 ms | device p50 ms | img/s | PyTorch eager best img/s (layout) | x eager | torch.compile img/s | x compile | eager (ours) img/s | MiB/img graphs | MiB/img eager |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    fails = []
    by_variant = defaultdict(list)
    for (v, b), r in sorted(ours.items(), key=lambda kv: ("tsmce".find(kv[0][0]), kv[0][1])):
        t = torch_best.get((v, b))
        c = comp.get((v, b))
        e = eager.get((v, b))
        ips = r["images_per_s"]
        x_eager = ips / t["ips"] if t else None
        x_comp = ips / c["ips"] if c else None
        by_variant[v].append((b, ips))
        f = lambda x, p=1: "" if x is None else f"{x:.{p}f}"
        print(f"| {v} | {b} | {f(r['latency_ms'], 2)} | {f(r.get('p99_ms'), 2)} | {f(r.get('device_p50_ms'), 3)} | {ips:.0f} | "
              f"{f(t and t['ips'], 0)} ({t['mode'] if t else '-'}) | {f(x_eager, 2)} | {f(c and c['ips'], 0)} | {f(x_comp, 2)} | "
              f"{f(e and e['images_per_s'], 0)} | {f(r['peak_mib'] / b, 1)} | {f(e and e['peak_mib'] / b, 1)} |")
        if x_eager is not None and x_eager < 1.5:
            fails.append(f"{v} batch {b}: {x_eager:.2f}x PyTorch eager (< 1.5x)")
        if x_comp is not None and x_comp < 1.0:
            fails.append(f"{v} batch {b}: {x_comp:.2f}x torch.compile (< 1x)")
        if b == 1 and r.get("p99_ms") and r["p99_ms"] > 1.3 * r["latency_ms"]:
            fails.append(f"{v} batch 1: p99 {r['p99_ms']:.2f} ms > 1.3x p50 {r['latency_ms']:.2f} ms")
    for v, pts in by_variant.items():
        pts.sort()
        for (b0, i0), (b1, i1) in zip(pts, pts[1:]):
            if i1 < i0:
                fails.append(f"{v}: {i1:.0f} img/s at batch {b1} < {i0:.0f} at batch {b0}")
    print()
    print("checks: " + ("all hold" if not fails else f"{len(fails)} fail"))
    for m in fails:
        print(f"- {m}")


if __name__ == "__main__":
    main()
