"""Writes src/assets/manifests/yolov9{t,s,m,c,e}.json: every state-dict entry (name, shape) of
ultralytics' DetectionModel for the five YOLOv9 variants (80 classes), so that `yolo-edge bench
--model random:yolov9X` can build a full-size model with seeded random weights without a
checkpoint file. Run with the project venv: /work/venv/bin/python scripts/make_shape_manifests.py
"""
import json, os, sys
sys.modules.setdefault('polars', None)
from ultralytics.nn.tasks import DetectionModel

out = os.path.join(os.path.dirname(__file__), '..', 'assets', 'manifests')
os.makedirs(out, exist_ok=True)
for v in 'tsmce':
    m = DetectionModel(f'yolov9{v}.yaml', nc=80, verbose=False)
    sd = m.state_dict()
    entries = [[k, list(t.shape)] for k, t in sd.items() if not k.endswith('num_batches_tracked')]
    path = os.path.join(out, f'yolov9{v}.json')
    with open(path, 'w') as f:
        json.dump({'variant': v, 'nc': 80, 'source': 'ultralytics 8.4.190 DetectionModel(yolov9%s.yaml)' % v, 'tensors': entries}, f, separators=(',', ':'))
    print(path, len(entries), sum(t.numel() for t in sd.values()))
