#!/usr/bin/env bash
# scripts/release.sh — the release artifacts, one stripped binary each, with SHA256SUMS and a
# manifest.json (artifact, target, features, compute capability, size, sha256, the shared
# libraries the binary needs at run time, commit, toolchain), in dist/release-<version>-<commit>/.
#
# Usage:  scripts/release.sh [ARTIFACT ...]        (default: every artifact)
#   x86_64-cpu               CPU build, folders and MQTT as sources (needs glibc only)
#   x86_64-cpu-gst           CPU build with cameras and video (needs GStreamer 1.22+)
#   x86_64-cuda-sm80|86|89|90   CUDA 13 + cuDNN 9 for that compute capability (build-cuda.sh)
#   x86_64-cuda-sm90-gst     the same for sm_90, with cameras and video
#   aarch64-cpu              CPU build for Jetson-class boards (scripts/aarch64.sh setup first)
#   aarch64-cuda-sm87        CUDA 13 for Jetson Orin on JetPack 7.2 (build-cuda.sh 87 --aarch64)
#
# A CUDA binary serves one compute capability: candle and this crate compile their kernels to PTX
# for the architecture given at build time, which the driver only JIT-compiles for that GPU family,
# so there is one artifact per capability rather than one for all. JetPack 6 (CUDA 12.6) boards
# build on the board (docs/jetson.md). Each CUDA build takes 20-45 min on a 2-core box: this is
# a release-day script, not part of CI. Fails at the first artifact that fails, naming it.
set -euo pipefail
cd "$(dirname "$0")/.."
ALL=(x86_64-cpu x86_64-cpu-gst x86_64-cuda-sm80 x86_64-cuda-sm86 x86_64-cuda-sm89 x86_64-cuda-sm90 x86_64-cuda-sm90-gst aarch64-cpu aarch64-cuda-sm87)
WANT=("$@")
[ ${#WANT[@]} -gt 0 ] || WANT=("${ALL[@]}")
for w in "${WANT[@]}"; do
  [[ " ${ALL[*]} " == *" $w "* ]] || { echo "release.sh: unknown artifact '$w' (${ALL[*]})" >&2; exit 2; }
done
VERSION=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"]=="yolo-edge"))')
COMMIT=$(git rev-parse --short=12 HEAD)
DIRTY=$(git status --porcelain --untracked-files=no | head -1)
[ -z "$DIRTY" ] || echo "release.sh: warning: the work tree has uncommitted changes; the manifest says so" >&2
OUT="dist/release-$VERSION-$COMMIT"
mkdir -p "$OUT"
MANIFEST="$OUT/manifest.jsonl"
: > "$MANIFEST"

# record NAME FILE TARGET FEATURES CAP
record() {
  local name=$1 file=$2 target=$3 features=$4 cap=$5
  cp "$file" "$OUT/yolo-edge-$name"
  python3 - "$OUT/yolo-edge-$name" "$name" "$target" "$features" "$cap" "$COMMIT" "${DIRTY:+dirty}" >> "$MANIFEST" <<'PY'
import hashlib, json, os, subprocess, sys
path, name, target, features, cap, commit, dirty = sys.argv[1:8]
data = open(path, "rb").read()
needed = [l.split("[", 1)[1].rstrip("]") for l in subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout.splitlines() if "(NEEDED)" in l]
print(json.dumps({
    "artifact": os.path.basename(path), "target": target, "features": [f for f in features.split(",") if f],
    "compute_capability": cap or None, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
    "needs": needed, "commit": commit + ("-dirty" if dirty else ""),
    "rustc": subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.strip(),
}))
PY
  echo "release.sh: $name -> $OUT/yolo-edge-$name"
}

for w in "${WANT[@]}"; do
  case "$w" in
    x86_64-cpu)
      cargo build --locked --release --bin yolo-edge
      strip -o /tmp/yolo-edge-release target/release/yolo-edge
      record "$w" /tmp/yolo-edge-release x86_64-unknown-linux-gnu "" "" ;;
    x86_64-cpu-gst)
      cargo build --locked --release --features gstreamer --bin yolo-edge
      strip -o /tmp/yolo-edge-release target/release/yolo-edge
      record "$w" /tmp/yolo-edge-release x86_64-unknown-linux-gnu gstreamer "" ;;
    x86_64-cuda-sm*)
      rest=${w#x86_64-cuda-sm}; cap=${rest%%-*}; gst=""; [[ "$w" == *-gst ]] && gst=--gstreamer
      CARGO_TARGET_DIR=target/cuda bash scripts/build-cuda.sh "$cap" --cudnn $gst
      record "$w" "dist/yolo-edge-cuda-sm$cap-cudnn${gst:+-gst}" x86_64-unknown-linux-gnu "cudnn,arena${gst:+,gstreamer}" "$cap" ;;
    aarch64-cpu)
      bash scripts/aarch64.sh build
      aarch64-linux-gnu-strip -o /tmp/yolo-edge-release target/aarch64-unknown-linux-gnu/release/yolo-edge
      record "$w" /tmp/yolo-edge-release aarch64-unknown-linux-gnu "" "" ;;
    aarch64-cuda-sm87)
      CARGO_TARGET_DIR=target/cuda bash scripts/build-cuda.sh 87 --aarch64
      record "$w" dist/yolo-edge-cuda-sm87-aarch64 aarch64-unknown-linux-gnu "cuda,arena" 87 ;;
  esac
done
(cd "$OUT" && sha256sum yolo-edge-* > SHA256SUMS)
# artifacts built by an earlier run into the same folder stay listed, replaced when rebuilt
python3 - "$MANIFEST" "$VERSION" "$OUT/manifest.json" <<'PY'
import json, os, sys
new = [json.loads(l) for l in open(sys.argv[1])]
old = json.load(open(sys.argv[3]))["artifacts"] if os.path.exists(sys.argv[3]) else []
names = {a["artifact"] for a in new}
rows = sorted([a for a in old if a["artifact"] not in names] + new, key=lambda a: a["artifact"])
json.dump({"version": sys.argv[2], "artifacts": rows}, open(sys.argv[3], "w"), indent=1)
PY
rm "$MANIFEST"
echo "release.sh: $(ls "$OUT" | wc -l) files in $OUT"
cat "$OUT/SHA256SUMS"
