#!/usr/bin/env bash
# Async scheduling on against off, ONE binary, alternated inside every repetition (AB_REPS, default
# 3) so that drift during the call hits both (issue 15's benchmarks):
#   tiny_c1_spec    the embedded pair, draft_model k = 10 adaptive, concurrency 1, AB_ITERS_C1
#                   requests a run (default 40), TPOT p10 / median / p90 per run;
#   tiny_c1_nospec  the embedded target alone at concurrency 1 (plain decode: the deferred path);
#   qwen_b1         Qwen3-0.6B (dummy weights) batch 1, 20 requests a run, and one SPECULA_PROFILE
#                   run without async for its graph replay time (the host-work-hidden bound);
#   qwen_c64/c256   Qwen3-0.6B throughput at 64 and 256 requests (2 batches a run);
#   tiny_c1_pinned  (only when named in AB_CONFIGS) the embedded pair at pinned k = AB_PINNED_K
#                   (default 5), concurrency 1: the overlap alone, without adaptive depth's choices;
#   tiny_c64_pinned (only when named) the same at 64 requests (3 batches a run), output tok/s.
# AB_CONFIGS names the configs to run (default: all but tiny_c1_pinned). AB_MODES (default "sync
# async") may add "noahead": async scheduling with SPECULA_LAUNCH_AHEAD=0 (speculative drafts
# made after the verification reached the host, as before the launch-ahead).
# $OUT receives async_summary.txt and async_logs.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
BUDGET=${RUN_AB_BUDGET:-420}
SKIP=" "
source tools/gpu/stages.sh  # OUT, WORK (with status.txt), START

DATASET="$WORK/prompts.txt"
prompt_dataset "$DATASET"
TINY=models/specula-tiny
QWEN=bench/configs/Qwen3-0.6B
tok_qwen=()
[ -f .gpu/tokenizers/qwen3/tokenizer.json ] && tok_qwen=(--tokenizer .gpu/tokenizers/qwen3)
SPEC='{"method":"draft_model","model":"models/specula-tiny-draft","num_speculative_tokens":10,"adaptive":true}'
PINNED='{"method":"draft_model","model":"models/specula-tiny-draft","num_speculative_tokens":'"${AB_PINNED_K:-5}"',"adaptive":false}'
CONFIGS=" ${AB_CONFIGS:-tiny_c1_spec tiny_c1_nospec qwen_b1 qwen_c64 qwen_c256} "
wanted() { [[ "$CONFIGS" == *" $1 "* ]]; }
mode_flag() { [ "$1" = sync ] && echo --no-async-scheduling || echo --async-scheduling; }
tiny_c1() {  # tiny_c1 NAME MODE [ARGS...]
  local name=$1 f
  f=$(mode_flag "$2")
  shift 2
  bench "$name" 60 latency "$TINY" --dataset "$DATASET" --temperature 0 --batch-size 1 --input-len 128 \
    --output-len 128 --num-iters "${AB_ITERS_C1:-40}" --num-iters-warmup 1 --max-model-len 1024 --max-num-seqs 8 "$@" $f
}

