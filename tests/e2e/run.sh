#!/usr/bin/env bash
# End-to-end tests: starts `specula serve` on a free local port with a small model, waits for
# /health, drives it with the official openai npm client (node's test runner), then stops it with
# SIGTERM and checks that it shuts down cleanly (exit 0). With the default model the whole suite
# runs twice: without speculation, then with the embedded draft (models/specula-tiny-draft,
# k = 3); both times tests/reference.test.mjs compares the greedy text with transformers'
# (tests/fixtures/embedded/specula-tiny/reference.safetensors). A third server, with ngram
# speculation, runs only tests/structured.test.mjs (grammar masks on drafted tokens); a fourth,
# split with -tp 2, runs the reference and API tests. Every server
# has --enable-auto-tool-choice --tool-call-parser hermes, so that tool_choice "auto" works.
#   tests/e2e/run.sh path/to/specula
# Environment: SPECULA_E2E_MODEL (model folder; default models/specula-tiny: another model runs
# once, without speculation, and with no reference unless SPECULA_E2E_REFERENCE names one),
# SPECULA_E2E_ARGS (extra `specula serve` flags), SPECULA_E2E_LOAD_* (see tests/zz_load.test.mjs),
# SUITE_TESTS (the test files every server runs, e.g. "tests/structured.test.mjs"; default all).
# The clients (openai, the Vercel AI SDK, LangChain, zod) are pinned in package.json.
set -uo pipefail

fail() { echo "e2e: FAILED: $*" >&2; exit 1; }

BIN=${1:-}
[ -n "$BIN" ] || fail "usage: run.sh SPECULA_BINARY"
[ -x "$BIN" ] || fail "specula binary not found or not executable: $BIN"
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DEFAULT_MODEL=$ROOT/models/specula-tiny
MODEL=${SPECULA_E2E_MODEL:-$DEFAULT_MODEL}
[ -f "$MODEL/config.json" ] || fail "no model at $MODEL (config.json missing); set SPECULA_E2E_MODEL"
command -v node >/dev/null || fail "node is not installed (scripts/install-deps.sh)"

cd "$HERE"
if [ ! -d node_modules/openai ] || [ ! -d node_modules/ai ] || [ ! -d node_modules/@langchain/openai ]; then
  echo "e2e: installing the clients (npm ci)"
  npm ci --no-audit --no-fund --loglevel=error || fail "npm ci failed"
fi

API_KEY=e2e-key
NAME=specula-e2e
PID=
stop_server() {
  if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then kill -KILL "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; fi
}
# The suites' shared notes (the greedy outputs speculation must reproduce: tests/structured.test.mjs).
export SPECULA_E2E_GREEDY_DIR
SPECULA_E2E_GREEDY_DIR=$(mktemp -d -t specula-e2e-greedy.XXXXXX)
cleanup() { stop_server; rm -rf "$SPECULA_E2E_GREEDY_DIR"; }
trap cleanup EXIT

ALL_TESTS="tests/api.test.mjs tests/endpoints.test.mjs tests/structured.test.mjs tests/reference.test.mjs
  tests/hardening.test.mjs tests/zz_load.test.mjs"

