#!/usr/bin/env bash
# `specula bench latency` configurations, each run by several variants (binaries or settings)
# alternated inside every repetition, so that drift during the call hits all of them.
#   AB_VARIANTS  "name=COMMAND ..." where COMMAND is a binary on PATH, optionally behind env
#                settings joined by commas: "base=specula-baseline new=specula
#                nocopy=SPECULA_COPY_STREAM=0,specula"
#   AB_CONFIGS   names from the list below (default: all of them)
#   AB_REPS      repetitions (default 3); AB_ITERS requests a concurrency-1 run (default 40)
# Configurations (the embedded models, Python prompts, concurrency 1 unless named; qwen: Qwen3-0.6B
# with dummy weights, 20 requests):
#   nospec_t0 nospec_t1            the target alone, greedy / temperature 1
#   eagle3_k7_t0 eagle3_k3_t1      EAGLE-3, pinned depth
#   eagle3_a5_t1                   EAGLE-3, adaptive k = 5, temperature 1
#   draft_a10_t0 draft_a10_t0_sync the draft model, adaptive k = 10, async (default) / synchronous
#   qwen_b1 qwen_b1_sync           Qwen3-0.6B batch 1, async (default) / synchronous
#   qwen_c64 qwen_c256 (+ _sync)   Qwen3-0.6B at 64 / 256 requests, 2 batches (output tok/s)
# $OUT receives variants_summary.txt (per config and variant: every repetition's TPOT median with
# p10 / p90 and the acceptance length or mean depth, or its output tok/s beyond batch 1, and the
# median over repetitions) and variants_logs.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
BUDGET=${RUN_AB_BUDGET:-480}
SKIP=" "
source tools/gpu/stages.sh  # OUT, WORK (with status.txt), START

DATASET="$WORK/prompts.txt"
prompt_dataset "$DATASET"
TINY=models/specula-tiny
QWEN=bench/configs/Qwen3-0.6B
spec() {  # spec METHOD K ADAPTIVE
  local model=models/specula-tiny-draft
  [ "$1" = eagle3 ] && model=models/specula-tiny-eagle3
  echo "{\"method\":\"$1\",\"model\":\"$model\",\"num_speculative_tokens\":$2,\"adaptive\":$3}"
}
config_args() {  # config_args NAME: the bench latency arguments of a configuration
  local c1=(--dataset "$DATASET" --batch-size 1 --input-len 128 --output-len 128 --num-iters "${AB_ITERS:-40}"
    --num-iters-warmup 1 --max-model-len 1024 --max-num-seqs 8)
  case $1 in
    nospec_t0) echo "$TINY" "${c1[@]}" --temperature 0 ;;
    nospec_t1) echo "$TINY" "${c1[@]}" --temperature 1 ;;
    eagle3_k7_t0) echo "$TINY" "${c1[@]}" --temperature 0 --speculative-config "$(spec eagle3 7 false)" ;;
    eagle3_k3_t1) echo "$TINY" "${c1[@]}" --temperature 1 --speculative-config "$(spec eagle3 3 false)" ;;
    eagle3_a5_t1) echo "$TINY" "${c1[@]}" --temperature 1 --speculative-config "$(spec eagle3 5 true)" ;;
    draft_a10_t0) echo "$TINY" "${c1[@]}" --temperature 0 --speculative-config "$(spec draft_model 10 true)" ;;
    draft_a10_t0_sync) echo "$TINY" "${c1[@]}" --temperature 0 --speculative-config "$(spec draft_model 10 true)" \
      --no-async-scheduling ;;
    qwen_b1) echo "$QWEN" --load-format dummy --batch-size 1 --input-len 128 --output-len 128 --num-iters 20 \
      --num-iters-warmup 1 --max-model-len 4096 --max-num-seqs 8 ;;
    qwen_b1_sync) echo "$(config_args qwen_b1)" --no-async-scheduling ;;
    qwen_c64 | qwen_c256) local c=${1#qwen_c}
      echo "$QWEN" --load-format dummy --batch-size "$c" --input-len 128 --output-len 128 --num-iters 2 \
        --num-iters-warmup 1 --max-model-len 4096 --max-num-seqs "$c" ;;
    qwen_c64_sync | qwen_c256_sync) echo "$(config_args "${1%_sync}")" --no-async-scheduling ;;
    *) echo "unknown configuration $1" >&2; return 1 ;;
  esac
}
CONFIGS=${AB_CONFIGS:-nospec_t0 nospec_t1 eagle3_k7_t0 eagle3_k3_t1 eagle3_a5_t1 draft_a10_t0 draft_a10_t0_sync qwen_b1 qwen_b1_sync qwen_c64 qwen_c64_sync qwen_c256 qwen_c256_sync}
VARIANTS=${AB_VARIANTS:-new=specula}

for rep in $(seq 1 "${AB_REPS:-3}"); do
  for config in $CONFIGS; do
    # (the JSON speculative config has no spaces, so word splitting keeps it whole)
    read -r -a args <<< "$(config_args "$config")"
    for v in $VARIANTS; do
      name=${v%%=*}
      IFS=',' read -r -a command <<< "${v#*=}"
      run="${config}__${name}__r${rep}"
      stage "$run" 90 env "${command[@]}" bench latency "${args[@]}" --output-json "$WORK/$run.json"
      grep -E "^TPOT|Speculative|error" "$WORK/$run.log" | sed "s/^/  [$run] /" | cut -c1-200
    done
  done
done

{
  summary_head
  python3 - "$WORK" <<'PY'
import glob, json, os, re, statistics, sys
work = sys.argv[1]
runs = {}
for path in sorted(glob.glob(os.path.join(work, "*__*__r*.json"))):
    config, variant, rep = re.match(r"(.+)__(.+)__r(\d+)\.json", os.path.basename(path)).groups()
    runs.setdefault(config, {}).setdefault(variant, []).append((int(rep), json.load(open(path))))
for config, variants in runs.items():
    print(f"\n{config}: TPOT ms p10/median/p90 per repetition [acceptance length | mean depth]; median of medians")
    for variant, reps in variants.items():
        cells, medians = [], []
        for _, j in sorted(reps, key=lambda r: r[0]):
            if j.get("batch_size", 1) > 1:
                medians.append(j["output_tokens_per_second"])
                cells.append(f"{medians[-1]:.0f} tok/s")
                continue
            t = j["tpot_ms"]
            medians.append(t["median"])
            s = j.get("spec_decoding") or {}
            extra = f" [{s.get('mean_acceptance_length', 0):.2f} | {s.get('mean_depth', 0):.2f}]" if s else ""
            cells.append(f"{t['p10']:.4f}/{t['median']:.4f}/{t['p90']:.4f}{extra}")
        print(f"  {variant:>8}: " + ", ".join(cells) + f"; {statistics.median(medians):.4f}")
PY
} > "$OUT/variants_summary.txt"
cat "$OUT/variants_summary.txt"
tar -C "$WORK" -czf "$OUT/variants_logs.tar.gz" . 2>/dev/null
