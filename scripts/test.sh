#!/usr/bin/env bash
# The project's test command (README): unit tests, model parity against the reference goldens,
# format and bad-input tests, and the agent's integration tests against a real Mosquitto; with
# the `gstreamer` feature, the camera tests against a real RTSP server (tests/cameras.rs; needs
# the GStreamer packages .ci/run installs).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --locked --features gstreamer --all-targets -- --test-threads="${TEST_THREADS:-2}" "$@"
