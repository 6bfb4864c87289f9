#!/usr/bin/env bash
# scripts/gst-bundle.sh — a self-contained GStreamer runtime for a machine that has no GStreamer
# packages and no network (the lent GPU machine): the core libraries, the plugins that read a
# video file and decode H.264/H.265 with NVDEC, and every library they load that is not part of
# glibc, copied from this machine's Debian packages into one folder.
#
# Usage:  scripts/gst-bundle.sh OUTDIR [--with-mosquitto]
#   --with-mosquitto: also bin/mosquitto and its libraries (the broker of scripts/bench_streams.py)
# Then, on the target:
#   export LD_LIBRARY_PATH=OUTDIR/lib GST_PLUGIN_SYSTEM_PATH=OUTDIR/plugins \
#          GST_PLUGIN_SCANNER=OUTDIR/libexec/gst-plugin-scanner GST_REGISTRY=/tmp/gst-registry.bin
# The agent's software decoders (gstreamer1.0-libav, with FFmpeg's libraries) are left out: they
# would triple the size, and a machine with NVDEC does not need them. `openh264dec` is in: parsebin
# exposes an H.264 stream only where some decoder for it is registered. Not for field use: a box runs
# its distribution's GStreamer packages (docs/cameras.md).
set -euo pipefail
OUT="${1:?usage: gst-bundle.sh OUTDIR [--with-mosquitto]}"
MOSQUITTO=""
[ "${2:-}" = --with-mosquitto ] && MOSQUITTO=/usr/sbin/mosquitto
ARCH_LIB=/usr/lib/x86_64-linux-gnu
PLUGINS=(coreelements typefindfunctions playback isomp4 videoparsersbad nvcodec openh264 videoconvertscale app)
SCANNER="$ARCH_LIB/gstreamer1.0/gstreamer-1.0/gst-plugin-scanner"
mkdir -p "$OUT/lib" "$OUT/plugins" "$OUT/libexec"
files=("$SCANNER")
for p in "${PLUGINS[@]}"; do
  f="$ARCH_LIB/gstreamer-1.0/libgst$p.so"
  [ -f "$f" ] || { echo "gst-bundle.sh: $f missing (install the GStreamer packages of docs/cameras.md)" >&2; exit 1; }
  cp -L "$f" "$OUT/plugins/"
  files+=("$f")
done
cp -L "$SCANNER" "$OUT/libexec/"
if [ -n "$MOSQUITTO" ]; then
  [ -x "$MOSQUITTO" ] || { echo "gst-bundle.sh: $MOSQUITTO missing (apt-get install mosquitto)" >&2; exit 1; }
  mkdir -p "$OUT/bin" && cp -L "$MOSQUITTO" "$OUT/bin/" && files+=("$MOSQUITTO")
fi
# every shared library these load, minus glibc's and the compiler runtime (the target's own, as
# new as or newer than Debian 12's, must be used)
for f in "${files[@]}" "$ARCH_LIB/libgstreamer-1.0.so.0" "$ARCH_LIB/libgstapp-1.0.so.0" "$ARCH_LIB/libgstvideo-1.0.so.0"; do
  ldd "$f" | awk '$3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libstdc++.so.*|libgcc_s.so.*) ;;
    *) cp -L "$lib" "$OUT/lib/" ;;
  esac
done
echo "gst-bundle.sh: $(ls "$OUT/plugins" | wc -l) plugins, $(ls "$OUT/lib" | wc -l) libraries, $(du -sh "$OUT" | cut -f1) in $OUT"
