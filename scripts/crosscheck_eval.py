#!/usr/bin/env python3
"""Cross-check of `yolo-edge eval` against ultralytics' own metric code on identical letterboxing:
ultralytics NMS (multi-label), `match_predictions` and `ap_per_class` on pictures letterboxed the
way its predictor (and yolo-edge) does, instead of its val loader's ceil-resize.

Usage: python3 scripts/crosscheck_eval.py best.pt DATASET_DIR [IMGSZ]  (DATASET_DIR/images/test, labels/test)
"""
import glob
import sys

import cv2
import numpy as np
import torch
from ultralytics import YOLO
from ultralytics.data.augment import LetterBox
from ultralytics.utils import nms
from ultralytics.utils.metrics import ap_per_class, box_iou
from ultralytics.engine.validator import BaseValidator
torch.set_num_threads(2)
m = YOLO(sys.argv[1]).model.float().eval().fuse()
root = sys.argv[2]
S = int(sys.argv[3]) if len(sys.argv) > 3 else 416
class V: pass
v = V(); v.iouv = torch.linspace(0.5, 0.95, 10)
tps, confs, pcls, tcls = [], [], [], []
lb = LetterBox((S, S), auto=False)
for f in sorted(glob.glob(f"{root}/images/test/*.*")):
    im = cv2.imread(f); h0, w0 = im.shape[:2]
    x = lb(image=im)
    r = min(S / h0, S / w0); nw, nh = round(w0 * r), round(h0 * r)
    left = round((S - nw) / 2 - 0.1); top = round((S - nh) / 2 - 0.1)
    t = torch.from_numpy(x[..., ::-1].copy()).permute(2, 0, 1)[None].float() / 255
    with torch.no_grad():
        p = m(t)
        p = p[0] if isinstance(p, (list, tuple)) else p
    out = nms.non_max_suppression(p, 0.001, 0.7, multi_label=True, max_det=300)[0]
    g = np.loadtxt(f.replace("/images/", "/labels/").rsplit(".", 1)[0] + ".txt", ndmin=2)
    gc = torch.tensor(g[:, 0]); gb = torch.tensor(g[:, 1:], dtype=torch.float32)
    gx = torch.stack([(gb[:, 0] - gb[:, 2] / 2) * nw + left, (gb[:, 1] - gb[:, 3] / 2) * nh + top, (gb[:, 0] + gb[:, 2] / 2) * nw + left, (gb[:, 1] + gb[:, 3] / 2) * nh + top], 1)
    if len(out) and len(g):
        tp = BaseValidator.match_predictions(v, out[:, 5], gc.float(), box_iou(gx, out[:, :4])).numpy()
    else:
        tp = np.zeros((len(out), 10), bool)
    tps.append(tp); confs.append(out[:, 4].numpy()); pcls.append(out[:, 5].numpy()); tcls.append(g[:, 0])
res = ap_per_class(np.concatenate(tps), np.concatenate(confs), np.concatenate(pcls), np.concatenate(tcls))
p, r, ap = res[2], res[3], res[5]
print(f"P {p.mean():.4f} R {r.mean():.4f} mAP50 {ap[:, 0].mean():.4f} mAP50-95 {ap.mean():.4f}")
