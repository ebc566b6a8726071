#!/usr/bin/env bash
# Issue 16's EAGLE figures on the GPU machine in ONE call (binaries from tools/gpu/pack.sh in .gpu/):
#   1. embedded (specula-tiny + models/specula-tiny-eagle3 against specula-tiny-draft and no
#      speculation) at concurrency 1, greedy and temperature 1: each configuration EAGLE_REPS
#      times, the configurations alternated inside every repetition, 20 requests a run (TPOT
#      median over the requests);
#   2. real shapes with dummy weights: Llama-3.1-8B + the public EAGLE-3 head's shape
#      (bench/configs/EAGLE3-Llama-3.1-8B) at batch 1: a plain decode step, the (k+1)-row verify
#      and the head's steps, from SPECULA_PROFILE=1 phase times, and the TPOT they predict at the
#      published acceptance lengths (dummy heads accept nothing: every step drafts k, verifies k+1);
#      the same for Qwen3-8B + Qwen3-0.6B as a draft_model pair.
# $OUT receives eagle_summary.txt and eagle_logs.tar.gz.
#   EAGLE_REPS=3 EAGLE_K=5 EAGLE_SKIP="embedded real" EAGLE_BUDGET=540
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
BUDGET=${EAGLE_BUDGET:-540}
SKIP=" ${EAGLE_SKIP:-} "
source tools/gpu/stages.sh  # OUT, WORK (with status.txt), START

DATASET="$WORK/prompts.txt"
prompt_dataset "$DATASET"
TINY=models/specula-tiny
K=${EAGLE_K:-5}
# eagle|draft ADAPTIVE [DRAFT_SAMPLING]
eagle() { echo "{\"method\":\"eagle3\",\"model\":\"models/specula-tiny-eagle3\",\"num_speculative_tokens\":$K,\"adaptive\":$1,\"draft_sampling\":\"${2:-sampled}\"}"; }
draft() { echo "{\"method\":\"draft_model\",\"model\":\"models/specula-tiny-draft\",\"num_speculative_tokens\":$K,\"adaptive\":$1,\"draft_sampling\":\"${2:-sampled}\"}"; }

if ! skipped embedded; then
  for rep in $(seq 1 "${EAGLE_REPS:-3}"); do
    for temp in 0 1; do
      cfgs="nospec eagle3_pinned eagle3_adaptive draft_pinned draft_adaptive"
      # At temperature 1 the drafts may also be the proposer's argmax (deterministic, chained on the device).
      [ "$temp" = 1 ] && cfgs="$cfgs eagle3_pinned_argmax eagle3_adaptive_argmax draft_pinned_argmax"
      for cfg in $cfgs; do
        args=()
        case $cfg in
          eagle3_pinned) args=(--speculative-config "$(eagle false)") ;;
          eagle3_adaptive) args=(--speculative-config "$(eagle true)") ;;
          draft_pinned) args=(--speculative-config "$(draft false)") ;;
          draft_adaptive) args=(--speculative-config "$(draft true)") ;;
          eagle3_pinned_argmax) args=(--speculative-config "$(eagle false argmax)") ;;
          eagle3_adaptive_argmax) args=(--speculative-config "$(eagle true argmax)") ;;
          draft_pinned_argmax) args=(--speculative-config "$(draft false argmax)") ;;
        esac
        bench "emb_t${temp}_${cfg}_r${rep}" 60 latency "$TINY" --dataset "$DATASET" --temperature "$temp" --batch-size 1 \
          --input-len 128 --output-len 128 --num-iters 20 --num-iters-warmup 1 --max-model-len 1024 --max-num-seqs 8 \
          "${args[@]}"
      done
    done
  done
fi

if ! skipped real; then
  L=bench/configs/Llama-3.1-8B-Instruct
  H=bench/configs/EAGLE3-Llama-3.1-8B
  common=(--load-format dummy --temperature 0 --batch-size 1 --input-len 128 --output-len 64 --num-iters 3 --num-iters-warmup 1
          --max-model-len 1024 --max-num-seqs 8)
  bench real_llama_plain 90 latency "$L" "${common[@]}"
  for k in 3 5; do
    bench "real_llama_eagle3_k$k" 90 latency "$L" "${common[@]}" \
      --speculative-config "{\"method\":\"eagle3\",\"model\":\"$H\",\"num_speculative_tokens\":$k,\"adaptive\":false}"
  done
  # The phases of a step (synchronised, so slower than the runs above; for the split only).
  SPECULA_PROFILE=1 bench real_llama_eagle3_k3_profile 90 latency "$L" "${common[@]}" \
    --speculative-config "{\"method\":\"eagle3\",\"model\":\"$H\",\"num_speculative_tokens\":3,\"adaptive\":false}"
  bench real_qwen8b_plain 90 latency bench/configs/Qwen3-8B "${common[@]}"
  bench real_qwen8b_draft06_k3 90 latency bench/configs/Qwen3-8B "${common[@]}" \
    --speculative-config "{\"method\":\"draft_model\",\"model\":\"bench/configs/Qwen3-0.6B\",\"num_speculative_tokens\":3,\"adaptive\":false}"
fi

{
  summary_head
  python3 tools/gpu/eagle_summary.py "$WORK"
} > "$OUT/eagle_summary.txt" 2>&1
cat "$OUT/eagle_summary.txt"
tar -czf "$OUT/eagle_logs.tar.gz" -C "$WORK" . 2>/dev/null
