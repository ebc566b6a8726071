#!/usr/bin/env bash
# Where a speculative step's time goes under async scheduling, the launch-ahead on and off
# (SPECULA_LAUNCH_AHEAD=0), at concurrency 1 on the embedded pair, pinned k = PROFILE_K (5):
#   1. SPECULA_PROFILE=host phase tables (host time per phase, no added synchronisation);
#   2. the GPU's idle gaps between consecutive kernels and copies over the steady steps, i.e. what
#      the host still makes it wait, from CUPTI (tools/gpu/cupti_gaps.cc: pack the `cupti_gaps`
#      target, `tools/gpu/pack.sh specula cupti_gaps`, which puts it and libcupti in .gpu/lib).
# PROFILE_MODES (default "ahead noahead"; "sync": without async scheduling). $OUT receives ahead_*.log and gaps_*.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
OUT=${OUT:-$(pwd)/.gpu/out}
mkdir -p "$OUT"
DATASET=$(mktemp)
prompt_dataset "$DATASET"
SPEC="{\"method\":\"draft_model\",\"model\":\"models/specula-tiny-draft\",\"num_speculative_tokens\":${PROFILE_K:-5},\"adaptive\":false}"
run() {  # run NAME: bench latency at concurrency 1, async scheduling
  specula bench latency models/specula-tiny --dataset "$DATASET" --temperature 0 --batch-size 1 --input-len 128 \
    --output-len 128 --max-model-len 1024 --max-num-seqs 8 --num-iters "${PROFILE_ITERS:-10}" --num-iters-warmup 1 \
    ${ASYNC_FLAG:---async-scheduling} --speculative-config "$SPEC"
}
GAPS=$(pwd)/.gpu/lib/libcupti_gaps.so
for mode in ${PROFILE_MODES:-ahead noahead}; do
  if [ $mode = noahead ]; then export SPECULA_LAUNCH_AHEAD=0; else unset SPECULA_LAUNCH_AHEAD; fi
  if [ $mode = sync ]; then ASYNC_FLAG=--no-async-scheduling; else ASYNC_FLAG=--async-scheduling; fi
  SPECULA_PROFILE=host run > "$OUT/ahead_${mode}.log" 2>&1
  echo "== $mode: TPOT and host phases"
  grep -E "^TPOT|runner\.|draft\.|engine\." "$OUT/ahead_${mode}.log" | head -40
  if [ -f "$GAPS" ]; then
    CUDA_INJECTION64_PATH=$GAPS CUPTI_GAPS_OUT="$OUT/gaps_$mode.txt" run > "$OUT/gaps_run_$mode.log" 2>&1
    echo "-- GPU idle (CUPTI):"
    grep -E "^TPOT" "$OUT/gaps_run_$mode.log"
    cat "$OUT/gaps_$mode.txt"
  fi
done
