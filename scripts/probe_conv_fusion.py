#!/usr/bin/env python3
"""Does fusing bias + SiLU into the convolution pay where a YOLOv9 pass is launch-bound?

yolo-edge runs each convolution as a cuDNN call followed by one epilogue kernel (bias, SiLU,
residual, written into a concatenation: `src/backend/cuda/epilogue.rs`). At batch 1 the pass is
a chain of a few hundred small kernels, so removing one kernel per convolution is the largest
lever left on batch-1 latency. cuDNN's runtime-fusion engines can compile a convolution with a
pointwise epilogue into one kernel (the graph API; the legacy `cudnnConvolutionBiasActivation-
Forward` has no SiLU). This probe measures, before any of it is built into yolo-edge:

  A. torch's convolution (cuDNN, channels-last, `cudnn.benchmark`) + one bias+SiLU kernel
     (the shape of yolo-edge's pass today);
  B. cuDNN graph API convolution alone (its fastest plan, timed) + the same bias+SiLU kernel;
  C. cuDNN graph API convolution + bias + SiLU as one graph (its fastest plan, timed);

for every convolution of the network as it runs (shapes recorded by hooks on a real forward
pass), each sequence replayed as one CUDA graph, so the times are those of a captured pass:
the per-kernel gaps count as in yolo-edge's graphs. It also reports which convolutions cuDNN
could not fuse, the fused results' largest error against torch, and the plan-build time (the
start-up a fused path would add).

Needs: python3 with torch (CUDA) and triton, ultralytics (the carried wheel), and
nvidia-cudnn-frontend 1.14 (the carried wheel: plain bindings over the C++ frontend) with
torch's cuDNN on LD_LIBRARY_PATH. Used by `STEPS=fusion scripts/gpu_run.sh`.

    python3 scripts/probe_conv_fusion.py --variants t,c --batches 1,8 --input 384x640 --out DIR
"""

import argparse
import json
import statistics
import sys
import time
import traceback


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variants", default="t,c", help="YOLOv9 variants (t,s,m,c,e)")
    p.add_argument("--batches", default="1,8", help="batch sizes")
    p.add_argument("--input", default="384x640", help="network input HxW (a 1280x720 frame's rectangle: 384x640)")
    p.add_argument("--replays", type=int, default=300, help="graph replays per timing")
    p.add_argument("--max-plans", type=int, default=3, help="plans built and timed per graph (the heuristics' first ones)")
    p.add_argument("--build-budget", type=float, default=120.0, help="seconds of plan building per case; past it convolutions stay unfused")
    p.add_argument("--out", default=None, help="folder for fusion.json")
    return p.parse_args()


def record_convs(variant, batch, h, w):
    """Every convolution of a fused (BatchNorm folded), channels-last f16 YOLOv9 forward pass, in
    order: (input tensor, weight, bias, stride, padding, groups, silu)."""
    import torch
    from ultralytics.nn.modules.conv import Conv
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    model = DetectionModel(f"yolov9{variant}.yaml", nc=80, verbose=False).eval()
    model.fuse(verbose=False)
    model = model.half().cuda().to(memory_format=torch.channels_last)
    owner = {}  # nn.Conv2d -> whether its Conv module applies SiLU after it
    for m in model.modules():
        if isinstance(m, Conv):
            owner[id(m.conv)] = isinstance(m.act, torch.nn.SiLU)
    seen = []

    def hook(mod, inputs, _out):
        seen.append(
            dict(
                x=inputs[0].detach().clone(memory_format=torch.channels_last),
                w=mod.weight.detach().contiguous(memory_format=torch.channels_last),
                b=None if mod.bias is None else mod.bias.detach().clone(),
                stride=list(mod.stride),
                padding=list(mod.padding),
                groups=mod.groups,
                silu=owner.get(id(mod), False),
            )
        )

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    x = torch.rand(batch, 3, h, w, device="cuda", dtype=torch.half).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        model(x)
    for hd in handles:
        hd.remove()
    torch.cuda.synchronize()
    return seen


