#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan, CPU only) in their own folder and runs each
# from its seed corpus for a bounded time. Fails on any crash, sanitizer report, leak or timeout;
# the input that did it is left in $FUZZ_BUILD_DIR/artifacts/<target>/ (reproduce with
# `$FUZZ_BUILD_DIR/tests/fuzz/<target> <that file>`).
#
#   tests/fuzz/run.sh                  every target, FUZZ_SECONDS (default 15) each
#   tests/fuzz/run.sh chat_template    one target (request_parser, safetensors_header,
#                                      tokenizer_json, chat_template, structured_output,
#                                      tool_parser)
#
# FUZZ_BUILD_DIR (default build-fuzz), FUZZ_SECONDS, FUZZ_JOBS (build jobs, default nproc).
# New inputs found go to $FUZZ_BUILD_DIR/corpus/<target>/, never into the committed seeds.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${FUZZ_BUILD_DIR:-$ROOT/build-fuzz}
SECONDS_EACH=${FUZZ_SECONDS:-15}
JOBS=${FUZZ_JOBS:-$(nproc)}

# Each target and the longest input it is given: a request body, a safetensors file (header and a
# little data), a tokenizer.json (the seeds are cut-down real ones), a chat template, a
# constraint and the text run through it, a model's output with tool calls.
declare -A MAX_LEN=([request_parser]=4096 [safetensors_header]=4096 [tokenizer_json]=16384 [chat_template]=4096
  [structured_output]=2048 [tool_parser]=4096)
ORDER=(request_parser safetensors_header tokenizer_json chat_template structured_output tool_parser)
if [ $# -gt 0 ]; then ORDER=("$@"); fi
for t in "${ORDER[@]}"; do
  [ -n "${MAX_LEN[$t]:-}" ] || { echo "fuzz: unknown target '$t' (one of ${!MAX_LEN[*]})" >&2; exit 2; }
done

command -v clang++ >/dev/null || { echo "fuzz: clang++ not found (scripts/install-deps.sh installs it)" >&2; exit 1; }
LAUNCHER=()
if command -v ccache >/dev/null; then LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache); fi
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DSPECULA_FUZZ=ON -DSPECULA_CUDA=OFF \
  "${LAUNCHER[@]}" >/dev/null
build_start=$(date +%s)
cmake --build "$BUILD" -j "$JOBS" --target $(printf '%s_fuzz ' "${ORDER[@]}")
echo "fuzz: built in $(( $(date +%s) - build_start )) s"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
for t in "${ORDER[@]}"; do
  bin="$BUILD/tests/fuzz/${t}_fuzz"
  work="$BUILD/corpus/$t"
  artifacts="$BUILD/artifacts/$t/"
  log="$BUILD/logs/$t.log"
  mkdir -p "$work" "$artifacts" "$(dirname "$log")"
  echo "fuzz: $t for ${SECONDS_EACH} s (-max_len=${MAX_LEN[$t]})"
  rc=0
  # New inputs go to the first folder (the build's); the seeds are only read.
  "$bin" -max_total_time="$SECONDS_EACH" -max_len="${MAX_LEN[$t]}" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$artifacts" "$work" "$ROOT/tests/fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  # libFuzzer's last status line (runs, coverage, corpus, exec/s) and its final stats.
  grep -E '^#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE|INITED)' "$log" | tail -n 1 || true
  grep -E '^(Done [0-9]+ runs|stat::number_of_executed_units|stat::peak_rss_mb)' "$log" || true
  if [ "$rc" -ne 0 ]; then
    echo "fuzz: $t FAILED (exit $rc); the end of its log ($log):"
    tail -n 60 "$log"
    failed+=("$t")
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: failures in ${failed[*]}; inputs under $BUILD/artifacts/"
  exit 1
fi
echo "fuzz: ${#ORDER[@]} target(s), no crashes"
