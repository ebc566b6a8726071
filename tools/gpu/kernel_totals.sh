#!/usr/bin/env bash
# Each kernel's GPU time over a decode run of real shapes (dummy weights), from CUPTI
# (tools/gpu/cupti_gaps.cc with no step marker: per kernel name, total, count and mean), with
# overlapped launches on and off (SPECULA_PDL=0: kernels then run back to back, so each span is
# the kernel alone; with them on, a span also holds its wait for the kernel before it).
# Pack with `tools/gpu/pack.sh specula cupti_gaps`. TOTALS_CONFIGS (default "qwen_b1 llama_b1
# llama_b64"); TOTALS_PDL (default "1 0"). $OUT receives totals_<config>_pdl<0|1>.txt and
# totals_logs.tar.gz (the device tool brings back at most 8 files).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
OUT=${OUT:-$(pwd)/.gpu/out}
mkdir -p "$OUT"
LOGS=$(mktemp -d)
GAPS=$(pwd)/.gpu/lib/libcupti_gaps.so
[ -f "$GAPS" ] || { echo "cupti_gaps not packed"; exit 77; }
run() {  # run CONFIG: one bench latency with the settings of CONFIG
  case $1 in
    qwen_b1) specula bench latency bench/configs/Qwen3-0.6B --load-format dummy --skip-tokenizer-init \
      --batch-size 1 --input-len 128 --output-len 128 --num-iters 5 --num-iters-warmup 1 --max-model-len 4096 \
      --max-num-seqs 8 ;;
    llama_b1) specula bench latency bench/configs/Llama-3.1-8B-Instruct --load-format dummy --skip-tokenizer-init \
      --batch-size 1 --input-len 128 --output-len 128 --num-iters 3 --num-iters-warmup 1 --max-model-len 4608 \
      --max-num-seqs 8 ;;
    llama_b64) specula bench latency bench/configs/Llama-3.1-8B-Instruct --load-format dummy --skip-tokenizer-init \
      --batch-size 64 --input-len 128 --output-len 128 --num-iters 2 --num-iters-warmup 1 --max-model-len 4608 \
      --max-num-seqs 64 ;;
    llama_fp8_b1) specula bench latency bench/configs/Llama-3.1-8B-Instruct --load-format dummy --skip-tokenizer-init \
      --quantization fp8 --batch-size 1 --input-len 128 --output-len 128 --num-iters 3 --num-iters-warmup 1 \
      --max-model-len 4608 --max-num-seqs 8 ;;
    llama_fp8_b64) specula bench latency bench/configs/Llama-3.1-8B-Instruct --load-format dummy --skip-tokenizer-init \
      --quantization fp8 --batch-size 64 --input-len 128 --output-len 128 --num-iters 2 --num-iters-warmup 1 \
      --max-model-len 4608 --max-num-seqs 64 ;;
  esac
}
for config in ${TOTALS_CONFIGS:-qwen_b1 llama_b1 llama_b64}; do
  for pdl in ${TOTALS_PDL:-1 0}; do
    name=${config}_pdl$pdl
    run "$config" > "$LOGS/plain_$name.log" 2>&1
    SPECULA_PDL=$pdl CUDA_INJECTION64_PATH=$GAPS CUPTI_GAPS_MARKER=none CUPTI_GAPS_OUT="$OUT/totals_$name.txt" \
      run "$config" > "$LOGS/run_$name.log" 2>&1
    echo "== $name: $(grep -E '^TPOT|^output tokens' "$LOGS/plain_$name.log" | tr '\n' ' ')"
    echo "   under CUPTI: $(grep -E "^TPOT" "$LOGS/run_$name.log" | head -1)"
    head -28 "$OUT/totals_$name.txt"
  done
done
tar -czf "$OUT/totals_logs.tar.gz" -C "$LOGS" .
