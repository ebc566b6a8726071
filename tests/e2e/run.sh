#!/usr/bin/env bash
# End-to-end tests: starts `specula serve` on a free local port with a small model, waits for
# /health, drives it with the official openai npm client (node's test runner), then stops it with
# SIGTERM and checks that it shuts down cleanly (exit 0).
#   tests/e2e/run.sh path/to/specula
# Environment: SPECULA_E2E_MODEL (model folder; default models/specula-tiny), SPECULA_E2E_ARGS
# (extra `specula serve` flags), SPECULA_E2E_LOAD_* (see tests/zz_load.test.mjs).
set -uo pipefail

fail() { echo "e2e: FAILED: $*" >&2; exit 1; }

BIN=${1:-}
[ -n "$BIN" ] || fail "usage: run.sh SPECULA_BINARY"
[ -x "$BIN" ] || fail "specula binary not found or not executable: $BIN"
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
MODEL=${SPECULA_E2E_MODEL:-$ROOT/models/specula-tiny}
[ -f "$MODEL/config.json" ] || fail "no model at $MODEL (config.json missing); set SPECULA_E2E_MODEL"
command -v node >/dev/null || fail "node is not installed (scripts/install-deps.sh)"

cd "$HERE"
if [ ! -d node_modules/openai ]; then
  echo "e2e: installing the openai client (npm ci)"
  npm ci --no-audit --no-fund --loglevel=error || fail "npm ci failed"
fi

PORT=$(node -e "const s=require('net').createServer();s.listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})")
LOG=$(mktemp -t specula-e2e-server.XXXXXX.log)
API_KEY=e2e-key
NAME=specula-e2e
echo "e2e: starting $BIN serve $MODEL on 127.0.0.1:$PORT (log: $LOG)"
# shellcheck disable=SC2086
"$BIN" serve "$MODEL" --host 127.0.0.1 --port "$PORT" --served-model-name "$NAME" --api-key "$API_KEY" \
  --seed 0 ${SPECULA_E2E_ARGS:-} >"$LOG" 2>&1 &
PID=$!
stop_server() {
  if kill -0 "$PID" 2>/dev/null; then kill -KILL "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; fi
}
trap stop_server EXIT

# Wait for /health (loading weights can take a while on a slow CPU).
for _ in $(seq 1 600); do
  if ! kill -0 "$PID" 2>/dev/null; then
    echo "---- server log (last 40 lines) ----" >&2; tail -n 40 "$LOG" >&2
    fail "the server exited before it became healthy"
  fi
  if node -e "fetch('http://127.0.0.1:$PORT/health').then(r=>process.exit(r.status===200?0:1)).catch(()=>process.exit(1))"; then
    break
  fi
  sleep 0.5
done
node -e "fetch('http://127.0.0.1:$PORT/health').then(r=>process.exit(r.status===200?0:1)).catch(()=>process.exit(1))" \
  || { tail -n 40 "$LOG" >&2; fail "the server did not become healthy in 300 s"; }
echo "e2e: server is up"

export SPECULA_E2E_URL="http://127.0.0.1:$PORT" SPECULA_E2E_API_KEY="$API_KEY" SPECULA_E2E_MODEL_NAME="$NAME"
node --test --test-concurrency=1 tests/api.test.mjs tests/endpoints.test.mjs tests/zz_load.test.mjs
STATUS=$?

# Clean shutdown: SIGTERM must stop the server with exit status 0 within 60 s.
kill -TERM "$PID"
for _ in $(seq 1 120); do kill -0 "$PID" 2>/dev/null || break; sleep 0.5; done
if kill -0 "$PID" 2>/dev/null; then
  tail -n 20 "$LOG" >&2
  fail "the server did not exit within 60 s of SIGTERM"
fi
wait "$PID"
EXIT=$?
trap - EXIT
if [ "$EXIT" -ne 0 ]; then
  tail -n 20 "$LOG" >&2
  fail "the server exited with status $EXIT after SIGTERM (expected 0)"
fi
echo "e2e: server shut down cleanly"
if [ "$STATUS" -ne 0 ]; then
  echo "---- server log (last 40 lines) ----" >&2; tail -n 40 "$LOG" >&2
  fail "end-to-end tests failed"
fi
echo "e2e: all passed"
