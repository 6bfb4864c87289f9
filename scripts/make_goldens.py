#!/usr/bin/env python3
"""Regenerate the reference goldens under tests/goldens/ (see scripts/README.md).

    python scripts/make_goldens.py                       # everything
    python scripts/make_goldens.py --only random --variants t,s
    python scripts/make_goldens.py --only real,resize

Needs the reference venv (torch CPU, ultralytics, opencv) and ../shared/fixtures. The network input pixels come
from the Rust letterbox (`yolo-edge letterbox`, or $YOLO_EDGE_BIN with the same CLI); without it the script falls
back to cv2 for development and marks the goldens "cv2-fallback (DEV ONLY)".
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import goldens_common as gc  # noqa: E402

OUT = gc.REPO / "tests" / "goldens"


# ----------------------------------------------------------------------------------------------------------------------
# 0. Input


def load_inputs():
    arrs, meta = [], []
    for name in gc.IMAGES:
        a, src = gc.rust_letterbox(gc.FIXTURES / name, 640)
        arrs.append(a)
        meta.append({"image": name, "letterbox_source": src, "pixels_sha256": gc.sha256(a.tobytes())})
        print(f"input {name}: {src} sha256={meta[-1]['pixels_sha256'][:16]}")
    return arrs, gc.to_input(arrs), meta


# ----------------------------------------------------------------------------------------------------------------------
# 1. Seeded random weights


def bn_checksum(model, k=3):
    import torch

    out = []
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            out.append({
                "name": name,
                "eps": m.eps,
                "running_mean": gc.f32list(m.running_mean[:4]),
                "running_var": gc.f32list(m.running_var[:4]),
            })
            if len(out) == k:
                break
    return out


def golden_random(variant: str, x, inputs_meta):
    import torch
    from ultralytics.nn.modules.head import Detect
    from ultralytics.nn.tasks import DetectionModel

    t0 = time.time()
    model = DetectionModel(f"yolov9{variant}.yaml", nc=80, verbose=False)
    head = model.model[-1]
    assert type(head) is Detect and head.legacy, "expected the legacy (v8/v9) Detect head"
    assert isinstance(head.cv3[0][0], torch.nn.Module) and type(head.cv3[0][0]).__name__ == "Conv", head.cv3[0]
    sd = model.state_dict()
    names_shapes = [[k, list(v.shape)] for k, v in sd.items()]
    gc.apply_seeded_weights(model)
    model.float()
    gc.calibrate_bn(model, x)
    with torch.no_grad():
        out = gc.detect_output(model(x))
    assert out.shape == (x.shape[0], 84, 8400), out.shape
    eps = sorted({m.eps for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)})
    g = gc.provenance(
        "model = ultralytics.nn.tasks.DetectionModel(f'yolov9{V}.yaml', nc=80, verbose=False)  # legacy Detect head; "
        "every state_dict entry except *running_mean/*running_var/*num_batches_tracked/*dfl.conv.weight <- "
        "seeded_value(name, shape) (fnv1a64(name) + splitmix64, see scripts/README.md); model.eval(); "
        "forward_pre_hook on every nn.BatchNorm2d: running_mean = x.mean((0,2,3)), "
        "running_var = x.var((0,2,3), unbiased=False); one pass over x; hooks removed; "
        "out = model(x)[0]  # (B, 4+nc, A): xywh in input pixels, then sigmoid scores; "
        "x = stack(torch.from_numpy(rust_letterbox(img)).permute(2,0,1).float()/255 for img in images)")
    g.update({
        "variant": variant,
        "yaml": f"yolov9{variant}.yaml",
        "nc": 80,
        "inputs": inputs_meta,
        "head": {"class": "Detect", "legacy": True, "reg_max": head.reg_max, "stride": head.stride.tolist(),
                 "cv3_first": type(head.cv3[0][0]).__name__},
        "bn_eps": eps,
        "n_params": sum(p.numel() for p in model.parameters()),
        "state_dict": names_shapes,
        **gc.output_summary(out),
        "bn_checksum": bn_checksum(model),
    })
    n = gc.write_json(OUT / f"random_yolov9{variant}.json", g)
    print(f"random_yolov9{variant}.json: {n / 1e3:.0f} KB, {time.time() - t0:.1f}s")
    del model


# ----------------------------------------------------------------------------------------------------------------------
# 2. Real checkpoint


def dets_list(pred) -> list[dict]:
    """pred: (N, 6) [x1, y1, x2, y2, conf, cls] in original pixels."""
    p = pred.detach().float().cpu().numpy()
    return [{"class_id": int(r[5]), "confidence": float(np.float32(r[4])), "box": gc.f32list(r[:4])} for r in p]


def compare_dets(a: list[dict], b: list[dict]) -> dict:
    """Greedy match (same class, nearest box by max coordinate difference), order-independent."""
    used, box, conf, matched = set(), 0.0, 0.0, 0
    for da in a:
        best = None
        for j, db in enumerate(b):
            if j in used or db["class_id"] != da["class_id"]:
                continue
            d = max(abs(u - v) for u, v in zip(da["box"], db["box"]))
            if best is None or d < best[0]:
                best = (d, j)
        if best is not None and best[0] < 8.0:
            used.add(best[1])
            matched += 1
            box = max(box, best[0])
            conf = max(conf, abs(da["confidence"] - b[best[1]]["confidence"]))
    return {"count": [len(a), len(b)], "matched": matched, "max_box_diff_px": box, "max_conf_diff": conf}


def golden_real(arrs, x, inputs_meta):
    import cv2
    import torch
    from ultralytics import YOLO
    from ultralytics.data.augment import LetterBox
    from ultralytics.utils import nms, ops

    t0 = time.time()
    ckpt = gc.FIXTURES / "yolov9t-ball.pt"
    yolo = YOLO(str(ckpt))
    model = yolo.model.float().eval()
    head = model.model[-1]
    cv3_first = type(head.cv3[0][0]).__name__
    with torch.no_grad():
        out = gc.detect_output(model(x))
    assert out.shape == (2, 5, 8400), out.shape

    # fused f32 (what predict() runs: AutoBackend fuses by default)
    fused = copy.deepcopy(model).fuse(verbose=False)
    with torch.no_grad():
        outf = gc.detect_output(fused(x))
    d = (outf - out).abs()
    fused_info = {
        "max_abs_diff": float(d.max()),
        "max_abs_diff_boxes_px": float(d[:, :4].max()),
        "max_abs_diff_scores": float(d[:, 4:].max()),
        "max_rel_diff": float((d / out.abs().clamp_min(1e-3)).max()),
        "rel_l2": float((outf - out).norm() / out.norm()),
    }

    # f16 on CPU
    try:
        mh = copy.deepcopy(model).half()
        t1 = time.time()
        with torch.no_grad():
            outh = gc.detect_output(mh(x.half())).float()
        f16 = {
            "supported": True,
            "rel_l2": float((outh - out).norm() / out.norm()),
            "rel_l2_boxes": float((outh[:, :4] - out[:, :4]).norm() / out[:, :4].norm()),
            "rel_l2_scores": float((outh[:, 4:] - out[:, 4:]).norm() / out[:, 4:].norm()),
            "max_abs_diff_boxes_px": float((outh[:, :4] - out[:, :4]).abs().max()),
            "max_abs_diff_scores": float((outh[:, 4:] - out[:, 4:]).abs().max()),
            "seconds": round(time.time() - t1, 1),
            "how": "copy.deepcopy(model).half()(x.half()) on CPU vs the f32 model, same input",
        }
    except Exception as e:  # noqa: BLE001
        f16 = {"supported": False, "error": f"{type(e).__name__}: {e}"[:300]}

    conf, iou, max_det = 0.01, 0.7, 300
    # (A) the reference's own pipeline from the JPEG files (cv2 decode, fused model)
    det_predict, det_manual, det_rust = [], [], []
    for name in gc.IMAGES:
        path = str(gc.FIXTURES / name)
        r = yolo.predict(source=path, conf=conf, iou=iou, imgsz=640, rect=False, max_det=max_det, device="cpu",
                         half=False, verbose=False)[0]
        shape = yolo.predictor.pre_transform([cv2.imread(path)])[0].shape
        assert shape == (640, 640, 3), f"predict() letterbox is not the square one: {shape}"
        b = r.boxes
        pred = torch.cat([b.xyxy, b.conf[:, None], b.cls[:, None]], 1)
        det_predict.append(dets_list(pred))
    # (B) same by hand: LetterBox(auto=False) + unfused f32 model + non_max_suppression + scale_boxes
    for name in gc.IMAGES:
        bgr = cv2.imread(str(gc.FIXTURES / name))
        lb = LetterBox((640, 640), auto=False)(image=bgr)[:, :, ::-1]
        with torch.no_grad():
            o = gc.detect_output(model(gc.to_input([np.ascontiguousarray(lb)])))
        p = nms.non_max_suppression(o, conf, iou, max_det=max_det)[0]
        p[:, :4] = ops.scale_boxes((640, 640), p[:, :4], bgr.shape[:2])
        det_manual.append(dets_list(p))
    # (C) from the Rust-letterboxed input (decoder differences show up here), unfused f32 model
    import PIL.Image

    for i, name in enumerate(gc.IMAGES):
        w, h = PIL.Image.open(gc.FIXTURES / name).size
        p = nms.non_max_suppression(out[i : i + 1].clone(), conf, iou, max_det=max_det)[0]
        p[:, :4] = ops.scale_boxes((640, 640), p[:, :4], (h, w))
        det_rust.append(dets_list(p))

    summ = gc.output_summary(out)
    row4 = [float(f"{v:.6g}") for v in out[0, 4].numpy().astype(np.float64)]
    g = gc.provenance(
        "model = ultralytics.YOLO('yolov9t-ball.pt').model.float().eval()  # unfused f32; "
        "out = model(x)[0]  # (2, 5, 8400); x as in the random goldens (Rust letterbox of horses.jpg, "
        "volleyball-court.jpg); detections: see 'detections_*' how fields")
    g.update({
        "checkpoint": "yolov9t-ball.pt",
        "checkpoint_version": "8.3.3",
        "names": {str(k): v for k, v in model.names.items()},
        "inputs": inputs_meta,
        "head": {"class": type(head).__name__, "legacy": cv3_first != "Sequential", "reg_max": head.reg_max,
                 "stride": head.stride.tolist(), "cv3_first": cv3_first},
        "bn_eps": sorted({m.eps for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)}),
        **summ,
        "row4_image0": row4,
        "row4_image0_note": "out[0, 4, :] (ball score of every anchor), rounded to 6 significant digits",
        "fused_f32_vs_unfused": fused_info,
        "f16_vs_f32": f16,
        "nms": {"conf": conf, "iou": iou, "max_det": max_det, "imgsz": 640, "agnostic": False},
        "detections_predict": det_predict,
        "detections_predict_how": (
            "YOLO(ckpt).predict(source=jpg, conf=0.01, iou=0.7, imgsz=640, rect=False, max_det=300, half=False): "
            "cv2.imread decode, LetterBox((640,640), auto=False) (asserted), FUSED f32 model, "
            "non_max_suppression, scale_boxes to original pixels; boxes [x1,y1,x2,y2], descending confidence"),
        "detections_manual_unfused": det_manual,
        "detections_manual_unfused_how": (
            "cv2.imread + LetterBox((640,640), auto=False) + unfused f32 model + "
            "ultralytics.utils.nms.non_max_suppression(out, 0.01, 0.7, max_det=300) + ops.scale_boxes"),
        "manual_vs_predict": [compare_dets(a, b) for a, b in zip(det_manual, det_predict)],
        "detections_rust_input": det_rust,
        "detections_rust_input_how": (
            "the golden's own input x (Rust letterbox/decoder) + unfused f32 model + non_max_suppression + "
            "scale_boxes((640,640), boxes, original (h,w)); this is what the Rust pipeline should reproduce"),
        "rust_input_vs_predict": [compare_dets(a, b) for a, b in zip(det_rust, det_predict)],
    })
    n = gc.write_json(OUT / "real_yolov9t_ball.json", g)
    print(f"real_yolov9t_ball.json: {n / 1e3:.0f} KB, {time.time() - t0:.1f}s; "
          f"dets predict={[len(d) for d in det_predict]} rust={[len(d) for d in det_rust]}; f16={f16.get('rel_l2')}")


# ----------------------------------------------------------------------------------------------------------------------
# 3. Resize bit-exactness


def resize_src(w: int, h: int) -> np.ndarray:
    u = gc.prng_u(f"resize-src-{w}x{h}", w * h * 3)
    return np.floor(u * 256).astype(np.uint8).reshape(h, w, 3)


def gradient_src(w: int, h: int) -> np.ndarray:
    """Smooth image: R = x*255//(w-1), G = y*255//(h-1), B = (x+y)*255//(w+h-2) (integer division)."""
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([xx * 255 // (w - 1), yy * 255 // (h - 1), (xx + yy) * 255 // (w + h - 2)], -1).astype(np.uint8)


def letterbox_size(w: int, h: int, s: int) -> tuple[int, int]:
    r = min(s / h, s / w)
    return max(round(w * r), 1), max(round(h * r), 1)


def cv_taps(dst: int, src: int, is_x: bool):
    """OpenCV 5 INTER_LINEAR 8U coefficients (resizeGeneric, fixed point, INTER_RESIZE_COEF_BITS = 11)."""
    d = np.arange(dst, dtype=np.float64)
    f = ((d + 0.5) * (src / dst) - 0.5).astype(np.float32)
    s = np.floor(f)
    f = (f - s).astype(np.float32)
    s = s.astype(np.int64)
    if is_x:
        m = s < 0
        f[m], s[m] = 0, 0
        m = s >= src - 1
        f[m], s[m] = 0, src - 1
    w0 = np.rint((np.float32(1) - f) * np.float32(2048)).astype(np.int64)  # cvRound: ties to even
    w1 = np.rint(f * np.float32(2048)).astype(np.int64)
    return np.clip(s, 0, src - 1), np.clip(s + 1, 0, src - 1), w0, w1


def resize_replica(img: np.ndarray, dw: int, dh: int) -> np.ndarray:
    sh, sw = img.shape[:2]
    x0, x1, a0, a1 = cv_taps(dw, sw, True)
    y0, y1, b0, b1 = cv_taps(dh, sh, False)
    s = img.astype(np.int64)
    hh = s[:, x0] * a0[None, :, None] + s[:, x1] * a1[None, :, None]
    h0, h1 = hh[y0], hh[y1]
    out = ((((h0 >> 4) * b0[:, None, None]) >> 16) + (((h1 >> 4) * b1[:, None, None]) >> 16) + 2) >> 2
    return np.clip(out, 0, 255).astype(np.uint8)


def verify_replica(n_cases: int = 300) -> dict:
    import cv2

    rng = np.random.default_rng(123)
    tot = bad = bad_cases = 0
    for t in range(n_cases):
        hi = 40 if t % 3 == 0 else 1300
        sw, sh, dw, dh = (int(v) for v in rng.integers(1, hi, 4))
        img = rng.integers(0, 256, (sh, sw, 3), dtype=np.uint8)
        c = cv2.resize(img, (dw, dh), interpolation=cv2.INTER_LINEAR)
        k = int((resize_replica(img, dw, dh) != c).sum())
        tot, bad, bad_cases = tot + c.size, bad + k, bad_cases + (k > 0)
    return {"random_cases": n_cases, "mismatching_cases": bad_cases, "mismatching_bytes": bad, "bytes": tot}


def golden_resize():
    import cv2

    t0 = time.time()
    srcs = [(97, 61), (773, 512), (1920, 1080), (33, 200), (640, 427)]
    targets_fixed = [(101, 37), (700, 500)]
    cases = []
    for kind, (w, h) in [("prng", s) for s in srcs] + [("gradient", (300, 200))]:
        img = resize_src(w, h) if kind == "prng" else gradient_src(w, h)
        tg = [letterbox_size(w, h, 640), letterbox_size(w, h, 320), *targets_fixed]
        if w % 2 == 0 and h % 2 == 0:
            tg.append((w // 2, h // 2))  # OpenCV routes exact 2x down to INTER_AREA (same result)
        tg.append((w + 1, h - 1) if h > 1 else (w + 1, h))
        seen = set()
        for dw, dh in tg:
            if (dw, dh) in seen:
                continue
            seen.add((dw, dh))
            dst = cv2.resize(img, (dw, dh), interpolation=cv2.INTER_LINEAR)
            assert (resize_replica(img, dw, dh) == dst).all(), ("replica mismatch", w, h, dw, dh)
            cases.append({"src": kind, "src_name": f"resize-src-{w}x{h}" if kind == "prng" else f"gradient-{w}x{h}",
                          "src_size": [w, h], "src_sha256": gc.sha256(img.tobytes()), "dst_size": [dw, dh],
                          "dst_sha256": gc.sha256(dst.tobytes()), "dst_first64": [int(v) for v in dst.ravel()[:64]]})
    ver = verify_replica()
    g = gc.provenance(
        "src (HxWx3 u8, row-major HWC) = floor(prng_u(f'resize-src-{w}x{h}', w*h*3) * 256) or the gradient image; "
        "dst = cv2.resize(src, (dw, dh), interpolation=cv2.INTER_LINEAR); channel order is irrelevant (per channel)")
    g.update({
        "opencv_cpu_features": cv2.getCPUFeaturesLine(),
        "opencv_use_optimized": cv2.useOptimized(),
        "gradient_rule": "R = x*255//(w-1), G = y*255//(h-1), B = (x+y)*255//(w+h-2), integer division",
        "rule": (
            "per dst coord d: f = float32((d+0.5)*src/dst - 0.5) (f64 then cast), s = floor(f), f -= s (f32); "
            "x only: if s < 0 {f=0; s=0}; if s >= sw-1 {f=0; s=sw-1}; "
            "w0 = round_ties_even((1-f)*2048) [f32], w1 = round_ties_even(f*2048) [f32] (cvRound = ties to even; "
            "not round-half-away, which mismatches ~0.4% of bytes); taps s and min(s+1, len-1), rows clamped "
            "to [0, sh-1] with unadjusted weights; H = S[s0]*w0 + S[s1]*w1 (i32); "
            "out = ((((H0>>4)*b0)>>16) + (((H1>>4)*b1)>>16) + 2) >> 2, saturate u8 (for every x, no scalar tail)"),
        "replica_vs_cv2": ver,
        "cases": cases,
    })
    n = gc.write_json(OUT / "resize_cv2.json", g)
    print(f"resize_cv2.json: {n / 1e3:.0f} KB, {len(cases)} cases, replica {ver}, {time.time() - t0:.1f}s")


# ----------------------------------------------------------------------------------------------------------------------


def main():
    global OUT
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="random,real,resize", help="comma list of: random, real, resize")
    ap.add_argument("--variants", default="t,s,m,c,e", help="yolov9 variants for the random goldens")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    OUT = a.out
    only = set(a.only.split(","))
    import torch

    torch.set_num_threads(a.threads)
    if "resize" in only:
        golden_resize()
    if only & {"random", "real"}:
        arrs, x, meta = load_inputs()
        if "real" in only:  # before the random models: DetectionModel(yaml) flips the class-wide Detect.legacy
            golden_real(arrs, x, meta)
        if "random" in only:
            for v in a.variants.split(","):
                golden_random(v, x, meta)


if __name__ == "__main__":
    main()