def epilogue_kernel():
    """One bias (+ SiLU) kernel over a channels-last f16 tensor, as yolo-edge's epilogue."""
    import triton
    import triton.language as tl

    @triton.jit
    def bias_act(x_ptr, b_ptr, y_ptr, n, c, ACT: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        v = tl.load(x_ptr + offs, mask=m).to(tl.float32) + tl.load(b_ptr + offs % c, mask=m).to(tl.float32)
        if ACT:
            v = v * tl.sigmoid(v)
        tl.store(y_ptr + offs, v.to(tl.float16), mask=m)

    def run(x, b, y, act):
        n = x.numel()
        bias_act[(triton.cdiv(n, 1024),)](x, b, y, n, b.numel(), ACT=act, BLOCK=1024)

    return run


class CudnnPlan:
    """A convolution shape as a cuDNN graph (optionally with bias and SiLU fused), on the fastest
    of the first `max_plans` plans the heuristics offer, each timed; shared by the convolutions
    of that shape, each of which runs it on its own buffers."""

    def __init__(self, cudnn, handle, c, out, fused, max_plans):
        import torch

        g = cudnn.pygraph(
            io_data_type=cudnn.data_type.HALF,
            intermediate_data_type=cudnn.data_type.FLOAT,
            compute_data_type=cudnn.data_type.FLOAT,
            handle=handle,
        )
        x, w = c["x"], c["w"]
        self.tx = g.tensor(name="X", dim=list(x.size()), stride=list(x.stride()), data_type=cudnn.data_type.HALF)
        self.tw = g.tensor(name="W", dim=list(w.size()), stride=list(w.stride()), data_type=cudnn.data_type.HALF)
        y = g.conv_fprop(image=self.tx, weight=self.tw, padding=c["padding"], stride=c["stride"], dilation=[1, 1])
        self.tb = None
        if fused:
            k = w.size(0)
            self.tb = g.tensor(name="B", dim=[1, k, 1, 1], stride=[k, 1, k, k], data_type=cudnn.data_type.HALF)
            y = g.bias(input=y, bias=self.tb)
            if c["silu"]:
                y = g.swish(input=y)
        y.set_output(True).set_data_type(cudnn.data_type.HALF)
        self.ty = y
        t = time.perf_counter()
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        built = []
        for i in range(min(g.get_execution_plan_count(), max_plans)):
            try:
                g.build_plan_at_index(i)
                built.append(i)
            except Exception:  # noqa: BLE001 - an unbuildable plan is passed over
                continue
        self.build_s = time.perf_counter() - t
        if not built:
            raise RuntimeError("no plan could be built")
        self.g, self.handle, self.cudnn = g, handle, cudnn
        ws = max(g.get_workspace_size_plan_at_index(i) for i in built)
        self.ws = torch.empty(max(ws, 1), device="cuda", dtype=torch.uint8)
        self.index, self.name, self.ms = self._fastest(built, c, out)

    def run(self, c, out, index=None):
        import torch

        pack = {self.tx: c["x"], self.tw: c["w"], self.ty: out}
        if self.tb is not None:
            pack[self.tb] = c["b"].view(1, -1, 1, 1)
        self.cudnn.set_stream(handle=self.handle, stream=torch.cuda.current_stream().cuda_stream)
        self.g.execute_plan_at_index(pack, self.ws, self.index if index is None else index, handle=self.handle)

    def _fastest(self, built, c, out):
        import torch

        best = None
        for i in built:
            try:
                for _ in range(3):
                    self.run(c, out, i)
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(20):
                    self.run(c, out, i)
                e.record()
                torch.cuda.synchronize()
                ms = s.elapsed_time(e) / 20
            except Exception:  # noqa: BLE001 - a plan that fails to run is passed over
                continue
            if best is None or ms < best[2]:
                best = (i, self.g.get_plan_name_at_index(i), ms)
        if best is None:
            raise RuntimeError("no plan ran")
        return best


def shape_key(c, fused):
    return (tuple(c["x"].shape), tuple(c["w"].shape), tuple(c["stride"]), tuple(c["padding"]), c["groups"], fused and c["silu"], fused)


def graph_time(seq, replays):
    """Median ms of one replay of `seq` (a function queueing the whole sequence) captured as a
    CUDA graph, over 5 rounds of `replays` replays; None (and the reason) where capture fails."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            seq()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            seq()
    except Exception as e:  # noqa: BLE001 - reported, the row stays
        return None, f"capture failed: {e}"
    g.replay()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(replays):
            g.replay()
        e.record()
        torch.cuda.synchronize()
        rounds.append(s.elapsed_time(e) / replays)
    return statistics.median(rounds), None


def probe(cudnn, handle, variant, batch, h, w, args, epi):
    import torch
    import torch.nn.functional as F

    convs = record_convs(variant, batch, h, w)
    plans, why_not, build_s = {}, {}, 0.0

    def plan_for(c, out, fused):
        """The shared plan of `c`'s shape, or None with the reason kept."""
        nonlocal build_s
        key = shape_key(c, fused)
        if key not in plans and key not in why_not:
            if c["groups"] != 1:
                why_not[key] = "grouped"
            elif fused and build_s > args.build_budget:
                why_not[key] = f"build budget ({args.build_budget:.0f} s) spent"
            else:
                try:
                    plans[key] = CudnnPlan(cudnn, handle, c, out, fused, args.max_plans)
                    build_s += plans[key].build_s if fused else 0.0
                except Exception as e:  # noqa: BLE001 - reported per shape
                    why_not[key] = (str(e).splitlines() or [type(e).__name__])[0][:160]
        return plans.get(key), why_not.get(key)

    rows, skipped = [], []
    for k, c in enumerate(convs):
        if c["b"] is None:
            skipped.append(dict(index=k, x=list(c["x"].shape), w=list(c["w"].shape), why="no bias: not a folded Conv"))
            continue
        ref = F.conv2d(c["x"], c["w"], c["b"], c["stride"], c["padding"], 1, c["groups"])
        if c["silu"]:
            ref = F.silu(ref)
        r = dict(index=k, x=list(c["x"].shape), w=list(c["w"].shape), stride=c["stride"], silu=c["silu"])
        r["out"], r["epi_out"] = torch.empty_like(ref), torch.empty_like(ref)
        r["conv"], r["conv_why"] = plan_for(c, r["out"], False)
        r["fused"], r["fused_why"] = plan_for(c, r["out"], True)
        if r["fused"] is not None:
            r["fused"].run(c, r["out"])
            torch.cuda.synchronize()
            r["err"] = (r["out"].float() - ref.float()).abs().max().item()
        rows.append((c, r))

    def torch_conv(c, r):
        # torch's own output buffer; the epilogue reads a same-shaped one
        F.conv2d(c["x"], c["w"], None, c["stride"], c["padding"], 1, c["groups"])
        epi(r["out"], c["b"], r["epi_out"], c["silu"])

    def cudnn_conv(c, r):
        if r["conv"] is None:
            return torch_conv(c, r)
        r["conv"].run(c, r["out"])
        epi(r["out"], c["b"], r["epi_out"], c["silu"])

    def seq_torch():
        for c, r in rows:
            torch_conv(c, r)

    def seq_unfused():
        for c, r in rows:
            cudnn_conv(c, r)

    def seq_fused():
        for c, r in rows:
            if r["fused"] is not None:
                r["fused"].run(c, r["out"])
            else:
                cudnn_conv(c, r)

    torch.backends.cudnn.benchmark = True
    result = dict(variant=variant, batch=batch, input=f"{h}x{w}", convs=len(convs), timed=len(rows), shapes=len({shape_key(c, False) for c, _ in rows}))
    for name, seq in (("torch_conv_plus_epilogue", seq_torch), ("cudnn_conv_plus_epilogue", seq_unfused), ("cudnn_fused", seq_fused)):
        ms, why = graph_time(seq, args.replays)
        result[name + "_ms"] = ms
        if why:
            result[name + "_why"] = why
    fused = [r for _, r in rows if r["fused"] is not None]
    result["fused"] = len(fused)
    result["not_fused"] = [dict(index=r["index"], x=r["x"], w=r["w"], why=r["fused_why"]) for _, r in rows if r["fused"] is None]
    result["skipped"] = skipped
    result["max_err"] = max((r["err"] for r in fused), default=None)
    result["build_s"] = build_s
    # per convolution, the device time of each path alone (the plans' own timing)
    result["per_conv"] = [
        dict(
            index=r["index"],
            x=r["x"],
            w=r["w"],
            stride=r["stride"],
            silu=r["silu"],
            conv_ms=r["conv"].ms if r["conv"] else None,
            conv_plan=r["conv"].name if r["conv"] else r["conv_why"],
            fused_ms=r["fused"].ms if r["fused"] else None,
            fused_plan=r["fused"].name if r["fused"] else r["fused_why"],
            err=r.get("err"),
        )
        for _, r in rows
    ]
    return result


def main():
    args = parse_args()
    import torch
    import cudnn

    h, w = (int(v) for v in args.input.lower().split("x"))
    handle = cudnn.create_handle()
    epi = epilogue_kernel()
    print(f"torch {torch.__version__}, cuDNN backend {cudnn.backend_version()}, {torch.cuda.get_device_name()}", flush=True)
    results = []
    for v in args.variants.split(","):
        for b in (int(s) for s in args.batches.split(",")):
            t = time.perf_counter()
            try:
                r = probe(cudnn, handle, v, b, h, w, args, epi)
            except Exception as e:  # noqa: BLE001 - one case failing leaves the others
                r = dict(variant=v, batch=b, input=f"{h}x{w}", error=f"{type(e).__name__}: {e}", trace=traceback.format_exc())
                print(r["trace"], file=sys.stderr, flush=True)
            r["wall_s"] = round(time.perf_counter() - t, 1)
            results.append(r)
            print(json.dumps({k: r.get(k) for k in ("variant", "batch", "convs", "fused", "torch_conv_plus_epilogue_ms", "cudnn_conv_plus_epilogue_ms", "cudnn_fused_ms", "max_err", "build_s", "wall_s", "error")}), flush=True)
            torch.cuda.empty_cache()
    if args.out:
        with open(f"{args.out}/fusion.json", "w") as f:
            json.dump(results, f, indent=1, default=str)
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    print("\n| variant | batch | input | convs | fused | A torch conv + epi (ms) | B cuDNN conv + epi (ms) | C cuDNN fused (ms) | C/A | max err | fused plans built (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['variant']} | {r['batch']} | {r['input']} | error: {r['error'][:120]} |")
            continue
        a, c = r.get("torch_conv_plus_epilogue_ms"), r.get("cudnn_fused_ms")
        ratio = f"{c / a:.2f}" if a and c else "-"
        print(
            f"| {r['variant']} | {r['batch']} | {r['input']} | {r['timed']} of {r['convs']} ({r['shapes']} shapes) | {r['fused']} | {fmt(a)} | "
            f"{fmt(r.get('cudnn_conv_plus_epilogue_ms'))} | {fmt(c)} | {ratio} | {fmt(r['max_err'])} | {r['build_s']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
