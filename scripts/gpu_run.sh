#!/usr/bin/env bash
# scripts/gpu_run.sh — everything that needs the GPU, in one go, on a machine with the NVIDIA
# driver, python3 + torch (CUDA) and no Rust: start-up (cold/warm JIT cache), parity against
# PyTorch + ultralytics, `yolo-edge bench` beside PyTorch's bench_torch.py, planner checks.
#
# Usage (from the repo root). What it needs travels in git-ignored folders, named by env vars:
#   $DIST/yolo-edge-cuda-sm90-cudnn.xz  (scripts/build-cuda.sh 90 --cudnn; DIST defaults to dist;
#                                        BIN_XZ=yolo-edge-cuda-sm90.xz for the build without cuDNN)
#   $DEV/yolov9t-ball.pt $DEV/horses.jpg $DEV/volleyball-court.jpg $DEV/bench_torch.py $DEV/bench_compile.py (DEV=.dev)
#   $WHL/ultralytics-8.4.190-*.whl $WHL/ultralytics_thop-2.2.3-*.whl                     (WHL=.whl)
#   STEPS="info startup parity seeded rectparity rectsquare jpegcheck e2efeed graphcheck plansoak ladder compile algos shapes bench beforeafter torch e2e torchprofile graphab wsab upab algoab plan sweep soak arenaab interleave ballast profile cameras agentjpeg fusion" OUT=/some/dir scripts/gpu_run.sh
# Two at once on a 2-GPU machine: CUDA_VISIBLE_DEVICES=0 OUT=a ... & CUDA_VISIBLE_DEVICES=1 OUT=b ... &
# (each instance unpacks its own binary under its OUT).
# The device tool copies the session's checkout, so stage these (and this script) under an
# ignored folder of that checkout, e.g. .dev/gpu-run/{dist,dev,whl}, and carry that folder.
# Env: VARIANTS (t,s,m,c,e) BATCHES (1,8,32,64,128,256) E2E_BATCHES (1,8,32,64,128,256: issue 3's Proof) E2E_ITERS (10) E2E_TIMEOUT (per variant, 150)
#      E2E_MODELS ("$DEV/yolov9t-ball.pt random:yolov9c") E2E_DECODERS ("cpu nvjpeg") E2E_JPEG_DECODERS ("1", nvJPEG decoders at once,
#      one run per value): step e2efeed; NVJPEG_DIR (/usr/local/cuda/lib64)
#      PLAN_LIMITS (4GiB,8GiB,16GiB) PLAN_VARIANTS (t,s,m,c,e) SOAK (passes per plan, 1000)
#      SOAK_SECONDS (cap per plan, 20) PROFILE_VARIANTS (t,c) PROFILE_BATCHES (1,32)
#      SOAK_CASES ("t:4GiB s:8GiB ...", the long soaks of step soak) LONG_SOAK_SECONDS (cap each, 590)
#      SWEEP_CASES ("t:4GiB e:16GiB:500 ...", instead of PLAN_VARIANTS x PLAN_LIMITS; :S caps that soak at S s) SWEEP_REPEATS (readings per batch under 1 GiB, 1) DEADLINE (epoch s: sweep
#      soaks are cut to end by then) AB_SOAKS ("t:4GiB c:4GiB", the short soaks of upab/algoab)
#      ARENA_CASES ("e:16GiB m:8GiB"; empty: no sweeps) ARENA_AB_VARIANTS (t,e) ARENA_AB_BATCHES (8,64,256)
#      INTERLEAVE_ROUNDS (4) INTERLEAVE_VARIANTS (t,e) INTERLEAVE_BATCHES (2,8,64) INTERLEAVE_ITERS (20)
#      BEFORE_XZ ROUNDS (3) BA_VARIANTS (t,c) BA_BATCHES (1,128) BA_ITERS (20) BA_FLAGS (more bench flags, both binaries): step beforeafter
#      PARITY_BATCHES ("2 1") PARITY_CONF (0.01) PARITY_FLAGS (more detect flags, e.g. --cudnn-fusion on): step parity
#      CAM_CLIP (h264-1920x1080-30s.mp4, under $DEV) CAM_STREAMS (1,4,8,16) CAM_MODES (fast,realtime)
#      CAM_SECONDS (15) CAM_EXTRA (more bench_streams.py flags): step cameras (a binary built with --gstreamer)
#      PLANSOAK_CASES ("t:4GiB t:16GiB c:4GiB c:16GiB") PLANSOAK_SECONDS (6): step plansoak
#      AGENTJPEG_DECODERS (cpu,nvjpeg) AGENTJPEG_COUNT (3000) AGENTJPEG_MAX_BATCH (64): step agentjpeg
#      (scripts/bench_folder.py; mosquitto from $DEV/gst.tar.xz or the machine)
#      RECT_MODELS (real,t,c) RECT_TIMEOUT (420): step rectparity
#      ALGO_VARIANTS (t) ALGO_ROUNDS (4) ALGO_BATCHES (1,2,4,8,16,32,64): step algos
#      SHAPE_CASES ("t:4GiB c:4GiB t:16GiB") SHAPES (640x384,640x480,480x640,640x640) SHAPE_TIMEOUT (240): step shapes
#      LADDER_BATCHES (1,2,4,...,256) LADDER_ITERS (1000) LADDER_EAGER_VARIANTS (t,c; none: no eager run of ours) COMPILE_JSON (an earlier
#      torch_compile.json for the table): step ladder; COMPILE_VARIANTS (t,s,c) COMPILE_BATCHES (1,8,64): step compile
#      RS_VARIANTS (t,c) RS_BATCHES (1,64) RS_INPUT (640x384, a 1280x720 frame's rectangle): step rectsquare
#      FUSION_VARIANTS (t,c) FUSION_BATCHES (1,8) FUSION_INPUT (384x640) FUSION_TIMEOUT (420): step fusion
#      (scripts/probe_conv_fusion.py; carried: $DEV/nvidia_cudnn_frontend-1.14.0-cp312-*.whl)
#      STOP_AT (epoch s): steps not started by then are skipped (a step already running keeps its own timeout)
# Results: $OUT/summary.md, $OUT/bench.png, $OUT/all.tar.gz (every log, CSV and JSON; also written when
# the script is stopped by SIGTERM or SIGINT, e.g. by an outer `timeout`, with whatever the steps left).
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
DIST="${DIST:-dist}"; DEV="${DEV:-.dev}"; WHL="${WHL:-.whl}"
OUT="${OUT:-$PWD/gpu-out}"; mkdir -p "$OUT"
W="$OUT/work"; mkdir -p "$W"
STEPS="${STEPS:-info startup parity bench torch e2e plan}"
VARIANTS="${VARIANTS:-t,s,m,c,e}"
BATCHES="${BATCHES:-1,8,32,64,128,256}"
E2E_BATCHES="${E2E_BATCHES:-1,8,32,64,128,256}"
PLAN_LIMITS="${PLAN_LIMITS:-4GiB,8GiB,16GiB}"
PLAN_VARIANTS="${PLAN_VARIANTS:-t,s,m,c,e}"
SUM="$OUT/summary.md"; : > "$SUM"
say() { echo "$*" | tee -a "$SUM"; }
has() {
  [[ " $STEPS " == *" $1 "* ]] || return 1
  if [ -n "${STOP_AT:-}" ] && [ "$(date +%s)" -ge "$STOP_AT" ]; then
    say "step $1 skipped: past STOP_AT"
    return 1
  fi
}
# every log, CSV and JSON the steps left, without the binaries, site-packages and arrays
pack() { (cd "$OUT" && tar czf all.tar.gz --exclude="work/yolo-edge*" --exclude=work/site --exclude=work/fusion-site --exclude="*.npy" work); }
trap 'say "stopped by a signal"; pack; exit 143' TERM INT
# ab_bench TAG BATCHES FLAG...: model-only bench of AB_VARIANTS with those tuning flags
# (yolo-edge bench --help), appended to the summary under "### TAG (flags)"
ab_bench() {
  local tag=$1 batches=$2; shift 2
  timeout "${AB_TIMEOUT:-150}" "$BIN" bench --device cuda:0 --variants "${AB_VARIANTS:-t,c}" --dtype f16 --batches "$batches" --mode model --warmup 2 --iters 5 --out "$W/$tag" "$@" > "$W/$tag.md" 2> "$W/$tag.log"
  echo "### $tag ($*)" >> "$SUM"; cat "$W/$tag.md" >> "$SUM"
}

