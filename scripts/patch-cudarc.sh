#!/usr/bin/env bash
# scripts/patch-cudarc.sh TARGET_DIR — copies the registry's cudarc (the version Cargo.lock pins)
# to TARGET_DIR/patched/, applies scripts/patches/cudarc-alloc-hook.patch (the allocation hook
# that src/backend/arena.rs installs) and prints `CUDARC_PATCHED=<path>` for eval. Idempotent.
# Use: eval "$(bash scripts/patch-cudarc.sh target)"; cargo build --features cudnn,arena \
#        --config "patch.crates-io.cudarc.path=\"$CUDARC_PATCHED\""
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET="${1:-target}"
VER=$(awk '/^name = "cudarc"$/ {getline; gsub(/[" ]/, "", $0); sub(/version=/, "", $0); print; exit}' Cargo.lock)
[ -n "$VER" ] || { echo "cudarc is not in Cargo.lock" >&2; exit 1; }
find_src() { ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-"$VER" 2>/dev/null | head -1; }
SRC=$(find_src)
[ -n "$SRC" ] || { cargo fetch --locked >&2; SRC=$(find_src); }
[ -n "$SRC" ] || { echo "cudarc $VER is not in the cargo registry (run cargo fetch)" >&2; exit 1; }
DST="$(mkdir -p "$TARGET/patched" && cd "$TARGET/patched" && pwd)/cudarc-$VER"
PATCH="$PWD/scripts/patches/cudarc-alloc-hook.patch"
STAMP="$DST/.yolo-edge-patch.sha256"
SUM=$(sha256sum "$PATCH" | cut -d' ' -f1)
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$SUM" ]; then
  rm -rf "$DST" && cp -r "$SRC" "$DST"
  (cd "$DST" && patch -p1 -s < "$PATCH") >&2
  echo "$SUM" > "$STAMP"
fi
echo "CUDARC_PATCHED=$DST"
