#!/usr/bin/env bash
# What issues 6 and 7 measure on the GPU machine, in ONE call from the repository root, with the
# binaries tools/gpu/pack.sh carried in .gpu/ (carry [".gpu"]):
#   1. speculative decoding on the embedded pair (specula-tiny + specula-tiny-draft): TPOT, tokens/s
#      and acceptance at concurrency 1, 16, 64 and 256, k = 1..5, adaptive depth on and off, against
#      no speculation in the same call;
#   2. MTP on specula-tiny-moe at concurrency 1 and 64 against no speculation;
#   3. DeepSeek-V2-Lite (dummy weights) ITL at batch 1, 8 and 64 with shared-expert fusion off / on;
#   4. the cost of a draft step and of a (k+1)-token verify beside a plain decode step, for the
#      Llama-3.1-8B and Qwen3-0.6B configs (dummy weights; the cost model's measured step times).
# Prompts are windows of real Python text (tools/ and tests/ .py files, which the embedded models
# never trained on), at temperature SPEC_TEMPERATURE (default 0: greedy, as speculative-decoding
# benchmarks usually run; 1 shows sampled acceptance).
# $OUT receives spec_summary.txt, every log and JSON (spec_logs.tar.gz).
#   RUN_SPEC_SKIP="tiny compare sampled mtp dsv2 cost"   skip sections by name; RUN_SPEC_BUDGET seconds (default 420)
#   SPEC_CONCURRENCY="1 16 64 256", MTP_CONCURRENCY="1 16 64", COMPARE_CONCURRENCY="64 256",
#   COMPARE_REPS=3   the concurrencies (and repetitions) of the tiny, mtp and compare sections
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
BUDGET=${RUN_SPEC_BUDGET:-420}
SKIP=" ${RUN_SPEC_SKIP:-} "
source tools/gpu/stages.sh  # OUT, WORK (with status.txt), START

# The prompt text: this repository's own Python (not in the embedded models' training corpus).
DATASET="$WORK/prompts.txt"
prompt_dataset "$DATASET"
TEMP=${SPEC_TEMPERATURE:-0}
ITERS=${SPEC_ITERS:-3}
OUTLEN=${SPEC_OUTPUT_LEN:-128}

TINY=models/specula-tiny
DRAFT=models/specula-tiny-draft
MOE=models/specula-tiny-moe
lat() {  # lat NAME LIMIT MODEL CONCURRENCY [ARGS...]: a latency run on real weights and prompts
  local name=$1 limit=$2 model=$3 c=$4
  shift 4
  bench "$name" "$limit" latency "$model" --dataset "$DATASET" --temperature "${LAT_TEMP:-$TEMP}" --batch-size "$c" \
    --input-len 128 --output-len "$OUTLEN" --num-iters "$ITERS" --num-iters-warmup 1 --max-model-len 1024 \
    --max-num-seqs "$(( c < 8 ? 8 : c ))" "$@"
}
draft_cfg() {  # draft_cfg K ADAPTIVE
  echo "{\"method\":\"draft_model\",\"model\":\"$DRAFT\",\"num_speculative_tokens\":$1,\"adaptive\":$2}"
}

if ! skipped tiny; then
  for c in ${SPEC_CONCURRENCY:-1 16 64 256}; do
    lat "tiny_c${c}_nospec" 40 "$TINY" "$c"
    for k in 1 2 3 4 5; do lat "tiny_c${c}_k${k}_pinned" 40 "$TINY" "$c" --speculative-config "$(draft_cfg "$k" false)"; done
    for k in 3 5; do lat "tiny_c${c}_k${k}_adaptive" 40 "$TINY" "$c" --speculative-config "$(draft_cfg "$k" true)"; done
  done
fi

if ! skipped compare; then
  # Under load the figures of single runs move by +-10 % from run to run: no speculation and
  # adaptive depth alternate here, three times each, greedy and sampled.
  for c in ${COMPARE_CONCURRENCY:-64 256}; do
    for rep in $(seq 1 "${COMPARE_REPS:-3}"); do
      lat "cmp_c${c}_nospec_r${rep}" 40 "$TINY" "$c"
      lat "cmp_c${c}_adaptive_r${rep}" 40 "$TINY" "$c" --speculative-config "$(draft_cfg 3 true)"
      LAT_TEMP=1 lat "cmp_t1_c${c}_nospec_r${rep}" 40 "$TINY" "$c"
      LAT_TEMP=1 lat "cmp_t1_c${c}_adaptive_r${rep}" 40 "$TINY" "$c" --speculative-config "$(draft_cfg 3 true)"
    done
  done
