#!/usr/bin/env bash
# The project's test command (README): unit tests, model parity against the reference goldens,
# format and bad-input tests, and the agent's integration tests against a real Mosquitto.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --locked --all-targets -- --test-threads="${TEST_THREADS:-2}" "$@"
