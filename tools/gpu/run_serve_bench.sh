#!/usr/bin/env bash
# `specula bench serve` on the GPU machine in ONE call (issue 18): a server per configuration, then
# the client benchmark at each request rate, against it:
#   qwen3-0.6b        Qwen3-0.6B (bench/configs, dummy weights, the real Qwen3 tokenizer carried
#                     by pack.sh), no speculation;
#   qwen3-0.6b-ngram  the same with ngram k = 4 (random weights: this shows its overhead);
#   tiny / tiny-draft the embedded specula-tiny without and with its draft (k = 4, real acceptance).
# Random prompts of 256 tokens, 128 output tokens (ignore_eos), rates SERVE_RATES (default
# "1 8 32 inf"); rate 1 sends 10 prompts, the others SERVE_PROMPTS (default 64).
# $OUT receives serve_summary.txt and serve_logs.tar.gz (every report, result JSON and server log).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
OUT=${OUT:-$(pwd)/.gpu/out}
mkdir -p "$OUT"
WORK=$(mktemp -d)
if [ -f .gpu/extras.tar.xz ] && [ ! -d .gpu/tokenizers ]; then tar -xJf .gpu/extras.tar.xz -C .gpu; fi
PORT=18300

serve_and_bench() {  # NAME MODEL [serve flags...]
  local name=$1 model=$2
  shift 2
  specula serve "$model" --host 127.0.0.1 --port $PORT --served-model-name "$name" --device cuda \
    --max-model-len 2048 --gpu-memory-utilization 0.5 --disable-uvicorn-access-log "$@" > "$WORK/server_$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 240); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
    kill -0 $pid 2>/dev/null || { echo "$name: server exited"; tail -5 "$WORK/server_$name.log"; return; }
    sleep 0.5
  done
  for rate in ${SERVE_RATES:-1 8 32 inf}; do
    local n=${SERVE_PROMPTS:-64}
    [ "$rate" = 1 ] && n=10
    timeout 120 specula bench serve --port $PORT --backend openai --dataset-name random --random-input-len 256 \
      --random-output-len 128 --ignore-eos --num-prompts "$n" --request-rate "$rate" --seed 0 --disable-tqdm \
      --save-result --result-dir "$WORK" --result-filename "${name}_rate${rate}.json" > "$WORK/${name}_rate${rate}.txt" 2>&1
    echo "$name rate $rate: exit $?" >> "$WORK/status.txt"
  done
  kill -TERM $pid; wait $pid
}

serve_and_bench qwen3-0.6b bench/configs/Qwen3-0.6B --load-format dummy --tokenizer .gpu/tokenizers/qwen3
serve_and_bench qwen3-0.6b-ngram bench/configs/Qwen3-0.6B --load-format dummy --tokenizer .gpu/tokenizers/qwen3 \
  --speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'
serve_and_bench tiny models/specula-tiny
serve_and_bench tiny-draft models/specula-tiny --speculative-config \
  '{"method": "draft_model", "model": "models/specula-tiny-draft", "num_speculative_tokens": 4}'

{
  echo "commit: $(head -1 .gpu/commit.txt 2>/dev/null)"
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null
  cat "$WORK/status.txt"
  python3 - "$WORK" <<'PY'
import glob, json, os, sys
print("config | rate | completed/failed | req/s | out tok/s | TTFT median/p99 ms | TPOT median/p99 ms | ITL median ms | acceptance")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*_rate*.json"))):
    j = json.load(open(path))
    name, rate = os.path.basename(path)[:-5].rsplit("_rate", 1)
    acc = j.get("spec_decoding") if isinstance(j.get("spec_decoding"), dict) else {}
    acc_s = f"{100 * acc['acceptance_rate']:.1f}% len {acc['acceptance_length']:.2f}" if acc and acc.get("num_drafts") else ""
    print(f"{name} | {rate} | {j['completed']}/{j.get('failed', 0)} | {j['request_throughput']:.2f} | "
          f"{j['output_throughput']:.0f} | {j['median_ttft_ms']:.1f}/{j['p99_ttft_ms']:.1f} | "
          f"{j['median_tpot_ms']:.2f}/{j['p99_tpot_ms']:.2f} | {j['median_itl_ms']:.2f} | {acc_s}")
PY
} | tee "$OUT/serve_summary.txt"
tar -czf "$OUT/serve_logs.tar.gz" -C "$WORK" .
