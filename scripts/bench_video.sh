#!/usr/bin/env bash
# Decode + letterbox fps of one H.264 stream on the CPU at 640x480 and 1920x1080
# (BENCHMARKS.md, "Cameras"): makes 10 s, 25 fps clips with openh264enc (a moving test pattern)
# and runs examples/video_bench.rs on each. Needs the GStreamer packages of docs/cameras.md and
# gstreamer1.0-plugins-bad (openh264enc).
#   scripts/bench_video.sh [PROFILE]     PROFILE: release (default) or test
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-release}
dir=target/bench-video
mkdir -p "$dir"
for size in 640x480 1920x1080; do
  w=${size%x*} h=${size#*x}
  clip="$dir/h264-$size.mp4"
  [ -f "$clip" ] || gst-launch-1.0 -q videotestsrc num-buffers=250 pattern=ball \
    ! "video/x-raw,width=$w,height=$h,framerate=25/1" ! videoconvert ! openh264enc bitrate=4000000 \
    ! h264parse ! mp4mux ! filesink location="$clip"
done
cargo build --locked --profile "$profile" --features gstreamer --example video_bench
dirname=$([ "$profile" = test ] && echo debug || echo "$profile")
nproc_=$(nproc)
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $nproc_ cores; profile $profile"
for size in 640x480 1920x1080; do
  "target/$dirname/examples/video_bench" "$dir/h264-$size.mp4" 640
done
