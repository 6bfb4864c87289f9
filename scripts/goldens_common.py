"""Shared helpers for scripts/make_goldens.py and scripts/make_test_checkpoints.py.

Everything here is mirrored by the Rust tests, so keep it exactly in sync with the spec in
scripts/README.md (PRNG, value rules, BN calibration).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(os.environ.get("YOLO_EDGE_FIXTURES", REPO.parent / "shared" / "fixtures"))
IMAGES = ["horses.jpg", "volleyball-court.jpg"]

FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
M1 = np.uint64(0xBF58476D1CE4E5B9)
M2 = np.uint64(0x94D049BB133111EB)


def fnv1a64(data: bytes) -> np.uint64:
    h = int(FNV_OFFSET)
    for b in data:
        h ^= b
        h = (h * int(FNV_PRIME)) & 0xFFFFFFFFFFFFFFFF
    return np.uint64(h)


def prng_u(name: str, n: int) -> np.ndarray:
    """n uniform float64 in [0,1): splitmix64 finaliser of h + (i+1)*golden, top 24 bits."""
    h = fnv1a64(name.encode())
    with np.errstate(over="ignore"):
        i = np.arange(1, n + 1, dtype=np.uint64)
        z = h + i * GOLDEN
        z = (z ^ (z >> np.uint64(30))) * M1
        z = (z ^ (z >> np.uint64(27))) * M2
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(40)).astype(np.float64) / float(1 << 24)


def seeded_value(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 value of a state-dict entry under the seeded-random-weights rule."""
    n = int(np.prod(shape)) if len(shape) else 1
    u = prng_u(name, n)
    if name.endswith(".bn.weight"):
        v = 0.5 + u
    elif name.endswith(".bn.bias"):
        v = (2.0 * u - 1.0) * 0.5
    elif name.endswith(".weight") and len(shape) == 4:
        fan_in = shape[1] * shape[2] * shape[3]
        v = (2.0 * u - 1.0) * np.sqrt(3.0 / fan_in)
    elif name.endswith(".bias") and len(shape) == 1:
        v = (2.0 * u - 1.0) * 0.5
    else:
        raise ValueError(f"no seeded-value rule for {name} {shape}")
    return v.astype(np.float32).reshape(shape)


SKIP_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked", "dfl.conv.weight")


def apply_seeded_weights(model) -> None:
    import torch

    sd = model.state_dict()
    with torch.no_grad():
        for name, t in sd.items():
            if name.endswith(SKIP_SUFFIXES):
                continue
            t.copy_(torch.from_numpy(seeded_value(name, tuple(t.shape))))


def calibrate_bn(model, x) -> None:
    """Eval mode; every BatchNorm2d takes running stats from its own input (biased var) just before it runs."""
    import torch

    model.eval()

    def hook(m, inp):
        xi = inp[0]
        m.running_mean.copy_(xi.mean((0, 2, 3)))
        m.running_var.copy_(xi.var((0, 2, 3), unbiased=False))

    hs = [m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hs:
            h.remove()
    model.eval()


def detect_output(y):
    """(B, 4+nc, A) decoded tensor from a Detect/DDetect eval forward (ultralytics 8.4 returns (y, preds))."""
    return y[0] if isinstance(y, (tuple, list)) else y


# ----------------------------------------------------------------------------------------------------------------------
# Letterbox: the exact pixels the Rust side produces.


def _warn(msg: str) -> None:
    print(f"[letterbox] {msg}", file=sys.stderr)


def rust_letterbox(path: Path, imgsz: int = 640, allow_fallback: bool = True) -> tuple[np.ndarray, str]:
    """Letterboxed uint8 HxWx3 RGB exactly as `yolo-edge letterbox IMAGE --imgsz N --out F.npy` makes it.

    Uses $YOLO_EDGE_BIN if set, else `cargo run --release -q -- letterbox` in $YOLO_EDGE_REPO (default: this repo).
    Falls back (development only, loudly) to cv2.imread + ultralytics LetterBox(auto=False).
    Returns (pixels, source description).
    """
    with tempfile.TemporaryDirectory() as td:
        out = Path(td) / "lb.npy"
        args = ["letterbox", str(path), "--imgsz", str(imgsz), "--out", str(out)]
        if os.environ.get("YOLO_EDGE_BIN"):
            cmd, cwd = [os.environ["YOLO_EDGE_BIN"], *args], None
        else:
            cmd, cwd = ["cargo", "run", "--release", "-q", "--", *args], os.environ.get("YOLO_EDGE_REPO", str(REPO))
        try:
            subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, timeout=1800)
            arr = np.load(out)
            assert arr.dtype == np.uint8 and arr.shape == (imgsz, imgsz, 3), (arr.dtype, arr.shape)
            ref = reference_letterbox(path, imgsz)
            assert np.array_equal(arr, ref), (f"{path.name}: the Rust letterbox differs from cv2.imread + LetterBox in "
                                              f"{int((arr != ref).sum())} bytes")
            return arr, ("rust: " + " ".join(shlex.quote(c) for c in cmd[: len(cmd) - len(args)]) + " letterbox "
                         "(asserted equal to cv2.imread + LetterBox(auto=False) byte for byte)")
        except Exception as e:  # noqa: BLE001
            if not allow_fallback:
                raise
            _warn(f"Rust letterbox unavailable ({type(e).__name__}: {str(e)[:200]}); "
                            "FALLING BACK to cv2 decode + LetterBox: goldens are NOT valid for the Rust tests")
    return reference_letterbox(path, imgsz), "cv2-fallback (DEV ONLY)"


def reference_letterbox(path: Path, imgsz: int = 640) -> np.ndarray:
    """The reference's square input, RGB: cv2.imread (ultralytics' loader) + LetterBox((imgsz, imgsz), auto=False)."""
    import cv2
    from ultralytics.data.augment import LetterBox

    bgr = cv2.imread(str(path))
    return np.ascontiguousarray(LetterBox((imgsz, imgsz), auto=False)(image=bgr)[:, :, ::-1])


def to_input(arrs: list[np.ndarray]):
    import torch

    return torch.stack([torch.from_numpy(a).permute(2, 0, 1).float() / 255 for a in arrs])


# ----------------------------------------------------------------------------------------------------------------------
# Output summaries and JSON


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def f32list(a) -> list[float]:
    """float32 values as the exact float64 of each f32 (round-trips bit-exactly through f64 -> f32)."""
    return [float(v) for v in np.asarray(a, dtype=np.float32).ravel()]


def output_summary(out, n_samples: int = 4096) -> dict:
    o = out.detach().float().cpu().numpy()
    idx = np.sort(np.random.default_rng(0).choice(o.size, n_samples, replace=False))
    return {
        "output_shape": list(o.shape),
        "sample_idx": [int(i) for i in idx],
        "samples": f32list(o.ravel()[idx]),
        "row_sums": o.astype(np.float64).sum(-1).tolist(),
    }


def provenance(how: str) -> dict:
    import cv2
    import torch
    import ultralytics

    return {
        "command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv]),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "ultralytics": ultralytics.__version__,
            "numpy": np.__version__,
            "opencv": cv2.__version__,
        },
        "how": how,
    }


def write_json(path: Path, obj: dict) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    s = json.dumps(obj, separators=(",", ":"))
    path.write_text(s + "\n")
    return len(s)
