#!/usr/bin/env bash
# Issue 16 point 6 on the GPU machine in ONE call (binaries from tools/gpu/pack.sh): adaptive depth
# against pinned depths and no speculation, per method, concurrency and temperature. Methods:
# draft (specula-tiny + specula-tiny-draft), eagle3 (specula-tiny + specula-tiny-eagle3), mtp
# (specula-tiny-moe's own MTP layer). For each concurrency and temperature the configurations
# (no speculation, adaptive k = ADAPTIVE_K, pinned k in ADAPTIVE_PINNED) are alternated inside each
# of ADAPTIVE_REPS repetitions. Python prompts (as eagle_bench.sh), 128 in / 128 out; concurrency
# 1 runs ADAPTIVE_C1_REQUESTS (20) requests a run (the TPOT median over them), larger ones
# ADAPTIVE_BATCHES (3) batches (output tok/s; 3 batches of 8 are ~0.1 s, mostly the adaptive
# depth's first choices: take 10 or more for the steady state).
# With ADAPTIVE_PROFILE=1, one more run each of no speculation and adaptive draft at concurrency
# ADAPTIVE_PROFILE_C (1), temperature 1 under SPECULA_PROFILE=1 (phase times, synchronised), and
# one of adaptive draft with SPECULA_LOGGING_LEVEL=DEBUG (each step's depth; trace_*.log).
# ADAPTIVE_ASYNC=1: each adaptive run once more with --async-scheduling (k5adaptiveasync).
# ADAPTIVE_TRACE="METHOD C TEMP" (e.g. "mtp 1 0"): one more adaptive run of METHOD at concurrency
# C and temperature TEMP with SPECULA_LOGGING_LEVEL=DEBUG: each step's depth and what the cost
# model weighed (trace_*.log).
# $OUT receives adaptive_summary.txt (tools/gpu/adaptive_summary.py) and adaptive_logs.tar.gz.
#   ADAPTIVE_METHODS="draft eagle3 mtp" ADAPTIVE_CONCURRENCY="1 8 64" ADAPTIVE_TEMPS="0 1"
#   ADAPTIVE_K=5 ADAPTIVE_PINNED="3 5" ADAPTIVE_REPS=2 ADAPTIVE_BUDGET=540
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
BUDGET=${ADAPTIVE_BUDGET:-540}
SKIP=" "
source tools/gpu/stages.sh  # OUT, WORK (with status.txt), START
DATASET="$WORK/prompts.txt"
prompt_dataset "$DATASET"
K=${ADAPTIVE_K:-5}
spec() {  # METHOD K ADAPTIVE
  case $1 in
    draft) echo "{\"method\":\"draft_model\",\"model\":\"models/specula-tiny-draft\",\"num_speculative_tokens\":$2,\"adaptive\":$3}" ;;
    eagle3) echo "{\"method\":\"eagle3\",\"model\":\"models/specula-tiny-eagle3\",\"num_speculative_tokens\":$2,\"adaptive\":$3}" ;;
    mtp) echo "{\"method\":\"mtp\",\"num_speculative_tokens\":$2,\"adaptive\":$3}" ;;
  esac
}
target() { [ "$1" = mtp ] && echo models/specula-tiny-moe || echo models/specula-tiny; }
run() {  # NAME TARGET CONCURRENCY TEMPERATURE [ARGS...]
  local name=$1 model=$2 c=$3 temp=$4
  shift 4
  local iters=${ADAPTIVE_BATCHES:-3}
  [ "$c" = 1 ] && iters=${ADAPTIVE_C1_REQUESTS:-20}
  bench "$name" 60 latency "$model" --dataset "$DATASET" --temperature "$temp" --batch-size "$c" --input-len 128 \
    --output-len 128 --num-iters "$iters" --num-iters-warmup 1 --max-model-len 1024 --max-num-seqs "$(( c < 8 ? 8 : c ))" "$@" \
    > /dev/null
}
if [ "${ADAPTIVE_PROFILE:-0}" = 1 ]; then
  pc=${ADAPTIVE_PROFILE_C:-1}
  SPECULA_PROFILE=1 run "profile_c${pc}_nospec" models/specula-tiny "$pc" 1
  SPECULA_PROFILE=1 run "profile_c${pc}_draft_k${K}adaptive" models/specula-tiny "$pc" 1 \
    --speculative-config "$(spec draft "$K" true)"
  SPECULA_LOGGING_LEVEL=DEBUG run "trace_c${pc}_t1_draft_k${K}adaptive" models/specula-tiny "$pc" 1 \
    --speculative-config "$(spec draft "$K" true)"
fi
if [ -n "${ADAPTIVE_TRACE:-}" ]; then
  read -r tm tc tt <<< "$ADAPTIVE_TRACE"
  SPECULA_LOGGING_LEVEL=DEBUG run "trace_c${tc}_t${tt}_${tm}_k${K}adaptive" "$(target "$tm")" "$tc" "$tt" \
    --speculative-config "$(spec "$tm" "$K" true)"
fi
METHODS=${ADAPTIVE_METHODS:-draft eagle3 mtp}
for c in ${ADAPTIVE_CONCURRENCY:-1 8 64}; do
  for temp in ${ADAPTIVE_TEMPS:-0 1}; do
    for rep in $(seq 1 "${ADAPTIVE_REPS:-2}"); do
      # No speculation twice: synchronous like the speculative runs (nospec), and as its default
      # runs it, with async scheduling on one GPU (nospecasync).
      for base in tiny moe; do
        [ $base = moe ] && [[ " $METHODS " != *" mtp "* ]] && continue
        model=$(target "$( [ $base = moe ] && echo mtp || echo draft )")
        run "c${c}_t${temp}_${base}_nospec_r$rep" "$model" "$c" "$temp" --no-async-scheduling
        run "c${c}_t${temp}_${base}_nospecasync_r$rep" "$model" "$c" "$temp"
      done
      for m in $METHODS; do
        run "c${c}_t${temp}_${m}_k${K}adaptive_r$rep" "$(target "$m")" "$c" "$temp" --speculative-config "$(spec "$m" "$K" true)"
        [ "${ADAPTIVE_ASYNC:-0}" = 1 ] && run "c${c}_t${temp}_${m}_k${K}adaptiveasync_r$rep" "$(target "$m")" "$c" "$temp" \
          --speculative-config "$(spec "$m" "$K" true)" --async-scheduling
        for p in ${ADAPTIVE_PINNED:-3 5}; do
          run "c${c}_t${temp}_${m}_k${p}pinned_r$rep" "$(target "$m")" "$c" "$temp" --speculative-config "$(spec "$m" "$p" false)"
        done
      done
    done
  done
done
{
  echo "commit: $(head -1 .gpu/commit.txt 2>/dev/null)"
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1
  cat "$WORK/status.txt"
  python3 tools/gpu/adaptive_summary.py "$WORK"
} > "$OUT/adaptive_summary.txt" 2>&1
cat "$OUT/adaptive_summary.txt"
tar -czf "$OUT/adaptive_logs.tar.gz" -C "$WORK" . 2>/dev/null
