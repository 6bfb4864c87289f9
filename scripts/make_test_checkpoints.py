#!/usr/bin/env python3
"""Generate checkpoint files for the format/loader tests (not committed; CI runs this).

    python scripts/make_test_checkpoints.py [OUTDIR]      # default: target/testdata

Writes into OUTDIR:
  official-gelan-t.pt        WongKinYiu/yolov9 format (yolo9 package = official code; DDetect head), fp16, pickled
                             with the official module paths (models.yolo.DetectionModel, models.common.Conv, ...)
  official-gelan-t.json      its raw output (f32 reference computed from the fp16-rounded weights) on the fixed input
  ultra-yolov9s-f32.pt       ultralytics format, yolov9s (legacy Detect head), nc=3, names a/b/c, float32
  ultra-yolov9s-f32.json     its raw output on the fixed input
  state-dict-t.safetensors   the real fixture's state_dict (fp16 + int64 num_batches_tracked), no metadata
  broken-truncated.pt        first half of official-gelan-t.pt
  broken-no-data-pkl.pt      official-gelan-t.pt re-zipped without its data.pkl
  broken-random.bin          4096 PRNG bytes (name "broken-random")
  broken-empty.pt            empty file
  manifest.json              sizes + sha256 of all of the above

Fixed input (no image decoding involved): x = float32(prng_u("test-input", 1*3*640*640)).reshape(1, 3, 640, 640),
prng_u as in scripts/README.md. Weights: the seeded-random rule of the goldens (all entries but running stats and
dfl.conv.weight), BN running stats calibrated on x (so running_var > 0 and scores are not all ~0 as they would be
with the models' own bias_init).
"""

from __future__ import annotations

import copy
import io
import os
import sys
import time
import zipfile
from datetime import datetime
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import goldens_common as gc  # noqa: E402


def fixed_input():
    import torch

    return torch.from_numpy(gc.prng_u("test-input", 3 * 640 * 640).astype(np.float32).reshape(1, 3, 640, 640))


def state_dict_listing(model):
    return [[k, list(v.shape), str(v.dtype).replace("torch.", "")] for k, v in model.state_dict().items()]


def official_gelan_t(out: Path, x) -> dict:
    import torch
    import yolo9
    import yolo9.models
    import yolo9.models.common
    import yolo9.models.experimental
    import yolo9.models.yolo as Y

    Y.DetectionModel.info = lambda self, *a, **k: None  # skip the thop FLOPs profile (slow, print only)
    cfg = Path(yolo9.__file__).parent / "models" / "detect" / "gelan-t.yaml"
    torch.manual_seed(0)
    model = Y.DetectionModel(str(cfg), ch=3, nc=80)
    gc.apply_seeded_weights(model)
    gc.calibrate_bn(model, x)
    model.half()  # as saved: fp16; the reference is computed from exactly these (fp16-rounded) values in f32
    ref = copy.deepcopy(model).float().eval()
    with torch.no_grad():
        y = gc.detect_output(ref(x))

    # Pickle with the official repository's module paths (models.yolo / models.common / models.experimental).
    aliases = {"models": yolo9.models, "models.yolo": Y, "models.common": yolo9.models.common,
               "models.experimental": yolo9.models.experimental}
    patched = []
    for alias, mod in aliases.items():
        sys.modules.setdefault(alias, mod)
        for v in list(vars(mod).values()):
            if isinstance(v, type) and v.__module__ == mod.__name__:
                patched.append((v, v.__module__))
                v.__module__ = alias
    try:
        for p in model.parameters():
            p.requires_grad = False
        ckpt = {  # train.py's ckpt after utils.general.strip_optimizer (the released-weights layout)
            "epoch": -1,
            "best_fitness": None,
            "model": model,
            "ema": None,
            "updates": None,
            "optimizer": None,
            "opt": {"weights": "", "cfg": "models/detect/gelan-t.yaml", "data": "data/coco.yaml", "imgsz": 640,
                    "hyp": "hyp.scratch-high.yaml", "epochs": 500, "batch_size": 16},
            "git": {"remote": "https://github.com/WongKinYiu/yolov9", "branch": "main", "commit": None},
            "date": datetime(2024, 2, 21).isoformat(),
        }
        torch.save(ckpt, out / "official-gelan-t.pt")
    finally:
        for cls, m in patched:
            cls.__module__ = m
    head = model.model[-1]
    g = gc.provenance(
        "yolo9 (official WongKinYiu/yolov9 code) models.yolo.DetectionModel('models/detect/gelan-t.yaml', nc=80) "
        "; weights from the seeded PRNG rule; BN running stats calibrated "
        "(forward pre-hooks, biased var) on x; model.half(); saved like strip_optimizer() with official module paths; "
        "out = model.float()(x)[0] from the fp16-rounded weights; x = prng_u('test-input', 3*640*640) as (1,3,640,640)")
    g.update({
        "checkpoint": "official-gelan-t.pt",
        "checkpoint_sha256": gc.sha256((out / "official-gelan-t.pt").read_bytes()),
        "format": "official WongKinYiu/yolov9 (pickled DetectionModel under 'model', fp16)",
        "head": {"class": type(head).__name__, "reg_max": head.reg_max, "stride": head.stride.tolist(),
                 "cv2_groups": [head.cv2[0][1].conv.groups, head.cv2[0][2].groups]},
        "input": {"name": "test-input", "shape": [1, 3, 640, 640], "rule": "float32(prng_u)"},
        "state_dict": state_dict_listing(model),
        **gc.output_summary(y),
    })
    gc.write_json(out / "official-gelan-t.json", g)
    return {"head": type(head).__name__, "out": list(y.shape)}


