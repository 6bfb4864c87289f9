#!/usr/bin/env python3
"""Synthetic shapes detection dataset for yolo-edge's default model (YOLO txt labels).

Five classes (circle, square, triangle, star, ring) rendered with varied size, colour,
rotation, shading, occlusion, blur, noise and lighting onto procedural backgrounds (gradients,
value-noise textures, stripes, checkerboards, clutter); nothing is downloaded. Every picture is
a pure function of (seed, split, index), so the output does not depend on the number of worker
processes. numpy + OpenCV only.

Usage:
    python3 scripts/make_shapes_dataset.py --out data/shapes --seed 0 \
        --train 2000 --val 300 --test 300 [--workers N]

Layout written (ultralytics / yolo-edge eval format):
    OUT/data.yaml
    OUT/images/{train,val,test}/NNNNNN.jpg
    OUT/labels/{train,val,test}/NNNNNN.txt   # "class cx cy w h", normalised to [0, 1]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from multiprocessing import Pool
from pathlib import Path

import cv2
import numpy as np

CLASSES = ["circle", "square", "triangle", "star", "ring"]
SPLITS = {"train": 0, "val": 1, "test": 2}
MIN_SIDE, MAX_SIDE = 320, 640
# A label is kept only if this fraction of the shape stays visible after occlusion.
MIN_VISIBLE = 0.55
SS = 4  # sub-pixel bits of cv2.fillPoly / circle coordinates (shift)


# ----------------------------------------------------------------------------- backgrounds


def _rand_colour(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(0, 255, 3)


def _value_noise(rng: np.random.Generator, h: int, w: int, cells: int) -> np.ndarray:
    """Smooth noise in [0, 1]: a random coarse grid upsampled with bicubic interpolation."""
    g = rng.random((cells + 1, max(2, int(cells * w / h) + 1))).astype(np.float32)
    return np.clip(cv2.resize(g, (w, h), interpolation=cv2.INTER_CUBIC), 0, 1)


def background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    kind = rng.integers(0, 5)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    c1, c2 = _rand_colour(rng), _rand_colour(rng)
    if kind == 0:  # linear gradient at a random angle
        a = rng.uniform(0, 2 * math.pi)
        t = xx * math.cos(a) + yy * math.sin(a)
        t = (t - t.min()) / (np.ptp(t) + 1e-6)
    elif kind == 1:  # radial gradient
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        t = np.sqrt((xx - cx) ** 2 + (yy - cy) ** 2)
        t = t / (t.max() + 1e-6)
    elif kind == 2:  # multi-octave value noise
        t = sum(_value_noise(rng, h, w, c) * wgt for c, wgt in ((3, 0.5), (9, 0.3), (27, 0.2)))
    elif kind == 3:  # stripes (soft or hard) at a random angle
        a = rng.uniform(0, math.pi)
        period = rng.uniform(8, 60)
        s = np.sin((xx * math.cos(a) + yy * math.sin(a)) * 2 * math.pi / period)
        t = (s > 0).astype(np.float32) if rng.random() < 0.5 else (s + 1) / 2
    else:  # checkerboard, possibly rotated
        a = rng.uniform(0, math.pi)
        cell = rng.uniform(10, 50)
        u = xx * math.cos(a) + yy * math.sin(a)
        v = -xx * math.sin(a) + yy * math.cos(a)
        t = ((np.floor(u / cell) + np.floor(v / cell)) % 2).astype(np.float32)
    img = c1[None, None, :] * (1 - t[..., None]) + c2[None, None, :] * t[..., None]
    # fine texture on top of everything
    img += rng.normal(0, rng.uniform(0, 10), (h, w, 1)) * _value_noise(rng, h, w, 40)[..., None]
    # clutter that is not an object: lines and curved strokes
    for _ in range(rng.integers(0, 6)):
        col = tuple(float(v) for v in _rand_colour(rng))
        p1 = (int(rng.integers(0, w)), int(rng.integers(0, h)))
        if rng.random() < 0.5:
            p2 = (int(rng.integers(0, w)), int(rng.integers(0, h)))
            cv2.line(img, p1, p2, col, int(rng.integers(1, 4)), cv2.LINE_AA)
        else:
            axes = (int(rng.integers(20, 200)), int(rng.integers(20, 200)))
            a0 = float(rng.uniform(0, 360))
            cv2.ellipse(img, p1, axes, float(rng.uniform(0, 180)), a0, a0 + float(rng.uniform(30, 120)), col, int(rng.integers(1, 3)), cv2.LINE_AA)
    return img


# ----------------------------------------------------------------------------- shapes


def _poly(points: np.ndarray, cx: float, cy: float, angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    rot = points @ np.array([[c, s], [-s, c]], dtype=np.float64)
    return rot + np.array([cx, cy])


def shape_mask(rng: np.random.Generator, cls: int, h: int, w: int, cx: float, cy: float, r: float) -> np.ndarray:
    """Anti-aliased coverage mask (float32 in [0, 1]) of one shape of radius ~r centred at (cx, cy)."""
    m = np.zeros((h, w), np.uint8)
    fix = lambda p: np.round(p * (1 << SS)).astype(np.int32)  # noqa: E731
    angle = rng.uniform(0, 2 * math.pi)
    name = CLASSES[cls]
    if name == "circle":
        cv2.circle(m, (int(round(cx * (1 << SS))), int(round(cy * (1 << SS)))), int(round(r * (1 << SS))), 255, -1, cv2.LINE_AA, SS)
    elif name == "square":
        half = r / math.sqrt(2)
        pts = np.array([[-half, -half], [half, -half], [half, half], [-half, half]])
        cv2.fillPoly(m, [fix(_poly(pts, cx, cy, angle))], 255, cv2.LINE_AA, SS)
    elif name == "triangle":
        # roughly equilateral, vertices jittered so the class covers a family of triangles
        ang = [k * 2 * math.pi / 3 + rng.uniform(-0.15, 0.15) for k in range(3)]
        pts = np.array([[r * math.cos(a), r * math.sin(a)] for a in ang])
        cv2.fillPoly(m, [fix(_poly(pts, cx, cy, angle))], 255, cv2.LINE_AA, SS)
    elif name == "star":
        inner = rng.uniform(0.38, 0.5)
        pts = np.array(
            [[(r if k % 2 == 0 else r * inner) * math.cos(k * math.pi / 5), (r if k % 2 == 0 else r * inner) * math.sin(k * math.pi / 5)] for k in range(10)]
        )
        cv2.fillPoly(m, [fix(_poly(pts, cx, cy, angle))], 255, cv2.LINE_AA, SS)
    else:  # ring
        c = (int(round(cx * (1 << SS))), int(round(cy * (1 << SS))))
        cv2.circle(m, c, int(round(r * (1 << SS))), 255, -1, cv2.LINE_AA, SS)
        cv2.circle(m, c, int(round(r * rng.uniform(0.45, 0.7) * (1 << SS))), 0, -1, cv2.LINE_AA, SS)
    return m.astype(np.float32) / 255.0


def fill_layer(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """What an object is painted with: flat colour, a gradient (shading) or a texture."""
    c1 = _rand_colour(rng)
    kind = rng.random()
    if kind < 0.5:
        return np.broadcast_to(c1, (h, w, 3)).astype(np.float32)
    c2 = np.clip(c1 + rng.normal(0, 60, 3), 0, 255)
    if kind < 0.85:
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        a = rng.uniform(0, 2 * math.pi)
        t = xx * math.cos(a) + yy * math.sin(a)
        t = (t - t.min()) / (np.ptp(t) + 1e-6)
    else:
        t = _value_noise(rng, h, w, 12)
    return (c1[None, None, :] * (1 - t[..., None]) + c2[None, None, :] * t[..., None]).astype(np.float32)


def _bbox(mask: np.ndarray, thr: float = 0.5):
    ys, xs = np.nonzero(mask >= thr)
    if len(xs) == 0:
        return None
    return float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)


def render(seed: int, split: str, index: int):
    """One picture (BGR uint8) and its labels [(cls, x1, y1, x2, y2)] in pixels."""
    rng = np.random.default_rng([seed, SPLITS[split], index])
    w, h = int(rng.integers(MIN_SIDE, MAX_SIDE + 1)), int(rng.integers(MIN_SIDE, MAX_SIDE + 1))
    img = background(rng, h, w)
    n = int(rng.integers(1, 9))
    objs = []  # (cls, full coverage mask, visible coverage)
    boxes = []
    for _ in range(n):
        cls = int(rng.integers(0, len(CLASSES)))
        for _attempt in range(20):
            r = rng.uniform(10, min(h, w) * 0.22)
            cx, cy = rng.uniform(r * 0.6, w - r * 0.6), rng.uniform(r * 0.6, h - r * 0.6)  # may leave the frame a little
            b = (cx - r, cy - r, cx + r, cy + r)
            if any(_iou(b, o) >= 0.35 for o in boxes):
                continue
            m = shape_mask(rng, cls, h, w, cx, cy, r)
            alpha = m * rng.uniform(0.8, 1.0)
            # occlusion is allowed, but every object drawn keeps enough of itself to be labelled
            if m.sum() >= 30 and all(_visible_after(o, alpha) for o in objs):
                break
        else:
            continue
        boxes.append(b)
        layer = fill_layer(rng, h, w)
        # keep objects distinguishable from what lies under them: push colours away from the local mean
        under = (img * m[..., None]).sum((0, 1)) / (m.sum() + 1e-6)
        mean = (layer * m[..., None]).sum((0, 1)) / (m.sum() + 1e-6)
        d = mean - under
        dn = float(np.linalg.norm(d))
        if dn < 60:
            shift = d / dn * (60 - dn) if dn > 1 else rng.choice([-1.0, 1.0]) * np.full(3, 40.0)
            layer = np.clip(layer + shift, 0, 255)
        if rng.random() < 0.3:  # dark or light outline
            edge = cv2.morphologyEx((m > 0.5).astype(np.uint8), cv2.MORPH_GRADIENT, np.ones((3, 3), np.uint8)).astype(np.float32)
            layer = layer * (1 - edge[..., None]) + float(rng.integers(0, 2) * 255) * edge[..., None]
        img = img * (1 - alpha[..., None]) + layer * alpha[..., None]
        for o in objs:  # what this object covers is no longer visible below it
            o[2] *= 1 - alpha
        objs.append([cls, m, m.copy()])
    # occluders that are not objects: thick strokes over the scene
    if rng.random() < 0.3:
        for _ in range(rng.integers(1, 3)):
            occ = np.zeros((h, w), np.uint8)
            p1 = (int(rng.integers(0, w)), int(rng.integers(0, h)))
            p2 = (int(rng.integers(0, w)), int(rng.integers(0, h)))
            cv2.line(occ, p1, p2, 255, int(rng.integers(4, 14)), cv2.LINE_AA)
            a = occ.astype(np.float32) / 255
            colour = _rand_colour(rng)
            if not all(_visible_after(o, a) for o in objs):
                continue
            img = img * (1 - a[..., None]) + colour[None, None, :] * a[..., None]
            for o in objs:
                o[2] *= 1 - a
    labels = []
    for cls, full, vis in objs:
        if vis.sum() < MIN_VISIBLE * full.sum():
            continue  # cannot happen by construction (placement checks), kept as a guard
        bb = _bbox(vis)
        if bb is None or bb[2] - bb[0] < 4 or bb[3] - bb[1] < 4:
            continue
        labels.append((cls, *bb))
    # global photometric effects: lighting field, blur, noise, gamma, JPEG
    light = 0.6 + 0.8 * _value_noise(rng, h, w, 2)[..., None] if rng.random() < 0.5 else 1.0
    img = img * light * rng.uniform(0.7, 1.2) + rng.uniform(-25, 25)
    img = np.clip(img, 0, 255).astype(np.uint8)
    u = rng.random()
    if u < 0.25:
        img = cv2.GaussianBlur(img, (0, 0), rng.uniform(0.5, 1.8))
    elif u < 0.35:
        k = int(rng.integers(3, 8))
        ker = np.zeros((k, k), np.float32)
        ker[k // 2, :] = 1.0 / k
        rot = cv2.getRotationMatrix2D((k / 2 - 0.5, k / 2 - 0.5), float(rng.uniform(0, 180)), 1.0)
        ker = cv2.warpAffine(ker, rot, (k, k))
        img = cv2.filter2D(img, -1, ker / max(ker.sum(), 1e-6))
    sigma = rng.uniform(0, 14)
    img = np.clip(img.astype(np.float32) + rng.normal(0, sigma, img.shape), 0, 255)
    gamma = rng.uniform(0.7, 1.4)
    img = (255 * (img / 255) ** gamma).astype(np.uint8)
    quality = int(rng.integers(70, 96))
    return img, labels, quality


def _visible_after(obj, alpha: np.ndarray) -> bool:
    _, full, vis = obj
    return float((vis * (1 - alpha)).sum()) >= MIN_VISIBLE * float(full.sum())


def _iou(a, b) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter + 1e-9)


def _write_one(job) -> int:
    out, seed, split, index = job
    img, labels, quality = render(seed, split, index)
    h, w = img.shape[:2]
    stem = f"{index:06d}"
    cv2.imwrite(str(out / "images" / split / f"{stem}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, quality])
    with open(out / "labels" / split / f"{stem}.txt", "w") as f:
        for cls, x1, y1, x2, y2 in labels:
            x1, y1, x2, y2 = max(0.0, x1), max(0.0, y1), min(float(w), x2), min(float(h), y2)
            f.write(f"{cls} {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / h:.6f} {(x2 - x1) / w:.6f} {(y2 - y1) / h:.6f}\n")
    return len(labels)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--val", type=int, default=300)
    ap.add_argument("--test", type=int, default=300)
    ap.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    a = ap.parse_args(argv)
    cv2.setNumThreads(1)
    jobs = []
    for split in SPLITS:
        (a.out / "images" / split).mkdir(parents=True, exist_ok=True)
        (a.out / "labels" / split).mkdir(parents=True, exist_ok=True)
        jobs += [(a.out, a.seed, split, i) for i in range(getattr(a, split))]
    if a.workers > 1:
        with Pool(a.workers) as pool:
            counts = pool.map(_write_one, jobs, chunksize=8)
    else:
        counts = [_write_one(j) for j in jobs]
    names = "\n".join(f"  {i}: {n}" for i, n in enumerate(CLASSES))
    (a.out / "data.yaml").write_text(
        f"# yolo-edge synthetic shapes, scripts/make_shapes_dataset.py --seed {a.seed}\n"
        f"train: images/train\nval: images/val\ntest: images/test\nnc: {len(CLASSES)}\nnames:\n{names}\n"
    )
    print(f"{len(jobs)} images, {sum(counts)} objects -> {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
