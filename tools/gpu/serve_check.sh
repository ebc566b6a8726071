#!/usr/bin/env bash
# Without node: `specula serve --device cuda` must answer a completion, a chat completion and a
# streamed completion with logprobs (curl), then shut down cleanly on SIGTERM (exit 0).
#   bash tools/gpu/serve_check.sh OUTDIR
set -uo pipefail
out=${1:-.}
port=18123
specula serve models/specula-tiny --device cuda --port $port --host 127.0.0.1 --max-model-len 512 \
  --gpu-memory-utilization 0.3 > "$out/serve_check_server.log" 2>&1 &
pid=$!
for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.5; done
status=0
check() {  # check NAME PATTERN CURL-ARGS...
  local name=$1 pattern=$2
  shift 2
  if curl -sf -N "$@" > "$out/serve_check_$name.txt" && grep -q "$pattern" "$out/serve_check_$name.txt"; then
    echo "serve_check $name: ok"
  else
    echo "serve_check $name: FAILED"
    status=1
  fi
}
url=http://127.0.0.1:$port/v1
check completion '"choices"' "$url/completions" -H 'Content-Type: application/json' \
  -d '{"model": "models/specula-tiny", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}'
check chat '"choices"' "$url/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "models/specula-tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16}'
check stream 'data: \[DONE\]' "$url/completions" -H 'Content-Type: application/json' \
  -d '{"model": "models/specula-tiny", "prompt": "A", "max_tokens": 8, "stream": true, "logprobs": 3, "seed": 1}'
kill -TERM $pid
wait $pid || { echo "serve_check: the server did not exit cleanly"; status=1; }
exit $status
