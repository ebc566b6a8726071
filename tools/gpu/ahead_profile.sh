#!/usr/bin/env bash
# Where a speculative step's time goes under async scheduling, the launch-ahead on and off
# (SPECULA_LAUNCH_AHEAD=0), at concurrency 1 on the embedded pair, pinned k = PROFILE_K (5):
#   1. SPECULA_PROFILE=host phase tables (host time per phase, no added synchronisation);
#   2. with Nsight Systems (when installed): the GPU's idle gaps between consecutive kernels and
#      copies over the steady steps (tools/gpu/gpu_gaps.py), i.e. what the host still makes it wait.
# $OUT receives ahead_*.log and gaps_*.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
OUT=${OUT:-$(pwd)/.gpu/out}
mkdir -p "$OUT"
DATASET=$(mktemp)
find tools tests -name '*.py' -print0 | sort -z | xargs -0 cat > "$DATASET"
SPEC="{\"method\":\"draft_model\",\"model\":\"models/specula-tiny-draft\",\"num_speculative_tokens\":${PROFILE_K:-5},\"adaptive\":false}"
run() {  # run NAME: bench latency at concurrency 1, async scheduling
  specula bench latency models/specula-tiny --dataset "$DATASET" --temperature 0 --batch-size 1 --input-len 128 \
    --output-len 128 --max-model-len 1024 --max-num-seqs 8 --num-iters "${PROFILE_ITERS:-10}" --num-iters-warmup 1 \
    --async-scheduling --speculative-config "$SPEC"
}
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
for mode in ahead noahead; do
  if [ $mode = noahead ]; then export SPECULA_LAUNCH_AHEAD=0; else unset SPECULA_LAUNCH_AHEAD; fi
  SPECULA_PROFILE=host run > "$OUT/ahead_${mode}.log" 2>&1
  echo "== $mode: TPOT and host phases"
  grep -E "^TPOT|runner\.|draft\.|engine\." "$OUT/ahead_${mode}.log" | head -40
  if [ -n "$NSYS" ]; then
    "$NSYS" profile -o "$OUT/nsys_$mode" --force-overwrite true --trace cuda run > /dev/null 2>&1
    "$NSYS" export --type sqlite -o "$OUT/nsys_$mode.sqlite" --force-overwrite true "$OUT/nsys_$mode.nsys-rep" >/dev/null 2>&1
    python3 tools/gpu/gpu_gaps.py "$OUT/nsys_$mode.sqlite" > "$OUT/gaps_$mode.txt" 2>&1
    cat "$OUT/gaps_$mode.txt"
    rm -f "$OUT/nsys_$mode.nsys-rep"
  fi
done