BIN="$W/yolo-edge"
xz -dc "$DIST/${BIN_XZ:-yolo-edge-cuda-sm90-cudnn.xz}" > "$BIN" && chmod +x "$BIN"
SP=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
# libnvjpeg (jpegcheck, e2efeed with nvjpeg): the CUDA toolkit's, or NVJPEG_DIR's
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:${NVJPEG_DIR:-/usr/local/cuda/lib64}:${LD_LIBRARY_PATH:-}"
export RUST_LIB_BACKTRACE=0
if has parity || has seeded || has rectparity || has torch || has torchprofile || has ballast || has ladder || has compile || has fusion; then
  mkdir -p "$W/site" && python3 -m pip install -q --no-index --no-deps --target "$W/site" "$WHL"/*.whl >/dev/null 2>&1
fi
export PYTHONPATH="$W/site"
export YOLO_CONFIG_DIR=/tmp/ultra-cfg

if has info; then
  say "## machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee -a "$SUM"
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())' 2>&1 | tee -a "$SUM"
  "$BIN" --version | tee -a "$SUM"
  ldd "$BIN" | grep -E "cuda|cublas|curand|cudnn" | tee -a "$SUM"
fi

if has startup; then
  say "## startup (yolov9t random, f16, batch 1): cold = empty CUDA_CACHE_PATH, warm = same cache again"
  rm -rf /tmp/cc && mkdir -p /tmp/cc
  for run in cold warm; do
    CUDA_CACHE_PATH=/tmp/cc timeout 120 "$BIN" bench --device cuda:0 --variants t --dtype f16 --batches 1 --warmup 1 --iters 3 --out "$W/startup-$run" > "$W/startup-$run.log" 2>&1
    grep -E "first forward" "$W/startup-$run.log" | sed "s/^/$run: /" | tee -a "$SUM"
  done
  du -sh /tmp/cc | tee -a "$SUM"
fi

if has parity; then
  # batch 2 runs the eager pass; batch 1 replays the captured CUDA graph (as the agent does)
  for pb in ${PARITY_BATCHES:-2 1}; do
  say "## parity (yolov9t-ball.pt, horses + volleyball-court, batch $pb)"
  for i in horses volleyball-court; do "$BIN" letterbox ""$DEV"/$i.jpg" --imgsz 640 --out "$W/lb-$i.npy" 2>>"$W/parity.log"; done
  for dt in f32 f16; do
    timeout 120 "$BIN" detect --model "$DEV"/yolov9t-ball.pt --device cuda:0 --dtype $dt --fit square --batch $pb --conf "${PARITY_CONF:-0.01}" ${PARITY_FLAGS:-} --raw-out "$W/raw-$dt-b$pb.npy" --json "$W/dets-$dt-b$pb.jsonl" "$DEV"/horses.jpg "$DEV"/volleyball-court.jpg >>"$W/parity.log" 2>&1
  done
  timeout 300 python3 "$HERE/gpu_parity.py" --lb "$W/lb-horses.npy" "$W/lb-volleyball-court.npy" --images "$DEV"/horses.jpg "$DEV"/volleyball-court.jpg \
    --ours-f32 "$W/raw-f32-b$pb.npy" --ours-f16 "$W/raw-f16-b$pb.npy" --dets-f16 "$W/dets-f16-b$pb.jsonl" --model "$DEV"/yolov9t-ball.pt --conf "${PARITY_CONF:-0.01}" --out "$W/parity-b$pb.json" 2>>"$W/parity.log" | tee -a "$SUM"
  tail -3 "$W/parity.log"
  done
fi

if has bench; then
  say "## yolo-edge bench, model only, f16"
  timeout "${BENCH_TIMEOUT:-240}" "$BIN" bench --device cuda:0 --variants "$VARIANTS" --dtype f16 --batches "$BATCHES" --mode model --warmup 2 --iters 10 --out "$W/bench-model" > "$W/bench-model.md" 2> "$W/bench-model.log"
  echo "rc=$?" >> "$W/bench-model.log"
  cat "$W/bench-model.md" >> "$SUM"; grep "first forward" "$W/bench-model.log" >> "$SUM"
  cp "$W/bench-model/bench.png" "$OUT/bench.png" 2>/dev/null
  cp "$W/bench-model/bench.csv" "$OUT/bench.csv" 2>/dev/null
fi

if has e2e; then
  say "## yolo-edge bench, end to end (JPEG files in, detections out), f16"
  # one run per variant, so that a deadline keeps the variants already done
  for v in ${VARIANTS//,/ }; do
    timeout "${E2E_TIMEOUT:-150}" "$BIN" bench --device cuda:0 --variants "$v" --dtype f16 --batches "$E2E_BATCHES" --mode e2e --images "$DEV"/horses.jpg,"$DEV"/volleyball-court.jpg --iters "${E2E_ITERS:-10}" --out "$W/bench-e2e-$v" > "$W/bench-e2e-$v.md" 2> "$W/bench-e2e-$v.log"
    echo "rc=$?" >> "$W/bench-e2e-$v.log"
    cat "$W/bench-e2e-$v.md" >> "$SUM"
  done
fi

if has jpegcheck; then
  say "## nvJPEG and the device letterbox against the host's decoder and letterbox (yolo-edge jpeg-selfcheck)"
  timeout 120 "$BIN" jpeg-selfcheck --device cuda:0 "$DEV"/horses.jpg "$DEV"/volleyball-court.jpg > "$W/jpegcheck.md" 2> "$W/jpegcheck.log"
  echo "rc=$?" | tee -a "$W/jpegcheck.log" >> "$SUM"
  cat "$W/jpegcheck.md" >> "$SUM"; tail -5 "$W/jpegcheck.log" >> "$SUM"
  say "### detect with the host decoder and with nvJPEG (yolov9t-ball.pt, f16 and f32, conf 0.01; 6 pictures of two shapes in 3 batches of 2, decoded ahead by 2 threads): detections paired by IoU"
  H="$DEV"/horses.jpg; C="$DEV"/volleyball-court.jpg
  for dt in f16 f32; do
    for dec in cpu nvjpeg; do
      timeout 120 "$BIN" detect --model "$DEV"/yolov9t-ball.pt --device cuda:0 --dtype $dt --jpeg-decoder $dec --jpeg-decoders 2 --conf 0.01 --batch 2 \
        --json "$W/jd-$dec-$dt.jsonl" "$H" "$C" "$C" "$H" "$H" "$C" >> "$W/jpegcheck.log" 2>&1
      echo "detect $dt $dec rc=$?" | tee -a "$SUM"
    done
    grep -ci "graph.*failed\|eagerly" "$W/jpegcheck.log" | sed 's/^/graph warnings so far: /' | tee -a "$SUM"
    python3 - "$W/jd-cpu-$dt.jsonl" "$W/jd-nvjpeg-$dt.jsonl" "$dt" <<'PY' 2>&1 | tee -a "$SUM"
import json, sys
def load(p): return [json.loads(l) for l in open(p)]
def iou(a, b):
    ix = max(0, min(a[2], b[2]) - max(a[0], b[0])); iy = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    u = (a[2]-a[0])*(a[3]-a[1]) + (b[2]-b[0])*(b[3]-b[1]) - ix*iy
    return ix*iy/u if u > 0 else 0
cs, ns = load(sys.argv[1]), load(sys.argv[2])
if len(cs) != len(ns) or any(c["image"] != n["image"] for c, n in zip(cs, ns)):
    print(f"{sys.argv[3]}: RECORDS DIFFER: cpu {[c['image'] for c in cs]} nvjpeg {[n['image'] for n in ns]}")
seen = {}
for n in ns:
    seen.setdefault(n["image"], []).append(json.dumps(n.get("detections", []), sort_keys=True))
print(f"{sys.argv[3]}: nvjpeg, the same picture in different batches gives the same detections: "
      f"{all(len(set(v)) == 1 for v in seen.values())} ({len(ns)} records)")
for c, n in zip(cs, ns):
    dc, dn = c.get("detections", []), n.get("detections", [])
    box = lambda d: d["box"] if isinstance(d["box"], list) else [d["box"][k] for k in ("x1", "y1", "x2", "y2")]
    ious, dconf = [], []
    for d in dc:
        best = max(dn, key=lambda e: iou(box(d), box(e)) if e["class_id"] == d["class_id"] else -1, default=None)
        if best is not None:
            ious.append(iou(box(d), box(best))); dconf.append(abs(d["confidence"] - best["confidence"]))
    top = [round(d["confidence"], 3) for d in dc[:3]], [round(d["confidence"], 3) for d in dn[:3]]
    print(f"{sys.argv[3]} {c['image'].split('/')[-1]}: cpu {len(dc)} boxes, nvjpeg {len(dn)}; min IoU {min(ious, default=1):.4f}, "
          f"max |conf diff| {max(dconf, default=0):.4f}; top confidences {top}")
PY
  done
fi

if has e2efeed; then
  say "## end to end through the decode feed: 1080p JPEG files in (volleyball-court.jpg, rect 640x384), detections out, f16, $(nproc) cores; model-only at 640x384 beside it"
  # E2E_MODELS: checkpoints or random:yolov9X; the real checkpoint finds a few objects, random
  # weights make every anchor a candidate (NMS-heavy). E2E_DECODERS: cpu, nvjpeg
  # the first decoder's rows carry the model-only figures of the same run
  first_dec=""
  for dec in ${E2E_DECODERS:-cpu nvjpeg}; do
    [ -z "$first_dec" ] && first_dec=$dec
    for m in ${E2E_MODELS:-"$DEV/yolov9t-ball.pt" random:yolov9c}; do
     # E2E_JPEG_DECODERS: nvJPEG decoders at once (bench --jpeg-decoders), one run each
     for lanes in ${E2E_JPEG_DECODERS:-1}; do
      tag=$(basename "${m#random:}" .pt)-$dec; [ "$dec" = nvjpeg ] && tag=$tag-x$lanes
      lanes_first=${E2E_JPEG_DECODERS:-1}; lanes_first=${lanes_first%% *}
      modes=e2e; [ "$dec" = "$first_dec" ] && [ "$lanes" = "$lanes_first" ] && modes=model,e2e
      say "### $tag"
      timeout "${E2E_TIMEOUT:-150}" "$BIN" bench --device cuda:0 --model "$m" --dtype f16 --batches "$E2E_BATCHES" --mode $modes --input 640x384 \
        --jpeg-decoder "$dec" --jpeg-decoders "$lanes" --images "$DEV"/volleyball-court.jpg --iters "${E2E_ITERS:-10}" --out "$W/e2efeed-$tag" > "$W/e2efeed-$tag.md" 2> "$W/e2efeed-$tag.log"
      echo "rc=$?" >> "$W/e2efeed-$tag.log"
      cat "$W/e2efeed-$tag.md" >> "$SUM"
      grep -E "nvJPEG|warning|error" "$W/e2efeed-$tag.log" | head -12 >> "$SUM"
      [ "$dec" = nvjpeg ] || break
     done
    done
  done
fi

if has graphcheck; then
  say "## CUDA graphs against eager passes (yolov9t-ball.pt, square, 3 pictures): raw outputs, max |diff|"
  # --batch 4 with 3 pictures: one graph captured at 4, the third row padding; --batch 1: three
  # replays of the batch-1 graph; eager: --cuda-graphs off
  for dt in f32 f16; do
    for run in "eager 3 off" "pad4 4 on" "b1 1 on"; do
      read -r tag b g <<<"$run"
      timeout 120 "$BIN" detect --model "$DEV"/yolov9t-ball.pt --device cuda:0 --dtype $dt --fit square --batch "$b" --cuda-graphs "$g" --conf 0.01 \
        --raw-out "$W/gc-$tag-$dt.npy" "$DEV"/horses.jpg "$DEV"/volleyball-court.jpg "$DEV"/horses.jpg >>"$W/graphcheck.log" 2>&1
    done
    python3 - "$W" "$dt" <<'PY' 2>&1 | tee -a "$SUM"
import sys, numpy as np
w, dt = sys.argv[1:]
e = np.load(f"{w}/gc-eager-{dt}.npy")
for tag in ("pad4", "b1"):
    g = np.load(f"{w}/gc-{tag}-{dt}.npy")
    print(f"{dt} {tag}: shape {g.shape} vs {e.shape}, max |graph - eager| = {np.abs(g.astype(np.float64) - e).max():.3g}")
PY
  done
  say "## CUDA graphs on two input shapes (rect detect, batch 2, horses + court twice): the second graph captured while the first holds the region, then both replayed, against eager"
  for g in on off; do
    RUST_LOG=info timeout 100 "$BIN" detect --model "$DEV"/yolov9t-ball.pt --device cuda:0 --dtype f16 --batch 2 --conf 0.01 --cuda-graphs $g --json "$W/rect-$g.jsonl" \
      "$DEV"/horses.jpg "$DEV"/volleyball-court.jpg "$DEV"/horses.jpg "$DEV"/volleyball-court.jpg > "$W/rect-$g.log" 2>&1
  done
  python3 - "$W" <<'PY' 2>&1 | tee -a "$SUM"
import json, sys
w = sys.argv[1]
a = [json.loads(l) for l in open(f"{w}/rect-on.jsonl")]; b = [json.loads(l) for l in open(f"{w}/rect-off.jsonl")]
worst, n, same = 0.0, 0, len(a) == len(b)
for x, y in zip(a, b):
    same &= len(x["detections"]) == len(y["detections"])
    for p, q in zip(x["detections"], y["detections"]):
        same &= p["class_id"] == q["class_id"]
        worst = max(worst, abs(p["confidence"] - q["confidence"]), *[abs(u - v) for u, v in zip(p["box"], q["box"])])
        n += 1
print(f"rect detect, graphs against eager: {len(a)} pictures, {n} boxes, same counts and classes: {same}, max |conf or box diff| {worst:.3g}")
PY
  echo "graphs captured: $(grep -c captured "$W/rect-on.log")" | tee -a "$SUM"
fi

if has plansoak; then
  say "## planner prediction against a soak of the agent's path with CUDA graphs (plan --soak)"
  for c in ${PLANSOAK_CASES:-t:4GiB t:16GiB c:4GiB c:16GiB}; do
    v=${c%%:*}; lim=${c#*:}
    timeout 120 "$BIN" plan --model random:yolov9$v --device cuda:0 --dtype f16 --memory-limit "$lim" --soak 300 --soak-seconds "${PLANSOAK_SECONDS:-6}" --json > "$W/plansoak-$v-$lim.json" 2> "$W/plansoak-$v-$lim.log"
    python3 - "$W/plansoak-$v-$lim.json" "$v" "$lim" <<'PY' 2>&1 | tail -1 | tee -a "$SUM"
import json, sys
d = json.load(open(sys.argv[1])); p = d["plan"]; k = d["soak"]; M = 2**20
print(f"{sys.argv[2]} {sys.argv[3]}: batch {p['batch']}, budget {p['budget']['bytes']/M:.0f} MiB, predicted {p['predicted_peak']/M:.0f}, "
      f"soak peak {k['peak']/M:.0f} ({k['peak']/p['predicted_peak']:.3f}x), {k['oom']} of {k['passes']} passes out of memory")
PY
  done
fi

if has ladder; then
  LB="${LADDER_BATCHES:-1,2,4,8,16,32,64,128,256}"
  say "## yolo-edge bench f16 model only, CUDA graphs for every batch (default) and eager (--cuda-graphs off), beside PyTorch eager (both layouts)"
  timeout "${LADDER_TIMEOUT:-240}" "$BIN" bench --device cuda:0 --variants "$VARIANTS" --dtype f16 --batches "$LB" --mode model --warmup 3 --iters "${LADDER_ITERS:-1000}" --out "$W/ladder-graphs" > "$W/ladder-graphs.md" 2> "$W/ladder-graphs.log"
  echo "rc=$?" >> "$W/ladder-graphs.log"
  if [ "${LADDER_EAGER_VARIANTS:-t,c}" != none ]; then
    timeout "${LADDER_TIMEOUT:-240}" "$BIN" bench --device cuda:0 --variants "${LADDER_EAGER_VARIANTS:-t,c}" --dtype f16 --batches "$LB" --mode model --warmup 3 --iters 100 --cuda-graphs off --out "$W/ladder-eager" > "$W/ladder-eager.md" 2> "$W/ladder-eager.log"
    echo "rc=$?" >> "$W/ladder-eager.log"
  fi
  VARIANTS="$VARIANTS" BATCHES="$LB" MODES=fp16,fp16cl OUT="$W" timeout "${TORCH_TIMEOUT:-240}" python3 "$DEV"/bench_torch.py > "$W/torch.log" 2>&1
  echo "rc=$?" >> "$W/torch.log"
  # bench_torch.py writes its JSON at the end; cut short, its rows are the JSON lines it printed
  [ -f "$W/torch_bench.json" ] || python3 -c 'import json, sys; print(json.dumps([json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]))' \
    "$W/torch.log" > "$W/torch_bench.json"
  python3 "$HERE/bench_compare.py" --ours "$W/ladder-graphs/bench.json" --eager "$W/ladder-eager/bench.json" --torch "$W/torch_bench.json" \
    ${COMPILE_JSON:+--compile "$COMPILE_JSON"} 2>&1 | tee -a "$SUM"
  cp "$W/torch_bench.json" "$W/ladder-graphs/bench.json" "$OUT/" 2>/dev/null
fi

if has compile; then
  say "## torch.compile (reduce-overhead: CUDA graphs), channels-last f16"
  VARIANTS="${COMPILE_VARIANTS:-t,s,c}" BATCHES="${COMPILE_BATCHES:-1,8,64}" OUT="$W" timeout "${COMPILE_TIMEOUT:-420}" python3 "$DEV"/bench_compile.py > "$W/compile.log" 2>&1
  echo "rc=$?" >> "$W/compile.log"
  cat "$W/torch_compile.json" >> "$SUM" 2>/dev/null; echo >> "$SUM"
  cp "$W/torch_compile.json" "$OUT/" 2>/dev/null
fi

if has graphab; then
  say "## A/B, same binary: batch 1 eager (--cuda-graphs off) -> replayed as one captured CUDA graph (default)"
  AB_VARIANTS="${GRAPH_VARIANTS:-t,s,m,c,e}" ab_bench graph-off "${GRAPH_BATCHES:-1}" --cuda-graphs off
  AB_VARIANTS="${GRAPH_VARIANTS:-t,s,m,c,e}" ab_bench graph-on "${GRAPH_BATCHES:-1}" --cuda-graphs on
fi

if has wsab; then
  say "## A/B: workspace offered to cuDNN's algorithm search = max(--cudnn-workspace-min, --cudnn-workspace-scale x the convolution's input + output bytes)"
  for c in ${WS_CASES:-256:0 256:1 256:6}; do
    IFS=: read -r mib sc <<<"$c"
    ab_bench "ws-$mib-$sc" "${WS_BATCHES:-32,128,256}" --cudnn-workspace-min "${mib}MiB" --cudnn-workspace-scale "$sc"
  done
fi

# short soaks (8 s) of AB_SOAKS cases through the agent's path with tuning flags, one line each
soak_ab() {
  local tag=$1; shift
  for c in ${AB_SOAKS:-t:4GiB c:4GiB}; do
    local v=${c%%:*} lim=${c#*:}
    timeout 120 "$BIN" plan --model random:yolov9$v --device cuda:0 --dtype f16 --memory-limit $lim --soak 1000 --soak-seconds 8 --json "$@" > "$W/$tag-soak-$v.json" 2> "$W/$tag-soak-$v.log"
    python3 - "$W/$tag-soak-$v.json" "$tag ($*)" "$v" "$lim" <<'PY' 2>&1 | tee -a "$SUM"
import json, sys
d = json.load(open(sys.argv[1])); k = d["soak"]; g = k["stages"]
print(f"{sys.argv[2]}: soak {sys.argv[3]} at {sys.argv[4]}: batch {k['batch']}, {k['passes']} batches in {k['seconds']:.1f} s = {k['batch']*k['passes']/k['seconds']:.0f} img/s, {k['oom']} OOM, peak {k['peak']/2**20:.0f} MiB; per batch: input {g['upload_ms']:.1f} ms, network {g['model_ms']:.1f} ms, candidates {g['candidates_ms']:.1f} ms")
PY
  done
}

if has upab; then
  say "## A/B: pictures copied to the staging buffer on 1 thread vs the default (--upload-threads)"
  soak_ab up-1 --upload-threads 1
  soak_ab up-default
fi

if has algoab; then
  say "## A/B: cuDNN algorithm = the fastest (--cudnn-algo-slack 0) vs the least workspace within 5 % of it (default)"
  for sl in 0 0.05; do ab_bench "slack-$sl" "${SLACK_BATCHES:-1,32,256}" --cudnn-algo-slack "$sl"; done
fi

if has torch; then
  say "## PyTorch bench_torch.py (same call)"
  VARIANTS="$VARIANTS" BATCHES="$BATCHES" MODES="${TORCH_MODES:-fp16,fp16cl}" OUT="$W" timeout "${TORCH_TIMEOUT:-200}" python3 "$DEV"/bench_torch.py > "$W/torch.log" 2>&1
  echo "rc=$?" >> "$W/torch.log"
  python3 - "$W/torch_bench.json" <<'PY' | tee -a "$SUM"
import json, sys
rows = json.load(open(sys.argv[1]))
print("| variant | mode | batch | ms | img/s | peak MiB | MiB/img |\n|---|---|---:|---:|---:|---:|---:|")
for r in rows:
    if r.get("oom"): print(f"| {r['variant']} | {r['mode']} | {r['batch']} | OOM | | | |"); continue
    print(f"| {r['variant']} | {r['mode']} | {r['batch']} | {r['ms']} | {r['ips']} | {r['peak_mib']} | {r['peak_mib']/r['batch']:.1f} |")
PY
  cp "$W/torch_bench.json" "$OUT/" 2>/dev/null
fi

if has plan; then
  say "## planner (f16, 640, memory_fraction 0.8, max_batch 256)"
  say "| variant | limit | budget MiB | fixed MiB | MiB/img | batch | predicted MiB | verified MiB | steps | ms |"
  say "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  for v in ${PLAN_VARIANTS//,/ }; do for lim in ${PLAN_LIMITS//,/ }; do
    timeout 120 "$BIN" plan --model random:yolov9$v --device cuda:0 --dtype f16 --memory-limit $lim --json > "$W/plan-$v-$lim.json" 2> "$W/plan-$v-$lim.log"
    python3 - "$W/plan-$v-$lim.json" "$v" "$lim" <<'PY' | tee -a "$SUM"
import json, sys
try:
    d = json.load(open(sys.argv[1])); p = d["plan"]; M = 2**20
    print(f"| {sys.argv[2]} | {sys.argv[3]} | {p['budget']['bytes']/M:.0f} | {p['fit']['fixed']/M:.0f} | {p['fit']['per_image']/M:.1f} | {p['batch']} | {p['predicted_peak']/M:.0f} | {p['verified_peak']/M:.0f} | {len(p['steps'])} | {d['plan_ms']:.0f} |")
except Exception as e:
    print(f"| {sys.argv[2]} | {sys.argv[3]} | failed: {e} |")
PY
  done; done
fi
if has seeded; then
  say "## seeded random weights, all variants: ours on the GPU vs ultralytics f64 on the CPU"
  YOLO_EDGE_BIN="$BIN" timeout "${SEEDED_TIMEOUT:-400}" python3 "$HERE/gpu_seeded_parity.py" --images "$DEV"/horses.jpg "$DEV"/volleyball-court.jpg \
    --variants "${SEEDED_VARIANTS:-t,s,m,c,e}" --work "$W/seeded" 2>"$W/seeded.log" | tee -a "$SUM"
  echo "rc=${PIPESTATUS[0]}" | tee -a "$SUM"
fi

if has rectparity; then
  say "## rect letterbox parity on the GPU: yolo-edge detect (cuda, f32 and f16) vs ultralytics predict on the same card"
  YOLO_EDGE_BIN="$BIN" YOLO_EDGE_FIXTURES="$DEV" timeout "${RECT_TIMEOUT:-420}" python3 "$HERE/gpu_rect_parity.py" --work "$W/rect" \
    --models "${RECT_MODELS:-real,t,c}" 2>"$W/rect.log" | tee -a "$SUM"
  echo "rc=${PIPESTATUS[0]}" | tee -a "$SUM"
fi

if has sweep; then
  say "## planner sweep + soak (f16, 640, fraction 0.8, max_batch 256): predicted vs measured at every batch up to the chosen one, the largest batch that fits, OOM count at the chosen batch"
  say "| variant | limit | budget MiB | chosen | largest fitting | chosen/largest | worst pred. error, every batch <= chosen | worst pred. error, batches >= chosen/4 | worst pred. error, batches <= chosen with peak >= 320 MiB | worst abs. error MiB, all batches <= chosen | soak passes | soak OOM | soak peak MiB | soak s | repeat spread, batches <= chosen with peak >= 320 MiB (SWEEP_REPEATS) |"
  say "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  cases="${SWEEP_CASES:-$(for v in ${PLAN_VARIANTS//,/ }; do for lim in ${PLAN_LIMITS//,/ }; do echo -n "$v:$lim "; done; done)}"
  for c in $cases; do
    # a case is variant:limit, or variant:limit:seconds to give its soak its own cap
    v=${c%%:*}; lim=${c#*:}; secs="${SOAK_SECONDS:-20}"
    if [[ "$lim" == *:* ]]; then secs=${lim#*:}; lim=${lim%%:*}; fi
    # with DEADLINE (epoch s), the soak is cut short rather than the case killed, and cases that
    # cannot start in time are skipped
    tmo="${SWEEP_TIMEOUT:-300}"
    [ $(( secs + 120 )) -gt "$tmo" ] && tmo=$(( secs + 120 ))
    if [ -n "${DEADLINE:-}" ]; then
      left=$(( DEADLINE - $(date +%s) ))
      if [ "$left" -lt 100 ]; then say "| $v | $lim | skipped: ${left} s left |"; continue; fi
      [ $(( left - 90 )) -lt "$secs" ] && secs=$(( left - 90 ))
      [ "$left" -lt "$tmo" ] && tmo=$left
    fi
    timeout "$tmo" "$BIN" plan --model random:yolov9$v --device cuda:0 --dtype f16 --memory-limit $lim --sweep --sweep-repeats "${SWEEP_REPEATS:-1}" --soak "${SOAK:-1000}" --soak-seconds "$secs" --json > "$W/sweep-$v-$lim.json" 2> "$W/sweep-$v-$lim.log"
    python3 - "$W/sweep-$v-$lim.json" "$v" "$lim" <<'PY' | tee -a "$SUM"
import json, sys
try:
    d = json.load(open(sys.argv[1])); p = d["plan"]; s = d["sweep"]; k = d["soak"]; M = 2**20
    pts = [q for q in s["points"] if q["batch"] <= p["batch"] and q.get("measured") is not None]
    rel = max([abs(q["error"]) for q in pts if q["measured"] >= 320 * M and q.get("error") is not None] or [0])
    ab = max([abs(q["predicted"] - q["measured"]) / M for q in pts] or [0])
    q4 = max([abs(q["error"]) for q in pts if 4 * q["batch"] >= p["batch"] and q.get("error") is not None] or [0])
    # the batch, and the ladder's rung its pass ran as where that differs
    al = max([(abs(q["error"]), f'{q["batch"]}' + (f' as {q["runs_as"]}' if q.get("runs_as", q["batch"]) != q["batch"] else ""))
              for q in pts if q.get("error") is not None] or [(0, "0")])
    sp = [(q["spread"], q["batch"]) for q in pts if q["measured"] >= 320 * M and q.get("spread") is not None]
    spread = f"{100*max(sp)[0]:.1f}% (b{max(sp)[1]})" if sp else "-"
    print(f"| {sys.argv[2]} | {sys.argv[3]} | {p['budget']['bytes']/M:.0f} | {p['batch']} | {s['largest_fitting']} | {s['chosen_share']:.2f} | {100*al[0]:.1f}% (b{al[1]}) | {100*q4:.1f}% | {100*rel:.1f}% | {ab:.0f} | {k['passes']} | {k['oom']} | {k['peak']/M:.0f}{'' if k['within_budget'] else ' (over budget)'} | {k['seconds']:.0f} | {spread} |")
except Exception as e:
    print(f"| {sys.argv[2]} | {sys.argv[3]} | failed: {e} |")
PY
  done
fi

if has algos; then
  say "## the same model in several processes: cuDNN's plans (plain implicit GEMM counted) and the speed they give (f16, model only, 640x640)"
  say "| variant | process | plain implicit GEMM plans | $(echo "${ALGO_BATCHES:-1,2,4,8,16,32,64}" | sed 's/,/ | /g') |"
  say "|---|---:|---:|$(echo "${ALGO_BATCHES:-1,2,4,8,16,32,64}" | sed 's/[0-9]*/---:/g; s/,/|/g')|"
  for v in ${ALGO_VARIANTS:-t}; do
    for r in $(seq 1 "${ALGO_ROUNDS:-4}"); do
      RUST_LOG=yolo_edge::backend=debug timeout "${ALGO_TIMEOUT:-100}" "$BIN" bench --device cuda:0 --variants "$v" --dtype f16 --batches "${ALGO_BATCHES:-1,2,4,8,16,32,64}" --mode model --warmup 3 --iters 300 --out "$W/algos-$v-$r" > "$W/algos-$v-$r.md" 2> "$W/algos-$v-$r.log"
      plain=$(grep 'cuDNN plan' "$W/algos-$v-$r.log" | grep -c 'ALGO_IMPLICIT_GEMM ')
      echo "| $v | $r | $plain | $(grep '^| yolov9' "$W/algos-$v-$r.md" | awk -F'|' '{printf "%s (%s ms) | ", $9, $8}')" | tee -a "$SUM"
    done
  done
