#!/usr/bin/env bash
# Coverage-guided fuzzing of the inputs that come from outside (fuzz/, docs/security.md "Fuzzing").
#
#   scripts/fuzz.sh build                        build the six targets (fuzz/target/.../release/)
#   scripts/fuzz.sh smoke [SECONDS]              replays fuzz/regressions/<target>/, then each target
#                                                SECONDS (25) from its seeds; fails on any crash,
#                                                leak, timeout or out-of-memory (CI)
#   scripts/fuzz.sh long OUT SECONDS [JOBS] [TARGET...]
#                                                each target SECONDS of wall time with JOBS (1)
#                                                libFuzzer fork workers, one target after the other;
#                                                corpus, crashes, log and summary.md under OUT
#   scripts/fuzz.sh build-asan-c                 the same targets with the C code they link
#                                                (libjpeg-turbo; ring, aws-lc) compiled by clang with
#                                                AddressSanitizer and libFuzzer's coverage, into
#                                                fuzz/target/asan-c/; run them with
#                                                FUZZ_BIN_DIR=fuzz/target/asan-c/x86_64-unknown-linux-gnu/release
#                                                (needs clang and its compiler-rt: Debian clang-19
#                                                libclang-rt-19-dev; ASAN_CC=clang-19)
#   scripts/fuzz.sh targets                      the target names
#
# The build: cargo-fuzz on the stable toolchain, `--sanitizer none` (AddressSanitizer needs
# nightly's -Zsanitizer; safe Rust does not need it to find panics, overflows - the build has
# debug assertions, so arithmetic overflow panics - or runaway allocations), so no nightly and no
# RUSTC_BOOTSTRAP. The libFuzzer runtime comes from the libfuzzer-sys crate (needs a C++ compiler).
# The binaries are self-contained: FUZZ_BIN_DIR=<folder holding them> runs smoke and long without
# cargo, e.g. on a bigger machine (copy the folder, fuzz/seeds and this script).
#
# Every run reads its seeds from fuzz/seeds/<target> and writes what it finds elsewhere (smoke: a
# temporary folder; long: OUT), so the committed seeds never grow. stdin is /dev/null (the config
# target may name files to read).
set -euo pipefail
cd "$(dirname "$0")/.."

TARGETS=(pickle_pt safetensors picture config mqtt_image model)
BIN_DIR=${FUZZ_BIN_DIR:-fuzz/target/x86_64-unknown-linux-gnu/release}
SEEDS=${FUZZ_SEEDS:-fuzz/seeds}
# libFuzzer options of every run: an input over 10 s or 2 GiB (a single allocation over 2 GiB
# included) is a failure
COMMON=(-rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 -print_final_stats=1)

max_len() {
  case "$1" in
    pickle_pt | picture) echo 16384 ;;
    model) echo 128 ;;
    *) echo 8192 ;;
  esac
}

build() {
  command -v cargo-fuzz >/dev/null || { echo "cargo-fuzz missing: cargo install --locked cargo-fuzz" >&2; exit 2; }
  # -a: debug assertions (overflow checks) on, as cargo-fuzz recommends
  (cd fuzz && cargo fuzz build --sanitizer none -a)
}

# AddressSanitizer for the C code only (stable Rust cannot instrument its own code): the C
# libraries' builds (cmake and cc take CC and CFLAGS) are compiled by clang with ASan and with
# the coverage libFuzzer reads (`fuzzer-no-link`), so the fuzzer is guided through the decoder's
# branches as through the Rust code's; clang links ASan's runtime into each binary. A memory
# error in C code then stops the run with ASan's report, as a crash.
build_asan_c() {
  command -v cargo-fuzz >/dev/null || { echo "cargo-fuzz missing: cargo install --locked cargo-fuzz" >&2; exit 2; }
  local cc=${ASAN_CC:-clang}
  if ! echo 'int main(void) { return 0; }' | "$cc" -x c -fsanitize=address,fuzzer-no-link -o /dev/null - 2>/dev/null; then
    echo "$cc cannot build with AddressSanitizer (Debian: apt-get install clang-19 libclang-rt-19-dev; ASAN_CC=clang-19)" >&2
    exit 2
  fi
  (cd fuzz && CC="$cc" CFLAGS="-fsanitize=address,fuzzer-no-link -fno-omit-frame-pointer" \
    RUSTFLAGS="-C linker=$cc -C link-arg=-fsanitize=address" CARGO_TARGET_DIR=target/asan-c \
    cargo fuzz build --sanitizer none -a)
}

bin() {
  local b="$BIN_DIR/$1"
  [[ -x $b ]] || { echo "$b missing (scripts/fuzz.sh build)" >&2; exit 2; }
  echo "$b"
}

