#!/usr/bin/env bash
# Adaptive depth of two builds (or env variants of one) in ONE call on the GPU machine: for each
# configuration "METHOD CONCURRENCY TEMPERATURE" of AB_CONFIGS, no speculation, then adaptive
# k = AB_K with specula-baseline (PACK_BASELINE=... tools/gpu/pack.sh) and with specula (each first
# in turn), then once per AB_VARIANTS entry (an env assignment such as
# SPECULA_FEATURELESS_GRAPHS=0, applied to specula) and once per depth of AB_PINNED (specula with
# that depth pinned: what issue 16 point 6 compares adaptive depth with), alternated inside each
# of AB_REPS repetitions. Embedded models (MTP on specula-tiny-moe), Python prompts cut from this
# repository, 128 in / 128 out, async scheduling (the default), 40 requests a concurrency-1 run
# and 20 batches otherwise. Prints, per row, each repetition's TPOT median [p10-p90], output tok/s
# and mean depth; $OUT gets ab_adaptive.txt and ab_adaptive_logs.tar.gz.
# AB_BASELINE=0 leaves specula-baseline out (variants of one build: none packed).
#   AB_CONFIGS="eagle3 1 1;eagle3 8 1;eagle3 1 0;mtp 1 0" AB_VARIANTS="" AB_PINNED="1 3" AB_REPS=2 AB_K=5 AB_BUDGET=280
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
BUDGET=${AB_BUDGET:-280}
SKIP=" "
source tools/gpu/stages.sh
DATASET="$WORK/prompts.txt"
prompt_dataset "$DATASET"
K=${AB_K:-5}
spec() {  # METHOD [K ADAPTIVE]
  local k=${2:-$K} adaptive=${3:-true}
  case $1 in
    draft) echo "{\"method\":\"draft_model\",\"model\":\"models/specula-tiny-draft\",\"num_speculative_tokens\":$k,\"adaptive\":$adaptive}" ;;
    eagle3) echo "{\"method\":\"eagle3\",\"model\":\"models/specula-tiny-eagle3\",\"num_speculative_tokens\":$k,\"adaptive\":$adaptive}" ;;
    mtp) echo "{\"method\":\"mtp\",\"num_speculative_tokens\":$k,\"adaptive\":$adaptive}" ;;
  esac
}
target() { [ "$1" = mtp ] && echo models/specula-tiny-moe || echo models/specula-tiny; }
run() {  # NAME MODEL C TEMP ARGS...
  local name=$1 model=$2 c=$3 t=$4
  shift 4
  local iters=20
  [ "$c" = 1 ] && iters=40
  bench "$name" 40 latency "$model" --dataset "$DATASET" --temperature "$t" --batch-size "$c" --input-len 128 \
    --output-len 128 --num-iters "$iters" --num-iters-warmup 1 --max-model-len 1024 --max-num-seqs "$(( c < 8 ? 8 : c ))" \
    --async-scheduling "$@" > /dev/null
}
IFS=';' read -r -a configs <<< "${AB_CONFIGS:-eagle3 1 1;eagle3 8 1;eagle3 1 0;mtp 1 0}"
read -r -a variants <<< "${AB_VARIANTS:-}"
read -r -a pinned <<< "${AB_PINNED:-}"
for rep in $(seq 1 "${AB_REPS:-2}"); do
  for cfg in "${configs[@]}"; do
    read -r m c t <<< "$cfg"
    row="${m}_c${c}_t${t}"
    run "${row}_nospec_r$rep" "$(target "$m")" "$c" "$t"
    # (the two builds' order swapped every repetition: what drifts in a call hits both alike)
    [ $((rep % 2)) = 0 ] && run "${row}_candidate_r$rep" "$(target "$m")" "$c" "$t" --speculative-config "$(spec "$m")"
    [ "${AB_BASELINE:-1}" = 0 ] ||
      SPECULA_BIN=specula-baseline run "${row}_baseline_r$rep" "$(target "$m")" "$c" "$t" --speculative-config "$(spec "$m")"
    [ $((rep % 2)) = 1 ] && run "${row}_candidate_r$rep" "$(target "$m")" "$c" "$t" --speculative-config "$(spec "$m")"
    for v in "${variants[@]}"; do
      (export "${v?}"; run "${row}_${v//[^A-Za-z0-9.]/_}_r$rep" "$(target "$m")" "$c" "$t" --speculative-config "$(spec "$m")")
    done
    for p in "${pinned[@]}"; do
      run "${row}_pinned_k${p}_r$rep" "$(target "$m")" "$c" "$t" --speculative-config "$(spec "$m" "$p" false)"
    done
  done
done
{
  echo "candidate: $(head -1 .gpu/commit.txt 2>/dev/null); baseline: $(cat .gpu/baseline.txt 2>/dev/null)"
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1
  grep -v "exit 0" "$WORK/status.txt"
  python3 - "$WORK" <<'PY'
import collections, glob, json, os, sys
rows = collections.defaultdict(list)
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*_r*.json"))):
    d = json.load(open(f))
    t = d.get("tpot_ms") or {}
    s = d.get("spec_decoding") or {}
    rows[os.path.basename(f)[:-5].rsplit("_r", 1)[0]].append(
        "%.4f [%.4f-%.4f] %.0f tok/s depth %.2f" % (t.get("median", 0), t.get("p10", 0), t.get("p90", 0),
                                                    d.get("output_tokens_per_second", 0), s.get("mean_depth", 0)))
for k in sorted(rows):
    print(k, " | ".join(rows[k]))
PY
} > "$OUT/ab_adaptive.txt" 2>&1
cat "$OUT/ab_adaptive.txt"
tar -czf "$OUT/ab_adaptive_logs.tar.gz" -C "$WORK" . 2>/dev/null
