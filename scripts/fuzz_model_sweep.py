#!/usr/bin/env python3
"""Every single edit of one kind to every tensor of a variant, through the `model` fuzz target.

The `model` target (fuzz/fuzz_targets/model.rs) reads a variant byte, a flags byte and edits of
five bytes (operation, tensor index as two little-endian bytes over the names in order, two
arguments). Random mutation reaches a given tensor with a given edit rarely (yolov9t has 1,118
tensors); this writes the input for each (tensor, edit) pair of the table below, plus the class
and box counts set to a few values, and replays them all through the target's binary, which
fails on a panic or on a model that loads and then cannot run. An input that fails is reported
and the rest go on.

    scripts/fuzz_model_sweep.py OUT [--variant t|s|c] [--edits 0,5,9] [--timeout S] [--bin BINARY]

--edits picks rows of EDITS below by position (all by default: c's builds are about 15x t's, so
its whole sweep takes hours). --timeout is libFuzzer's per-input limit in seconds (10; a box
busy with builds needs more).

OUT/inputs/ holds the inputs, OUT/failed/ a copy of each failing one, OUT/summary.md the
counts and each failure's first lines. Exit status 1 when any input failed.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VARIANT_BYTE = {"t": 0, "s": 5, "c": 7}
# (operation, x, y) of model.rs's `Edits::apply`
EDITS = [
    (0, 0, 0),  # removed
    (1, 0, 0),  # first dimension 0
    (1, 0, 1),  # first dimension 1
    (1, 1, 1),  # second dimension 1 (a conv weight then looks depthwise)
    (1, 1, 2),  # second dimension 2
    (2, 0, 0),  # a scalar
    (2, 1, 0),  # rank 1, the first dimension kept
    (2, 5, 3),  # rank 5, a dimension of 3 added
    (3, 4, 0),  # stored as i64
    (5, 0, 0),  # every value NaN
]
CLASS_COUNTS = [0, 1, 2, 79, 81, 255]
BOX_OUTPUTS = [0, 1, 3, 4, 8, 60, 68, 255]


def tensor_names(variant):
    with open(os.path.join(ROOT, "src", "assets", "manifests", f"yolov9{variant}.json")) as f:
        tensors = json.load(f)["tensors"]
    return sorted(dict(tensors) if isinstance(tensors, list) else tensors)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--variant", default="t", choices=sorted(VARIANT_BYTE))
    ap.add_argument("--edits", help="comma-separated positions in EDITS (default: all)")
    ap.add_argument("--timeout", type=int, default=10, help="seconds an input may take")
    ap.add_argument("--bin", default=os.path.join(ROOT, "fuzz/target/x86_64-unknown-linux-gnu/release/model"))
    a = ap.parse_args()
    names = tensor_names(a.variant)
    edits = EDITS
    if a.edits:
        try:
            edits = [EDITS[int(k)] for k in a.edits.split(",")]
        except (ValueError, IndexError):
            ap.error(f"--edits: positions 0 to {len(EDITS) - 1}, comma-separated")
    inputs = os.path.join(a.out, "inputs")
    failed_dir = os.path.join(a.out, "failed")
    shutil.rmtree(inputs, ignore_errors=True)
    os.makedirs(inputs)
    os.makedirs(failed_dir, exist_ok=True)
    head = bytes([VARIANT_BYTE[a.variant], 0])
    labels = {}
    files = []

    def add(edit, label):
        name = f"{len(files):05d}"
        with open(os.path.join(inputs, name), "wb") as f:
            f.write(head + edit)
        labels[name] = label
        files.append(name)

    for i, tensor in enumerate(names):
        for op, x, y in edits:
            add(bytes([op, i & 255, i >> 8, x, y]), f"{tensor}: op {op} x {x} y {y}")
    for n in CLASS_COUNTS:
        add(bytes([6, 0, 0, n, 0]), f"class count {n}")
    for n in BOX_OUTPUTS:
        add(bytes([7, 0, 0, n, 0]), f"box outputs {n}")

    failures = []
    i = 0
    while i < len(files):
        chunk = files[i : i + 400]
        p = subprocess.run(
            [a.bin, "-rss_limit_mb=2048", "-malloc_limit_mb=2048", f"-timeout={a.timeout}", f"-artifact_prefix={failed_dir}/"]
            + [os.path.join(inputs, f) for f in chunk],
            capture_output=True,
            text=True,
        )
        if p.returncode == 0:
            i += len(chunk)
            continue
        ran = re.findall(r"^Running: .*/(\d+)$", p.stderr, re.M)
        if not ran:
            sys.exit(f"{a.bin} failed before running an input:\n{p.stderr[-2000:]}")
        bad = ran[-1]
        why = [line for line in p.stderr.splitlines() if "panicked" in line or "ERROR:" in line]
        why += [line for line in p.stderr.splitlines() if line.startswith("a model that loaded") or "index out of" in line]
        failures.append((bad, labels[bad], why[:3]))
        print(f"failed: {bad} ({labels[bad]}): {' | '.join(why[:3])}", flush=True)
        shutil.copy(os.path.join(inputs, bad), os.path.join(failed_dir, f"input-{bad}"))
        i = files.index(bad) + 1

    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(f"yolov9{a.variant}: {len(names)} tensors x {len(edits)} edits + {len(CLASS_COUNTS) + len(BOX_OUTPUTS)} head counts = {len(files)} inputs, {len(failures)} failed\n")
        for bad, label, why in failures:
            f.write(f"- {bad}: {label}: {' | '.join(why)}\n")
    print(f"{len(files)} inputs, {len(failures)} failed (summary: {a.out}/summary.md)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
