#!/usr/bin/env bash
# What the adaptive depth decides, step by step, on the GPU machine (binaries from tools/gpu/pack.sh):
# the embedded target at concurrency 1 with each proposer, adaptive and pinned, greedy and at
# temperature 1, with SPECULA_LOGGING_LEVEL=DEBUG (every step's depth, probe, proposer time and
# target step time, and the learned cost table at exit; the steps stay unsynchronised, unlike
# SPECULA_PROFILE=1). $OUT receives trace_summary.txt (depth histogram and the exit table per run)
# and trace_logs.tar.gz.
#   TRACE_K=5 TRACE_TEMPS="0 1" TRACE_METHODS="draft eagle3" TRACE_BUDGET=240
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
BUDGET=${TRACE_BUDGET:-240}
SKIP=" ${TRACE_SKIP:-} "
source tools/gpu/stages.sh  # OUT, WORK (with status.txt), START
DATASET="$WORK/prompts.txt"
find tools tests -name '*.py' -print0 | sort -z | xargs -0 cat > "$DATASET"
K=${TRACE_K:-5}
spec() {  # METHOD ADAPTIVE
  case $1 in
    draft) echo "{\"method\":\"draft_model\",\"model\":\"models/specula-tiny-draft\",\"num_speculative_tokens\":$K,\"adaptive\":$2}" ;;
    eagle3) echo "{\"method\":\"eagle3\",\"model\":\"models/specula-tiny-eagle3\",\"num_speculative_tokens\":$K,\"adaptive\":$2}" ;;
  esac
}
for temp in ${TRACE_TEMPS:-0 1}; do
  bench "t${temp}_nospec" 60 latency models/specula-tiny --dataset "$DATASET" --temperature "$temp" --batch-size 1 \
    --input-len 128 --output-len 128 --num-iters 20 --num-iters-warmup 1 --max-model-len 1024 --max-num-seqs 8
  for m in ${TRACE_METHODS:-draft eagle3}; do
    for a in true false; do
      SPECULA_LOGGING_LEVEL=$([ $a = true ] && echo DEBUG || echo INFO) \
        bench "t${temp}_${m}_adaptive_${a}" 60 latency models/specula-tiny --dataset "$DATASET" --temperature "$temp" \
        --batch-size 1 --input-len 128 --output-len 128 --num-iters 20 --num-iters-warmup 1 --max-model-len 1024 \
        --max-num-seqs 8 --speculative-config "$(spec "$m" "$a")"
    done
  done
done
{
  echo "commit: $(head -1 .gpu/commit.txt 2>/dev/null)"
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1
  cat "$WORK/status.txt"
  for f in "$WORK"/*.log; do
    echo "== $(basename "$f" .log)"
    grep -E "^TPOT|Mean speculative depth" "$f" | tail -2
    grep -o "adaptive depth: 1 decoding, depth [0-9]*[^,]*" "$f" | sort | uniq -c | sort -rn | head -8
    grep -A8 "SPECULA_PROFILE: adaptive depth" "$f" | grep -E "acceptance|batch   1" | cut -c1-400
  done
} > "$OUT/trace_summary.txt" 2>&1
cat "$OUT/trace_summary.txt"
tar -czf "$OUT/trace_logs.tar.gz" -C "$WORK" . 2>/dev/null