def ultra_yolov9s(out: Path, x) -> dict:
    import torch
    import ultralytics
    from ultralytics.cfg import DEFAULT_CFG_DICT
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    model = DetectionModel("yolov9s.yaml", nc=3, verbose=False)
    head = model.model[-1]
    assert head.legacy and type(head.cv3[0][0]).__name__ == "Conv"
    gc.apply_seeded_weights(model)
    gc.calibrate_bn(model, x)
    with torch.no_grad():
        y = gc.detect_output(model(x))
    names = {0: "a", 1: "b", 2: "c"}
    train_args = {**DEFAULT_CFG_DICT, "model": "yolov9s.yaml", "data": "abc.yaml", "imgsz": 640, "task": "detect",
                  "mode": "train"}
    model.names = names
    model.args = dict(train_args)
    for p in model.parameters():
        p.requires_grad = False
    ckpt = {  # ultralytics.utils.torch_utils.strip_optimizer() layout, but the model kept in float32
        "date": datetime(2025, 1, 1).isoformat(),
        "version": ultralytics.__version__,
        "license": "AGPL-3.0 License (https://ultralytics.com/license)",
        "docs": "https://docs.ultralytics.com",
        "epoch": -1,
        "best_fitness": None,
        "stopper": None,
        "model": model,
        "ema": None,
        "updates": None,
        "optimizer": None,
        "scaler": None,
        "train_args": train_args,
        "train_metrics": {},
        "train_results": {},
    }
    torch.save(ckpt, out / "ultra-yolov9s-f32.pt")
    g = gc.provenance(
        "ultralytics DetectionModel('yolov9s.yaml', nc=3) with weights from the "
        "seeded PRNG rule; BN running stats calibrated on x; float32; names {0:'a',1:'b',2:'c'}; saved as a dict "
        "like strip_optimizer() (model=DetectionModel f32, ema=None, train_args with imgsz=640); "
        "out = model(x)[0]; x = prng_u('test-input', 3*640*640) as (1,3,640,640)")
    g.update({
        "checkpoint": "ultra-yolov9s-f32.pt",
        "checkpoint_sha256": gc.sha256((out / "ultra-yolov9s-f32.pt").read_bytes()),
        "format": "ultralytics (pickled DetectionModel under 'model', float32)",
        "names": {str(k): v for k, v in names.items()},
        "head": {"class": "Detect", "legacy": True, "reg_max": head.reg_max, "stride": head.stride.tolist()},
        "input": {"name": "test-input", "shape": [1, 3, 640, 640], "rule": "float32(prng_u)"},
        "state_dict": state_dict_listing(model),
        **gc.output_summary(y),
    })
    gc.write_json(out / "ultra-yolov9s-f32.json", g)
    return {"head": "Detect(legacy)", "out": list(y.shape)}


def safetensors_t(out: Path) -> dict:
    import torch
    from safetensors.torch import save_file

    ck = torch.load(gc.FIXTURES / "yolov9t-ball.pt", map_location="cpu", weights_only=False)
    sd = {k: v.contiguous() for k, v in ck["model"].state_dict().items()}
    save_file(sd, str(out / "state-dict-t.safetensors"))
    return {"tensors": len(sd), "dtypes": sorted({str(v.dtype) for v in sd.values()})}


def broken(out: Path) -> None:
    good = (out / "official-gelan-t.pt").read_bytes()
    (out / "broken-truncated.pt").write_bytes(good[: len(good) // 2])
    buf = io.BytesIO()
    with zipfile.ZipFile(out / "official-gelan-t.pt") as zin, zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            if not info.filename.endswith("/data.pkl"):
                zout.writestr(info, zin.read(info.filename))
    (out / "broken-no-data-pkl.pt").write_bytes(buf.getvalue())
    (out / "broken-random.bin").write_bytes(np.floor(gc.prng_u("broken-random", 4096) * 256).astype(np.uint8).tobytes())
    (out / "broken-empty.pt").write_bytes(b"")


def main():
    import torch

    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else gc.REPO / "target" / "testdata"
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    x = fixed_input()
    info = {}
    info["official-gelan-t"] = official_gelan_t(out, x)
    info["ultra-yolov9s-f32"] = ultra_yolov9s(out, x)
    info["state-dict-t"] = safetensors_t(out)
    broken(out)
    files = sorted(p for p in out.iterdir() if p.is_file() and p.name != "manifest.json")
    manifest = {p.name: {"bytes": p.stat().st_size, "sha256": gc.sha256(p.read_bytes())} for p in files}
    gc.write_json(out / "manifest.json", {"files": manifest, "info": info})
    print(f"wrote {len(files)} files to {out} in {time.time() - t0:.1f}s")
    for p in files:
        print(f"  {p.name:28s} {p.stat().st_size:>10d} B")
    for k, v in info.items():
        print(f"  {k}: {v}")


if __name__ == "__main__":
    main()