for rep in $(seq 1 "${AB_REPS:-3}"); do
  for mode in ${AB_MODES:-sync async}; do
    f=$(mode_flag $mode)
    if [ $mode = noahead ]; then export SPECULA_LAUNCH_AHEAD=0; else unset SPECULA_LAUNCH_AHEAD; fi
    wanted tiny_c1_spec && tiny_c1 "tiny_c1_spec_${mode}_r${rep}" $mode --speculative-config "$SPEC"
    wanted tiny_c1_pinned && tiny_c1 "tiny_c1_pinned_${mode}_r${rep}" $mode --speculative-config "$PINNED"
    wanted tiny_c1_nospec && tiny_c1 "tiny_c1_nospec_${mode}_r${rep}" $mode
    wanted tiny_c64_pinned && bench "tiny_c64_pinned_${mode}_r${rep}" 60 latency "$TINY" --dataset "$DATASET" \
      --temperature 0 --batch-size 64 --input-len 128 --output-len 128 --num-iters 3 --num-iters-warmup 1 \
      --max-model-len 1024 --max-num-seqs 64 --speculative-config "$PINNED" $f
    wanted qwen_b1 && bench "qwen_b1_${mode}_r${rep}" 60 latency "$QWEN" --load-format dummy "${tok_qwen[@]}" \
      --batch-size 1 --input-len 128 --output-len 128 --num-iters 20 --num-iters-warmup 1 --max-model-len 4096 \
      --max-num-seqs 8 $f
    for c in 64 256; do
      wanted qwen_c$c && bench "qwen_c${c}_${mode}_r${rep}" 60 latency "$QWEN" --load-format dummy "${tok_qwen[@]}" \
        --batch-size $c --input-len 128 --output-len 128 --num-iters 2 --num-iters-warmup 1 --max-model-len 4096 \
        --max-num-seqs $c $f
    done
  done
done
unset SPECULA_LAUNCH_AHEAD
wanted qwen_b1 && SPECULA_PROFILE=1 bench qwen_b1_profile 60 latency "$QWEN" --load-format dummy "${tok_qwen[@]}" --batch-size 1 \
  --input-len 128 --output-len 128 --num-iters 5 --num-iters-warmup 1 --max-model-len 4096 --max-num-seqs 8 --no-async-scheduling

{
  summary_head
  python3 - "$WORK" <<'PY'
import glob, json, os, re, statistics, sys
work = sys.argv[1]
rows = {}
for path in sorted(glob.glob(os.path.join(work, "*_r*.json"))):
    m = re.match(r"(\w+?)_(sync|async|noahead)_r(\d+)\.json", os.path.basename(path))
    if not m:
        continue
    j = json.load(open(path))
    rows.setdefault((m.group(1), m.group(2)), []).append(j)
print("config | mode | per run: TPOT p10/median/p90 ms (batch 1) or output tok/s | median over runs")
med = {}
for (config, mode), runs in sorted(rows.items()):
    if config.startswith("qwen_c") or "_c64" in config:
        vals = [r["output_tokens_per_second"] for r in runs]
        desc = ", ".join(f"{v:.0f}" for v in vals)
    else:
        vals = [r["tpot_ms"]["median"] for r in runs]
        desc = ", ".join(f"{r['tpot_ms']['p10']:.4f}/{r['tpot_ms']['median']:.4f}/{r['tpot_ms']['p90']:.4f}" for r in runs)
    med[(config, mode)] = statistics.median(vals)
    depth = [(r.get("spec_decoding") or {}).get("mean_depth") for r in runs]
    depth = [d for d in depth if d is not None]
    extra = f" | mean depth {min(depth):.2f}-{max(depth):.2f}" if depth else ""
    print(f"{config} | {mode} | {desc} | {med[(config, mode)]:.4g}{extra}")
for config in sorted({c for c, _ in med}):
    s, a, n = med.get((config, "sync")), med.get((config, "async")), med.get((config, "noahead"))
    for name, base in (("sync", s), ("noahead", n)):
        if not (base and a):
            continue
        if config.startswith("qwen_c") or "_c64" in config:
            print(f"{config}: async / {name} tokens/s = {a / base:.3f}")
        else:
            print(f"{config}: async TPOT {a:.4f} vs {name} {base:.4f} ms = {100 * (1 - a / base):+.1f}% lower")
PY
  echo "-- qwen_b1_profile (sync, SPECULA_PROFILE=1):"
  grep -E "runner\.|engine\.|phase|steps" "$WORK/qwen_b1_profile.log" | head -30
} | tee "$OUT/async_summary.txt"
tar -czf "$OUT/async_logs.tar.gz" -C "$WORK" .
! grep -qE "exit [1-9]|not run" "$WORK/status.txt"
