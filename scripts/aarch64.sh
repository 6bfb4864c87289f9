#!/usr/bin/env bash
# The aarch64 (Jetson-class, CPU) build and its library tests under qemu, from this x86_64 box.
#
#   scripts/aarch64.sh setup     Debian's cross toolchain and qemu (apt), and the aarch64 standard
#                                library (rustup, from static.rust-lang.org)
#   scripts/aarch64.sh test      the library's unit tests and the `eval` integration tests (which
#                                start the binary), built for aarch64, run under qemu
#   scripts/aarch64.sh test-all  every integration test too (the model goldens, the agent against a
#                                native Mosquitto: long under emulation)
#   scripts/aarch64.sh build     the release binary (target/aarch64-unknown-linux-gnu/release/)
#
# Linker and runner come from .cargo/config.toml. The aarch64 standard library is not on a package
# registry, so this stays out of CI; results and timings are in docs/jetson.md.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=aarch64-unknown-linux-gnu

case "${1:-test}" in
  setup)
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static file cmake
    rustup target add "$TARGET"
    ;;
  test)
    command -v qemu-aarch64-static >/dev/null || { echo "qemu-aarch64-static missing: scripts/aarch64.sh setup" >&2; exit 2; }
    rustup target list --installed | grep -qx "$TARGET" || { echo "no $TARGET standard library: scripts/aarch64.sh setup" >&2; exit 2; }
    # tests that start the binary start it through the same qemu (tests/common/runner.rs), and
    # time-bounded tests allow for emulation
    export YOLO_EDGE_TEST_RUNNER="qemu-aarch64-static -L /usr/aarch64-linux-gnu"
    cargo test --locked --target "$TARGET" --lib -- --test-threads="${TEST_THREADS:-2}"
    cargo test --locked --target "$TARGET" --test eval -- --test-threads="${TEST_THREADS:-2}"
    ;;
  test-all)
    YOLO_EDGE_TEST_RUNNER="qemu-aarch64-static -L /usr/aarch64-linux-gnu" \
      cargo test --locked --target "$TARGET" --all-targets -- --test-threads="${TEST_THREADS:-2}"
    ;;
  build)
    cargo build --locked --release --target "$TARGET"
    file "target/$TARGET/release/yolo-edge"
    qemu-aarch64-static -L /usr/aarch64-linux-gnu "target/$TARGET/release/yolo-edge" --version
    ;;
  *)
    echo "usage: $0 setup|test|test-all|build" >&2
    exit 2
    ;;
esac