fi

if has shapes; then
  say "## the batch per input shape (f16, imgsz 640, fraction 0.8): the plan at the square scaled by each shape's pixels, measured above the planned batch, and the taken batch measured against its prediction (plan --shapes)"
  say "| variant | limit | planned at 640x640 | shape | area | estimate | taken | tried | predicted MiB | measured MiB | error | MiB/picture (square: planned batch) | within budget |"
  say "|---|---|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---|"
  for c in ${SHAPE_CASES:-t:4GiB c:4GiB t:16GiB}; do
    v=${c%%:*}; lim=${c#*:}
    timeout "${SHAPE_TIMEOUT:-240}" "$BIN" plan --model random:yolov9$v --device cuda:0 --dtype f16 --memory-limit $lim --shapes "${SHAPES:-640x384,640x480,480x640,640x640}" --json > "$W/shapes-$v-$lim.json" 2> "$W/shapes-$v-$lim.log"
    python3 - "$W/shapes-$v-$lim.json" "$v" "$lim" <<'PY' | tee -a "$SUM"
import json, sys
try:
    d = json.load(open(sys.argv[1])); p = d["plan"]; M = 2**20
    sq = p["verified_peak"] / p["batch"] / M if p["batch"] else 0
    for r in d["shapes"]:
        e = r["estimate"]
        tried = ", ".join(f"{t['batch']}: {t['peak']/M:.0f}" if t["peak"] is not None else f"{t['batch']}: {t['error'][:40]}" for t in r["tried"]) or "-"
        err = f"{100*r['error']:+.1f}%" if r.get("error") is not None else "-"
        meas = f"{r['measured']/M:.0f}" if r.get("measured") is not None else "-"
        pp = f"{r['per_picture']/M:.1f} ({sq:.1f})" if r.get("per_picture") is not None else "-"
        print(f"| {sys.argv[2]} | {sys.argv[3]} | {p['batch']} | {e['width']}x{e['height']} | {e['area_ratio']:.2f} | {e['batch']} | {r['batch']} | {tried} | {e['predicted_peak']/M:.0f} | {meas} | {err} | {pp} | {r.get('within_budget')} |")
except Exception as e:
    print(f"| {sys.argv[2]} | {sys.argv[3]} | failed: {e} |")
PY
  done
fi

if has soak; then
  say "## long soaks at the planner's choice (f16, 640, fraction 0.8, max_batch 256, ballast: only the limit free)"
  say "| variant | limit | budget MiB | chosen | predicted MiB | verified MiB | batches | OOM | soak peak MiB | within budget | s | img/s | input / network / candidates ms per batch |"
  say "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|"
  for c in ${SOAK_CASES:-t:4GiB}; do
    v=${c%%:*}; lim=${c#*:}
    # with DEADLINE (epoch s), a soak is cut short to end in time, and one that cannot start is skipped
    secs="${LONG_SOAK_SECONDS:-590}"
    if [ -n "${DEADLINE:-}" ]; then
      left=$(( DEADLINE - $(date +%s) ))
      if [ "$left" -lt 60 ]; then say "| $v | $lim | skipped: ${left} s left |"; continue; fi
      [ $(( left - 40 )) -lt "$secs" ] && secs=$(( left - 40 ))
    fi
    timeout $(( secs + 60 )) "$BIN" plan --model random:yolov9$v --device cuda:0 --dtype f16 --memory-limit $lim --soak "${SOAK:-1000}" --soak-seconds "$secs" --json > "$W/soak-$v-$lim.json" 2> "$W/soak-$v-$lim.log"
    python3 - "$W/soak-$v-$lim.json" "$v" "$lim" <<'PY' | tee -a "$SUM"
import json, sys
try:
    d = json.load(open(sys.argv[1])); p = d["plan"]; k = d["soak"]; M = 2**20
    g = k["stages"]
    print(f"| {sys.argv[2]} | {sys.argv[3]} | {p['budget']['bytes']/M:.0f} | {p['batch']} | {p['predicted_peak']/M:.0f} | {p['verified_peak']/M:.0f} | {k['passes']} | {k['oom']} | {k['peak']/M:.0f} | {k['within_budget']} | {k['seconds']:.0f} | {k['batch']*k['passes']/k['seconds']:.0f} | {g['upload_ms']:.1f} / {g['model_ms']:.1f} / {g['candidates_ms']:.1f} |")
except Exception as e:
    print(f"| {sys.argv[2]} | {sys.argv[3]} | failed: {e} |")
PY
  done
fi

# sweep_line JSON LABEL: one summary line of a `plan --sweep --sweep-repeats K [--soak]` JSON
sweep_line() {
  python3 - "$1" "$2" <<'PY' | tee -a "$SUM"
import json, sys
M = 2**20
try:
    d = json.load(open(sys.argv[1])); p = d["plan"]
    pts = [q for q in d["sweep"]["points"] if q["batch"] <= p["batch"] and q.get("measured") is not None]
    worst = max([abs(q["error"]) for q in pts if q["measured"] >= 320 * M] or [0])
    sp = max([(q["spread"], q["batch"]) for q in pts if q.get("spread") is not None] or [(0, 0)])
    uf = p.get("used_fit")
    ratio = p["verified_peak"] / max(1.0, uf["fixed"] + uf["per_image"] * p["batch"]) if uf else float("nan")
    k = d.get("soak")
    soak = f", soak {k['passes']} batches {k['oom']} OOM peak {k['peak']/M:.0f} MiB" if k else ""
    print(f"{sys.argv[2]}: chosen {p['batch']} (verified {p['verified_peak']/M:.0f} MiB, {ratio:.2f}x the tensors' own peak), worst error (peaks >= 320 MiB) {100*worst:.1f}%, worst spread {100*sp[0]:.1f}% (b{sp[1]}), sweep max {d['sweep']['largest_fitting']}{soak}")
except Exception as e:
    print(f"{sys.argv[2]}: failed: {e}")
PY
}

if has arenaab; then
  # the activation arena (src/backend/arena.rs, --allocator arena) against the pool: the same
  # sweep with repeats and a short soak, then model-only throughput
  say "## A/B: pool (--allocator pool) vs activation arena (--allocator arena, the default): sweep repeats, 5 s soak"
  for r in pool arena; do
    for c in ${ARENA_CASES-e:16GiB m:8GiB}; do
      v=${c%%:*}; lim=${c#*:}
      timeout 300 "$BIN" plan --model random:yolov9$v --device cuda:0 --dtype f16 --memory-limit $lim --sweep --sweep-repeats 3 --soak 1000 --soak-seconds 5 --json --allocator "$r" > "$W/arena-$r-$v-$lim.json" 2> "$W/arena-$r-$v-$lim.log"
      sweep_line "$W/arena-$r-$v-$lim.json" "$r $v $lim"
    done
  done
  AB_VARIANTS=${ARENA_AB_VARIANTS:-t,e} ab_bench arena-off "${ARENA_AB_BATCHES:-8,64,256}" --allocator pool
  AB_VARIANTS=${ARENA_AB_VARIANTS:-t,e} ab_bench arena-on "${ARENA_AB_BATCHES:-8,64,256}" --allocator arena
fi

if has interleave; then
  # arena against pool at launch-bound batches, alternating processes: each process's latency is
  # its own median, and the spread between processes (cuDNN's per-process algorithm choice,
  # clocks) shows whether a difference between the two is more than that
  say "## interleaved A/B: pool vs arena, model-only f16, ${INTERLEAVE_ROUNDS:-4} alternating processes each (variants ${INTERLEAVE_VARIANTS:-t,e}, batches ${INTERLEAVE_BATCHES:-2,8,64}, ${INTERLEAVE_ITERS:-20} iterations)"
  for i in $(seq 1 "${INTERLEAVE_ROUNDS:-4}"); do
    for r in pool arena; do
      timeout 150 "$BIN" bench --device cuda:0 --variants "${INTERLEAVE_VARIANTS:-t,e}" --dtype f16 --batches "${INTERLEAVE_BATCHES:-2,8,64}" --mode model --warmup 3 --iters "${INTERLEAVE_ITERS:-20}" --out "$W/il-$r-$i" --allocator "$r" > "$W/il-$r-$i.md" 2> "$W/il-$r-$i.log"
    done
  done
  python3 - "$W" "${INTERLEAVE_ROUNDS:-4}" <<'PY' | tee -a "$SUM"
import csv, glob, statistics, sys, collections
w, n = sys.argv[1], int(sys.argv[2])
runs = collections.defaultdict(list)
for r in ("pool", "arena"):
    for i in range(1, n + 1):
        for f in glob.glob(f"{w}/il-{r}-{i}/*.csv"):
            for row in csv.DictReader(open(f)):
                if "latency_ms" in row and row.get("status") == "ok":
                    runs[(row["model"], int(row["batch"]), r)].append(float(row["latency_ms"]))
print("| model | batch | pool ms per process (median of each) | arena ms per process | pool median | arena median | arena / pool |")
print("|---|---:|---|---|---:|---:|---:|")
for (m, b) in sorted({(k[0], k[1]) for k in runs}, key=lambda x: (x[0], x[1])):
    p, a = runs.get((m, b, "pool"), []), runs.get((m, b, "arena"), [])
    if not p or not a:
        continue
    mp, ma = statistics.median(p), statistics.median(a)
    print(f"| {m} | {b} | {' '.join(f'{x:.2f}' for x in p)} | {' '.join(f'{x:.2f}' for x in a)} | {mp:.2f} | {ma:.2f} | {ma/mp:.3f} |")
PY
fi

if has beforeafter; then
  # two builds of the same code base, e.g. before and after a refactoring: BEFORE_XZ (in $DIST)
  # against the binary under test, alternating processes (ROUNDS each) so that drift and
  # process-to-process spread fall on both; the figure per build is the median of its rounds'
  # medians. Model only, FP16, BA_VARIANTS x BA_BATCHES.
  BEFORE="$W/yolo-edge-before"
  xz -dc "$DIST/${BEFORE_XZ:-yolo-edge-cuda-sm90-cudnn-before.xz}" > "$BEFORE" && chmod +x "$BEFORE"
  say "## before/after: $("$BEFORE" --version) (before) vs $("$BIN" --version) (after), ${ROUNDS:-3} alternating rounds each"
  for i in $(seq 1 "${ROUNDS:-3}"); do
    for side in before after; do
      b="$BIN"; [ "$side" = before ] && b="$BEFORE"
      timeout "${BA_TIMEOUT:-150}" "$b" bench --device cuda:0 --variants "${BA_VARIANTS:-t,c}" --dtype f16 --batches "${BA_BATCHES:-1,128}" --mode model --warmup 3 --iters "${BA_ITERS:-20}" ${BA_FLAGS:-} --out "$W/ba-$side-$i" > "$W/ba-$side-$i.md" 2> "$W/ba-$side-$i.log"
      echo "rc=$?" >> "$W/ba-$side-$i.log"
    done
  done
  python3 - "$W" "${ROUNDS:-3}" <<'PY' 2>&1 | tee -a "$SUM"
import json, statistics, sys
w, rounds = sys.argv[1], int(sys.argv[2])
runs = {}
for side in ("before", "after"):
    for i in range(1, rounds + 1):
        try:
            rows = json.load(open(f"{w}/ba-{side}-{i}/bench.json"))["rows"]
        except (OSError, ValueError) as e:
            print(f"{side} round {i}: no result ({e})"); continue
        for r in rows:
            if r.get("latency_ms") is not None:
                runs.setdefault((r["model"], r["batch"]), {}).setdefault(side, []).append((r["latency_ms"], r.get("peak_mib")))
print("| model | batch | before ms (rounds) | after ms (rounds) | after / before | before img/s | after img/s | peak MiB before / after |")
print("|---|---:|---|---|---:|---:|---:|---|")
for (m, b), d in sorted(runs.items()):
    bf, af = d.get("before", []), d.get("after", [])
    if not bf or not af: continue
    mb, ma = statistics.median(x[0] for x in bf), statistics.median(x[0] for x in af)
    fmt = lambda v: ", ".join(f"{x[0]:.2f}" for x in v)
    print(f"| {m} | {b} | {mb:.2f} ({fmt(bf)}) | {ma:.2f} ({fmt(af)}) | {ma/mb:.3f} | {b*1000/mb:.0f} | {b*1000/ma:.0f} | {bf[0][1]} / {af[0][1]} |")
PY
fi

if has ballast; then
  say "## ballast: plan with ~2 GiB free, squeeze mid-run, free again (yolov9t-ball.pt, f16, 640, batch auto)"
  timeout "${BALLAST_TIMEOUT:-420}" python3 "$HERE/gpu_ballast.py" --bin "$BIN" --model "$DEV"/yolov9t-ball.pt --images "$DEV"/horses.jpg "$DEV"/volleyball-court.jpg \
    --work "$W/ballast" 2>&1 | tee -a "$SUM" | tail -15
  echo "rc=${PIPESTATUS[0]}" | tee -a "$SUM"
  rm -rf "$W/ballast/in" "$W/ballast/in2" "$W/ballast/done2" "$W/ballast/spool"
fi

if has torchprofile; then
  say "## where PyTorch's time goes (torch.profiler, CUDA kernel time, ${TORCH_PROFILE_MODE:-fp16cl}, batch ${TORCH_PROFILE_BATCH:-256})"
  VARIANTS="${TORCH_PROFILE_VARIANTS:-t,e}" BATCH="${TORCH_PROFILE_BATCH:-256}" MODE="${TORCH_PROFILE_MODE:-fp16cl}" OUT="$W" timeout 200 python3 "$HERE/torch_profile.py" 2>"$W/torch_profile.log" | tee -a "$SUM"
  cp "$W/torch_profile.json" "$OUT/" 2>/dev/null
fi
if has rectsquare; then
  # model only, graphs on, the same batches at the rect input of a 16:9 frame and at the square
  say "## rect (${RS_INPUT:-640x384}) against square (640x640), model only, f16, graphs on: img/s and MiB per picture"
  for fit in square rect; do
    inp=(); [ "$fit" = rect ] && inp=(--input "${RS_INPUT:-640x384}")
    timeout "${RS_TIMEOUT:-150}" "$BIN" bench --device cuda:0 --variants "${RS_VARIANTS:-t,c}" --dtype f16 --batches "${RS_BATCHES:-1,64}" \
      --mode model --warmup 3 --iters 300 "${inp[@]}" --out "$W/rs-$fit" > "$W/rs-$fit.md" 2> "$W/rs-$fit.log"
    echo "rc=$?" >> "$W/rs-$fit.log"
  done
  python3 - "$W" <<'PY' 2>&1 | tee -a "$SUM"
import json, sys
w = sys.argv[1]
rows = {}
for fit in ("square", "rect"):
    try:
        for r in json.load(open(f"{w}/rs-{fit}/bench.json"))["rows"]:
            if r.get("images_per_s"):
                rows.setdefault((r["model"], r["batch"]), {})[fit] = (r["images_per_s"], (r.get("peak_mib") or 0) / r["batch"])
    except (OSError, ValueError) as e:
        print(f"{fit}: no result ({e})")
print("| model | batch | square img/s | rect img/s | rect / square | square MiB/img | rect MiB/img | rect / square |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for (m, b), d in sorted(rows.items()):
    if len(d) == 2:
        (sq, sm), (rc, rm) = d["square"], d["rect"]
        mem = f"{sm:.1f} | {rm:.1f} | {rm / sm:.2f}" if sm else "- | - | -"
        print(f"| {m} | {b} | {sq:.0f} | {rc:.0f} | {rc / sq:.2f} | {mem} |")
PY
fi

if has profile; then
  say "## where the time goes (bench --profile, f16, random weights)"
  timeout 240 "$BIN" bench --device cuda:0 --variants "${PROFILE_VARIANTS:-t,c}" --dtype f16 --batches "${PROFILE_BATCHES:-1,32}" --mode model --warmup 2 --iters 5 --profile --out "$W/profile" ${PROFILE_FLAGS:-} > "$W/profile.md" 2> "$W/profile.log"
  cp "$W/profile/profile.csv" "$OUT/profile.csv" 2>/dev/null
  python3 - "$W/profile/profile.csv" <<'PY' | tee -a "$SUM"
import csv, sys, collections, re
rows = list(csv.DictReader(open(sys.argv[1])))
def category(op):
    if op.endswith("(cuDNN fused)"):
        return "conv+bias+act (cuDNN fused)"
    if op.startswith("conv"):
        return "conv 1x1" if " 1x1/" in op else "conv 3x3 s2" if "/2 " in op else "conv grouped" if " g" in op.split("@")[0] else "conv kxk s1"
    return re.sub(r" c\d+ @\d+x\d+$", "", op)
groups = collections.OrderedDict()
per_op = collections.defaultdict(dict)
for r in rows:
    m, b, op = r["model"], int(r["batch"]), r["op"]
    groups.setdefault((m, b), collections.Counter())[category(op)] += float(r["ms"])
    per_op[m][(b, op)] = float(r["ms"])
for (m, b), c in groups.items():
    tot = sum(c.values())
    print(f"{m} batch {b}: {tot:.1f} ms ({1000 * tot / b:.0f} us/picture): " + ", ".join(f"{k} {v:.1f} ms ({100*v/tot:.0f}%)" for k, v in c.most_common()))
# per op, device time per picture at each batch: where a larger batch costs more per picture
for m, d in per_op.items():
    batches = sorted({b for b, _ in d})
    ops = {op for _, op in d}
    for lo, hi in zip(batches, batches[1:]):
        growth = sorted(((d.get((hi, op), 0) / hi - d.get((lo, op), 0) / lo) * 1000, op) for op in ops)
        print(f"{m}: ops that cost more per picture at batch {hi} than at {lo} (us/picture, {lo} -> {hi}):")
        for g, op in reversed(growth[-12:]):
            print(f"  {op:<48} {1000 * d.get((lo, op), 0) / lo:8.1f} -> {1000 * d.get((hi, op), 0) / hi:8.1f}  ({g:+.1f})")
        print(f"  sum of every op's change: {sum(g for g, _ in growth):+.1f} us/picture")
PY
fi

if has fusion; then
  say "## convolution + bias + SiLU fused by cuDNN's graph API against conv + epilogue kernel, as one CUDA graph per pass"
  mkdir -p "$W/fusion-site" && python3 -m pip install -q --no-index --no-deps --target "$W/fusion-site" "$DEV"/nvidia_cudnn_frontend-*.whl >/dev/null 2>&1
  PYTHONPATH="$W/fusion-site:$W/site" timeout "${FUSION_TIMEOUT:-420}" python3 "$HERE/probe_conv_fusion.py" --variants "${FUSION_VARIANTS:-t,c}" \
    --batches "${FUSION_BATCHES:-1,8}" --input "${FUSION_INPUT:-384x640}" --out "$W" > "$W/fusion.md" 2> "$W/fusion.log"
  echo "exit $?" >> "$W/fusion.log"
  cat "$W/fusion.md" >> "$SUM"; tail -5 "$W/fusion.log" | tee -a "$SUM"
fi

if has cameras; then
  say "## cameras: NVDEC through GStreamer, 1080p H.264 decode and streams end to end (docs/cameras.md)"
  # carried: $DEV/gst.tar.xz (scripts/gst-bundle.sh, with mosquitto in bin/), $DEV/$CAM_CLIP,
  # $DIST/video_bench.xz (examples/video_bench.rs, built beside the binary)
  G="$W/gst"; rm -rf "$G"; mkdir -p "$G"; tar -C "$G" -xJf "$DEV/gst.tar.xz" --strip-components=1
  # the bundle's plugins for every program of the step; its libraries only for ours (python3
  # keeps the machine's own)
  export GST_PLUGIN_SYSTEM_PATH="$G/plugins" GST_PLUGIN_SCANNER="$G/libexec/gst-plugin-scanner" GST_REGISTRY="$W/gst-registry.bin"
  gstenv() { env LD_LIBRARY_PATH="$G/lib:$LD_LIBRARY_PATH" "$@"; }
  CLIP="$DEV/${CAM_CLIP:-h264-1920x1080-30s.mp4}"
  say "NVDEC library: $(ls /usr/local/nvidia/lib64/libnvcuvid.so* /usr/lib/x86_64-linux-gnu/libnvcuvid.so* /usr/lib64/libnvcuvid.so* 2>/dev/null | tr '\n' ' ')"
  xz -dc "$DIST/video_bench.xz" > "$W/video_bench" && chmod +x "$W/video_bench"
  for d in nvdec auto; do
    gstenv timeout 120 "$W/video_bench" "$CLIP" 640 $d > "$W/video_bench-$d.txt" 2>&1; echo "rc=$?" >> "$W/video_bench-$d.txt"
    say "video_bench $d: $(tr '\n' ' ' < "$W/video_bench-$d.txt")"
  done
  # the bundle has no software decoder: without NVDEC the streams would have none
  if grep -q "(nvh264dec)" "$W/video_bench-nvdec.txt"; then
    python3 "$HERE/bench_streams.py" "$BIN" "$CLIP" --device cuda:0 --streams "${CAM_STREAMS:-1,4,8,16}" --modes "${CAM_MODES:-fast,realtime}" \
      --mosquitto "$G/bin/mosquitto" --ld-library-path "$G/lib:$LD_LIBRARY_PATH" --seconds "${CAM_SECONDS:-15}" --warmup "${CAM_WARMUP:-3}" \
      --startup 90 --out "$W/streams" ${CAM_EXTRA:-} 2> "$W/streams.log" | tee -a "$SUM"
    grep -h "arena created" "$W"/streams/*/agent.log | sed 's/\x1b\[[0-9;]*m//g' | head -3 | tee -a "$SUM"
    tail -5 "$W/streams.log" >> "$SUM"
    cp "$W/streams/results.json" "$OUT/streams.json" 2>/dev/null
  else
    say "no NVDEC decoder: the streams were not run"
  fi
fi

if has agentjpeg; then
  say "## agent hot folder, 1080p JPEGs: the host's decode pool against nvJPEG (\`[device] jpeg_decoder\`)"
  # the broker: the GStreamer bundle's (scripts/gst-bundle.sh --with-mosquitto) or the machine's
  MQ=""
  if [ -f "$DEV/gst.tar.xz" ]; then
    G="$W/gst-mq"; mkdir -p "$G"; tar -C "$G" -xJf "$DEV/gst.tar.xz" --strip-components=1
    MQ="env LD_LIBRARY_PATH=$G/lib:$LD_LIBRARY_PATH $G/bin/mosquitto"
    printf '#!/bin/sh\nexec %s "$@"\n' "$MQ" > "$W/mosquitto"; chmod +x "$W/mosquitto"; MQ="$W/mosquitto"
  elif command -v mosquitto >/dev/null; then
    MQ=mosquitto
  fi
  if [ -n "$MQ" ]; then
    timeout "${AGENTJPEG_TIMEOUT:-400}" python3 "$HERE/bench_folder.py" "$BIN" "$DEV/volleyball-court.jpg" --device cuda:0 \
      --model "$DEV/yolov9t-ball.pt" --decoders "${AGENTJPEG_DECODERS:-cpu,nvjpeg}" --count "${AGENTJPEG_COUNT:-3000}" \
      --max-batch "${AGENTJPEG_MAX_BATCH:-64}" --mosquitto "$MQ" --out "$W/agentjpeg" 2> "$W/agentjpeg.log" | tee -a "$SUM"
    tail -3 "$W/agentjpeg.log" >> "$SUM"
  else
    say "no mosquitto (stage \$DEV/gst.tar.xz from scripts/gst-bundle.sh --with-mosquitto): not run"
  fi
fi

pack && rm -rf "$W"
echo; cat "$SUM" | tail -60