fi

if ! skipped sampled; then
  # The same pair at temperature 1 (sampled drafts, lossless rejection sampling).
  for c in 1 64; do
    LAT_TEMP=1 lat "tiny_t1_c${c}_nospec" 40 "$TINY" "$c"
    LAT_TEMP=1 lat "tiny_t1_c${c}_k3_pinned" 40 "$TINY" "$c" --speculative-config "$(draft_cfg 3 false)"
    LAT_TEMP=1 lat "tiny_t1_c${c}_k3_adaptive" 40 "$TINY" "$c" --speculative-config "$(draft_cfg 3 true)"
  done
fi

if ! skipped mtp; then
  for c in ${MTP_CONCURRENCY:-1 16 64}; do
    lat "moe_c${c}_nospec" 40 "$MOE" "$c"
    for k in 1 2 3; do
      lat "moe_c${c}_mtp_k${k}_pinned" 40 "$MOE" "$c" --speculative-config "{\"method\":\"mtp\",\"num_speculative_tokens\":$k,\"adaptive\":false}"
    done
    lat "moe_c${c}_mtp_k1_adaptive" 40 "$MOE" "$c" --speculative-config '{"method":"mtp","num_speculative_tokens":1}'
    lat "moe_c${c}_mtp_k3_adaptive" 40 "$MOE" "$c" --speculative-config '{"method":"mtp","num_speculative_tokens":3}'
  done
fi

if ! skipped dsv2; then
  for b in 1 8 64; do
    for f in 0 1; do
      bench "dsv2lite_b${b}_fusion${f}" 90 latency bench/configs/DeepSeek-V2-Lite --load-format dummy \
        --shared-expert-fusion "$f" --batch-size "$b" --input-len 128 --output-len 128 --num-iters 3 \
        --num-iters-warmup 1 --max-model-len 1024 --max-num-seqs "$(( b < 8 ? 8 : b ))"
    done
  done
fi

if ! skipped cost; then
  # The draft is the target's own config with other dummy weights (the draft is seeded apart), so
  # acceptance is ~0 and every step drafts k and verifies k+1 rows. SPECULA_PROFILE=1 prints the
  # wall time of each phase (synchronised): plain decode step, (k+1)-row verify, draft step.
  for m in Llama-3.1-8B-Instruct Qwen3-0.6B; do
    cfg=bench/configs/$m
    for b in 1 16; do
      SPECULA_PROFILE=1 bench "cost_${m}_b${b}_plain" 60 latency "$cfg" --load-format dummy --batch-size "$b" \
        --input-len 128 --output-len 64 --num-iters 2 --num-iters-warmup 1 --max-model-len 1024 --max-num-seqs 16
      SPECULA_PROFILE=1 bench "cost_${m}_b${b}_k3" 60 latency "$cfg" --load-format dummy --batch-size "$b" \
        --input-len 128 --output-len 64 --num-iters 2 --num-iters-warmup 1 --max-model-len 1024 --max-num-seqs 16 \
        --speculative-config "{\"method\":\"draft_model\",\"model\":\"$cfg\",\"num_speculative_tokens\":3,\"adaptive\":false}"
      grep -E "^(runner|draft)\." "$WORK/cost_${m}_b${b}_plain.log" "$WORK/cost_${m}_b${b}_k3.log" | sed "s|$WORK/||"
    done
  done
fi

{
  echo "== run_spec: temperature $TEMP, output $OUTLEN, $ITERS iterations"
  for j in "$WORK"/*.json; do
    [ -f "$j" ] || continue
    python3 - "$j" <<'EOF'
import json, os, sys
j = json.load(open(sys.argv[1]))
name = os.path.basename(sys.argv[1])[:-5]
s = j.get("spec_decoding") or {}
extra = ""
if s:
    extra = " accept %.3f len %.2f depth %.2f" % (s.get("acceptance_rate", 0), s.get("mean_acceptance_length", 0), s.get("mean_depth", 0))
print("%-32s TPOT %8.3f ms  p90 %8.3f  TTFT %8.2f ms  %9.1f tok/s%s" % (name, j["tpot_ms"]["median"], j["tpot_ms"]["p90"], j["ttft_ms"]["median"], j["output_tokens_per_second"], extra))
EOF
  done
  cat "$WORK/status.txt"
  echo "total $(elapsed)s"
} | tee "$OUT/spec_summary.txt"
tar -czf "$OUT/spec_logs.tar.gz" -C "$WORK" .
! grep -qE "exit [1-9]|not run" "$WORK/status.txt"
