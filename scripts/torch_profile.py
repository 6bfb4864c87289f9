"""Where PyTorch's (ultralytics) YOLOv9 FP16 time goes on the GPU: CUDA kernel time per kind
(convolution, elementwise, copy/concat, other) for one batch, from torch.profiler.

The counterpart of `yolo-edge bench --profile` (scripts/gpu_run.sh, STEPS=torchprofile): run
both in one device call to see which kernels PyTorch spends less on.
Env: VARIANTS (t,e) BATCH (256) MODE (fp16cl | fp16); writes $OUT/torch_profile.json.
"""
import json, os, sys
sys.modules.setdefault('polars', None); sys.modules.setdefault('ultralytics_platform', None)
import torch
from torch.profiler import profile, ProfilerActivity
from ultralytics.nn.tasks import DetectionModel

torch.backends.cudnn.benchmark = True
dev = torch.device('cuda')
b = int(os.environ.get('BATCH', '256'))
cl = os.environ.get('MODE', 'fp16cl') == 'fp16cl'
out = []


def kind(name):
    n = name.lower()
    if any(k in n for k in ('conv', 'xmma', 'cutlass', 'sm90', 'implicit', 'gemm', 'cudnn')):
        return 'convolution/gemm'
    if 'cat' in n or 'copy' in n or 'upsample' in n:
        return 'concat/copy/upsample'
    if 'elementwise' in n or 'silu' in n or 'add' in n or 'mul' in n:
        return 'elementwise'
    return 'other'


for v in os.environ.get('VARIANTS', 't,e').split(','):
    m = DetectionModel(f'yolov9{v}.yaml', nc=80, verbose=False).eval().fuse(verbose=False).to(dev).half()
    if cl:
        m = m.to(memory_format=torch.channels_last)
    x = torch.rand(b, 3, 640, 640, device=dev, dtype=torch.float16)
    if cl:
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        for _ in range(3):
            m(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            m(x)
            torch.cuda.synchronize()
    kinds, kernels = {}, []
    for e in prof.key_averages():
        t = e.device_time_total / 1000.0  # ms
        if t <= 0:
            continue
        kinds[kind(e.key)] = kinds.get(kind(e.key), 0.0) + t
        kernels.append((t, e.count, e.key[:110]))
    kernels.sort(reverse=True)
    r = dict(variant=v, batch=b, layout='channels_last' if cl else 'nchw', total_ms=round(sum(kinds.values()), 2),
             kinds={k: round(t, 2) for k, t in sorted(kinds.items(), key=lambda kv: -kv[1])},
             top=[dict(ms=round(t, 3), calls=c, kernel=k) for t, c, k in kernels[:25]])
    out.append(r)
    print(json.dumps({k: r[k] for k in ('variant', 'batch', 'layout', 'total_ms', 'kinds')}), flush=True)
    for t, c, k in kernels[:12]:
        print(f'  {t:8.3f} ms {c:4d}x {k}', flush=True)
    del m, x
    torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get('OUT', '.'), 'torch_profile.json'), 'w'), indent=1)
