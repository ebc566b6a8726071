#!/usr/bin/env bash
# The README's run command works: scripts/run.sh (build, then `specula serve` with no model
# argument) serves the embedded default model, answers /health and a completion through the
# OpenAI route, and stops cleanly on SIGTERM.
#   tests/e2e/run_command.sh BUILD_DIR     (the build folder scripts/run.sh should use)
set -uo pipefail
# (node and curl come from scripts/install-deps.sh, for the e2e suite.)

fail() { echo "run_command: FAILED: $*" >&2; exit 1; }

BUILD=${1:-}
[ -n "$BUILD" ] && [ -d "$BUILD" ] || fail "usage: run_command.sh BUILD_DIR"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "$BUILD" && pwd)
PORT=$(node -e "const s=require('net').createServer();s.listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})")
LOG=$(mktemp -t specula-run-command.XXXXXX.log)

SPECULA_SKIP_INSTALL=1 BUILD_DIR="$BUILD" "$ROOT/scripts/run.sh" --host 127.0.0.1 --port "$PORT" > "$LOG" 2>&1 &
PID=$!
cleanup() { kill "$PID" 2>/dev/null; }
trap cleanup EXIT

up=0
for _ in $(seq 1 240); do
  if curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; then up=1; break; fi
  kill -0 "$PID" 2>/dev/null || { cat "$LOG" >&2; fail "scripts/run.sh exited before serving"; }
  sleep 0.5
done
[ "$up" = 1 ] || { cat "$LOG" >&2; fail "no /health on port $PORT within 120 s"; }

models=$(curl -sf "http://127.0.0.1:$PORT/v1/models") || fail "GET /v1/models"
# Served under the model argument as given; with none, the embedded default's name.
id=$(echo "$models" | node -e 'let t="";process.stdin.on("data",d=>t+=d).on("end",()=>console.log(JSON.parse(t).data[0].id))')
[ "$id" = specula-tiny ] || fail "the default model is not served as specula-tiny: $models"
body="{\"model\": \"$id\", \"prompt\": \"def fibonacci(n):\", \"max_tokens\": 16, \"temperature\": 0}"
out=$(curl -sf "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' -d "$body") ||
  fail "POST /v1/completions"
echo "$out" | node -e '
let t = "";
process.stdin.on("data", (d) => (t += d)).on("end", () => {
  const r = JSON.parse(t);
  const text = r.choices[0].text;
  if (r.usage.completion_tokens !== 16 || text.length === 0) process.exit(1);
  console.log("run_command: completion ok:", JSON.stringify(text.slice(0, 60)));
});' || fail "unexpected completion: $out"

kill -TERM "$PID"
wait "$PID"
rc=$?
trap - EXIT
[ "$rc" = 0 ] || { tail -20 "$LOG" >&2; fail "specula serve exited with $rc after SIGTERM"; }
echo "run_command: ok"