# run_suite LABEL [serve flags...]: one server, the tests ($SUITE_TESTS: the whole suite unless set)
# against it, a clean shutdown.
run_suite() {
  local label=$1
  shift
  local port log status exit_code
  port=$(node -e "const s=require('net').createServer();s.listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})")
  log=$(mktemp -t specula-e2e-server.XXXXXX.log)
  echo "e2e ($label): starting $BIN serve $MODEL on 127.0.0.1:$port $* (log: $log)"
  # shellcheck disable=SC2086
  "$BIN" serve "$MODEL" --host 127.0.0.1 --port "$port" --served-model-name "$NAME" --api-key "$API_KEY" \
    --seed 0 --enable-auto-tool-choice --tool-call-parser hermes "$@" ${SPECULA_E2E_ARGS:-} >"$log" 2>&1 &
  PID=$!

  # Wait for /health (loading weights can take a while on a slow CPU).
  for _ in $(seq 1 600); do
    if ! kill -0 "$PID" 2>/dev/null; then
      echo "---- server log (last 40 lines) ----" >&2; tail -n 40 "$log" >&2
      fail "($label) the server exited before it became healthy"
    fi
    if node -e "fetch('http://127.0.0.1:$port/health').then(r=>process.exit(r.status===200?0:1)).catch(()=>process.exit(1))"; then
      break
    fi
    sleep 0.5
  done
  node -e "fetch('http://127.0.0.1:$port/health').then(r=>process.exit(r.status===200?0:1)).catch(()=>process.exit(1))" \
    || { tail -n 40 "$log" >&2; fail "($label) the server did not become healthy in 300 s"; }
  echo "e2e ($label): server is up"

  # shellcheck disable=SC2086
  SPECULA_E2E_URL="http://127.0.0.1:$port" SPECULA_E2E_API_KEY="$API_KEY" SPECULA_E2E_MODEL_NAME="$NAME" \
    SPECULA_E2E_SPECULATIVE="${SPECULA_E2E_SPECULATIVE:-0}" SPECULA_E2E_BIN="$BIN" SPECULA_E2E_MODEL_DIR="$MODEL" \
    node --test --test-concurrency=1 ${SUITE_TESTS:-$ALL_TESTS}
  status=$?

  # Clean shutdown: SIGTERM must stop the server with exit status 0 within 60 s.
  kill -TERM "$PID"
  for _ in $(seq 1 120); do kill -0 "$PID" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$PID" 2>/dev/null; then
    tail -n 20 "$log" >&2
    fail "($label) the server did not exit within 60 s of SIGTERM"
  fi
  wait "$PID"
  exit_code=$?
  PID=
  if [ "$exit_code" -ne 0 ]; then
    tail -n 20 "$log" >&2
    fail "($label) the server exited with status $exit_code after SIGTERM (expected 0)"
  fi
  echo "e2e ($label): server shut down cleanly"
  if [ "$status" -ne 0 ]; then
    echo "---- server log (last 40 lines) ----" >&2; tail -n 40 "$log" >&2
    fail "($label) end-to-end tests failed"
  fi
}

if [ "$MODEL" -ef "$DEFAULT_MODEL" ]; then
  export SPECULA_E2E_REFERENCE=${SPECULA_E2E_REFERENCE:-$ROOT/tests/fixtures/embedded/specula-tiny/reference.safetensors}
  [ -f "$SPECULA_E2E_REFERENCE" ] || fail "committed reference missing: $SPECULA_E2E_REFERENCE"
  DRAFT=$ROOT/models/specula-tiny-draft
  [ -f "$DRAFT/model.safetensors" ] || fail "committed draft model missing: $DRAFT"
  SPECULA_E2E_SPECULATIVE=0 run_suite "no speculation"
  # Pinned depth: with a sampled draft, a seeded request's tokens depend on the depths chosen
  # (spec_decode/README.md), so the suite's reproducibility test needs a fixed one.
  SPECULA_E2E_SPECULATIVE=1 run_suite "draft model, k=3" --speculative-config \
    "{\"method\": \"draft_model\", \"model\": \"$DRAFT\", \"num_speculative_tokens\": 3, \"adaptive\": false}"
  SPECULA_E2E_SPECULATIVE=1 SUITE_TESTS=tests/structured.test.mjs run_suite "ngram, k=3, structured outputs only" \
    --speculative-config \
    '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4, "adaptive": false}'
  # The model split over two tensor-parallel ranks (threads on the CPU) answers the client alike.
  SPECULA_E2E_SPECULATIVE=0 SUITE_TESTS="tests/reference.test.mjs tests/api.test.mjs" \
    run_suite "tensor parallel, -tp 2, reference and API tests only" -tp 2
else
  SPECULA_E2E_SPECULATIVE=0 run_suite "$(basename "$MODEL")"
fi
trap - EXIT
cleanup
echo "e2e: all passed"