# the figures of a run from its log and folders, one markdown table row
summary_row() {
  local t=$1 dir=$2 wall=$3 cpu=$4
  local last execs cov ft
  last=$(grep -E '^#[0-9]+' "$dir/log" | tail -1 || true)
  execs=$({ grep -oE 'stat::number_of_executed_units: [0-9]+' "$dir/log" || true; } | awk '{s += $2} END {print s + 0}')
  if [[ $execs == 0 ]]; then execs=$(sed -E 's/^#([0-9]+).*/\1/' <<<"$last"); fi
  cov=$(grep -oE 'cov: [0-9]+' <<<"$last" | awk '{print $2}')
  ft=$(grep -oE 'ft: [0-9]+' <<<"$last" | awk '{print $2}')
  local corpus crashes
  corpus=$(find "$dir/corpus" -type f | wc -l)
  crashes=$(find "$dir/artifacts" -type f | wc -l)
  local eps
  eps=$(awk -v e="${execs:-0}" -v w="$wall" 'BEGIN {printf "%.0f", (w > 0 ? e / w : 0)}')
  echo "| $t | $wall | $cpu | ${execs:-?} | $eps | ${cov:-?} | ${ft:-?} | $corpus | $crashes |"
}

smoke() {
  local secs=${1:-25} failed=0 tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  for t in "${TARGETS[@]}"; do
    local b
    b=$(bin "$t")
    mkdir -p "$tmp/$t/corpus" "$tmp/$t/artifacts"
    # the inputs of earlier findings first (fuzz/regressions/<target>/), each replayed once
    if compgen -G "fuzz/regressions/$t/*" >/dev/null; then
      echo "== fuzz regressions: $t ($(find "fuzz/regressions/$t" -type f | wc -l) inputs)"
      if ! "$b" "${COMMON[@]}" fuzz/regressions/"$t"/* </dev/null >"$tmp/$t/regressions.log" 2>&1; then
        failed=1
        tail -40 "$tmp/$t/regressions.log"
      fi
    fi
    echo "== fuzz smoke: $t (${secs}s)"
    if ! "$b" "${COMMON[@]}" -max_len="$(max_len "$t")" -max_total_time="$secs" -artifact_prefix="$tmp/$t/artifacts/" \
      "$tmp/$t/corpus" "$SEEDS/$t" </dev/null >"$tmp/$t/log" 2>&1; then
      failed=1
      tail -40 "$tmp/$t/log"
      for a in "$tmp/$t/artifacts"/*; do
        [[ -f $a ]] && { echo "input ($a), base64:"; base64 -w0 "$a" | head -c 4096; echo; }
      done
    fi
    grep -E '^#[0-9]+' "$tmp/$t/log" | tail -1 || true
  done
  if [[ $failed != 0 ]]; then
    echo "fuzz smoke: a target failed (the input is above; reproduce with: $BIN_DIR/<target> <file>)" >&2
    return 1
  fi
  echo "fuzz smoke: all targets ran ${secs}s without a failure"
}

long() {
  local out=$1 secs=$2 jobs=${3:-1}
  shift 3 || shift $#
  local targets=("$@")
  [[ ${#targets[@]} -gt 0 ]] || targets=("${TARGETS[@]}")
  mkdir -p "$out"
  for t in "${targets[@]}"; do
    local b dir
    b=$(bin "$t")
    dir="$out/$t"
    mkdir -p "$dir/corpus" "$dir/artifacts"
    echo "== fuzz long: $t, ${secs}s, $jobs worker(s), in $dir"
    local start end
    start=$(date +%s)
    # -fork: workers in child processes, restarted after a failure, which is kept in artifacts/
    # and does not end the run; /usr/bin/time counts the CPU time of the workers too
    /usr/bin/time -f '%U %S' -o "$dir/cpu" "$b" "${COMMON[@]}" -max_len="$(max_len "$t")" -fork="$jobs" \
      -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1 -max_total_time="$secs" -artifact_prefix="$dir/artifacts/" \
      "$dir/corpus" "$SEEDS/$t" </dev/null >"$dir/log" 2>&1 || true
    end=$(date +%s)
    local cpu
    cpu=$(awk '{printf "%.0f", $1 + $2}' "$dir/cpu")
    summary_row "$t" "$dir" $((end - start)) "$cpu" | tee "$dir/row"
  done
  {
    echo "| target | wall s | CPU s | execs | exec/s (wall) | cov | ft | corpus | crashes |"
    echo "|---|---|---|---|---|---|---|---|---|"
    cat "$out"/*/row
  } >"$out/summary.md"
  cat "$out/summary.md"
}

case "${1:-}" in
  build) build ;;
  build-asan-c) build_asan_c ;;
  smoke) smoke "${2:-25}" ;;
  long)
    [[ $# -ge 3 ]] || { echo "usage: $0 long OUT SECONDS [JOBS] [TARGET...]" >&2; exit 2; }
    shift
    long "$@"
    ;;
  targets) printf '%s\n' "${TARGETS[@]}" ;;
  *)
    sed -n '2,19p' "$0" >&2
    exit 2
    ;;
esac
