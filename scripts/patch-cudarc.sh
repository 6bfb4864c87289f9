#!/usr/bin/env bash
# scripts/patch-cudarc.sh TARGET_DIR — copies the registry's cudarc (the version Cargo.lock pins)
# to TARGET_DIR/patched/, applies scripts/patches/cudarc-alloc-hook.patch (the allocation hook
# that src/backend/arena.rs installs) and prints `CUDARC_PATCHED=<path>` for eval. Idempotent.
# Works on a fresh clone with an empty cargo registry (CARGO_HOME): cudarc is fetched first.
# Every failure prints what failed to stderr and exits non-zero; stdout carries only the line above.
# Use: eval "$(bash scripts/patch-cudarc.sh target)"; cargo build --features cudnn,arena \
#        --config "patch.crates-io.cudarc.path=\"$CUDARC_PATCHED\""
set -euo pipefail
shopt -s nullglob
cd "$(dirname "$0")/.."
TARGET="${1:-target}"
die() { echo "patch-cudarc.sh: $*" >&2; exit 1; }
[ -f Cargo.lock ] || die "no Cargo.lock in $PWD"
VER=$(awk '/^name = "cudarc"$/ {getline; gsub(/[" ]/, "", $0); sub(/version=/, "", $0); print; exit}' Cargo.lock)
[ -n "$VER" ] || die "cudarc is not in Cargo.lock"
REGISTRY="${CARGO_HOME:-$HOME/.cargo}/registry/src"
# the unpacked crate in any registry index folder (no match: empty, not an error)
find_src() {
  local d
  for d in "$REGISTRY"/*/cudarc-"$VER"; do
    [ -f "$d/Cargo.toml" ] && { echo "$d"; return; }
  done
  return 0
}
SRC=$(find_src)
if [ -z "$SRC" ]; then
  echo "patch-cudarc.sh: cudarc $VER is not unpacked under $REGISTRY; running cargo fetch --locked" >&2
  cargo fetch --locked >&2 || die "cargo fetch --locked failed (network, or Cargo.lock out of date?)"
  SRC=$(find_src)
fi
[ -n "$SRC" ] || die "cudarc $VER is still not under $REGISTRY after cargo fetch"
PATCH="$PWD/scripts/patches/cudarc-alloc-hook.patch"
[ -f "$PATCH" ] || die "missing $PATCH"
mkdir -p "$TARGET/patched" || die "cannot create $TARGET/patched"
DST="$(cd "$TARGET/patched" && pwd)/cudarc-$VER"
STAMP="$DST/.yolo-edge-patch.sha256"
SUM=$(sha256sum "$PATCH" | cut -d' ' -f1)
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$SUM" ]; then
  rm -rf "$DST"
  cp -r "$SRC" "$DST" || die "cannot copy $SRC to $DST"
  (cd "$DST" && patch -p1 -s < "$PATCH") >&2 || { rm -rf "$DST"; die "$PATCH does not apply to cudarc $VER"; }
  echo "$SUM" > "$STAMP"
fi
echo "CUDARC_PATCHED=$DST"
