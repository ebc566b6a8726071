#!/usr/bin/env bash
# A/B of two builds on the GPU machine in ONE call: the packed `specula` against
# `specula-baseline` (tools/gpu/pack.sh with PACK_BASELINE=path/to/other/specula), on issue 6's
# headline runs: the embedded pair with no speculation, k = AB_K adaptive and k = AB_K pinned (the
# code's speed apart from the depth the adaptive controller picks), at each of
# AB_CONCURRENCY, AB_REPS times, the two binaries alternated inside every repetition so that drift
# during the call hits both. Python prompts as run_spec.sh; concurrency 1 runs AB_ITERS_C1
# requests a run (default 20), larger concurrencies 3 batches.
# $OUT receives ab_summary.txt (per binary, config and concurrency: the median over repetitions of
# TPOT at concurrency 1, of output tok/s otherwise, with every repetition's figure) and ab_logs.tar.gz.
# AB_METHOD picks the proposer: draft_model (specula-tiny-draft, the default) or eagle3 (the
# trained head, models/specula-tiny-eagle3). AB_BASELINE_ENV="VAR=VALUE ..." makes the baseline
# the packed `specula` itself under those settings (an A/B of a switch in one binary; no
# PACK_BASELINE needed).
#   AB_CONCURRENCY="1 256" AB_REPS=3 AB_K=10 AB_ITERS_C1=20 AB_METHOD=draft_model RUN_AB_BUDGET=480
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
BUDGET=${RUN_AB_BUDGET:-480}
SKIP=" "
source tools/gpu/stages.sh  # OUT, WORK (with status.txt), START
if [ -n "${AB_BASELINE_ENV:-}" ]; then
  mkdir -p "$WORK/bin"
  printf '#!/bin/sh\nexec env %s specula "$@"\n' "$AB_BASELINE_ENV" > "$WORK/bin/specula-baseline"
  chmod +x "$WORK/bin/specula-baseline"
  export PATH="$WORK/bin:$PATH"
fi
command -v specula-baseline >/dev/null || { echo "no specula-baseline packed (PACK_BASELINE) nor AB_BASELINE_ENV"; exit 2; }

DATASET="$WORK/prompts.txt"
prompt_dataset "$DATASET"
TINY=models/specula-tiny
METHOD=${AB_METHOD:-draft_model}
case $METHOD in
  draft_model) PROPOSER=models/specula-tiny-draft ;;
  eagle3) PROPOSER=models/specula-tiny-eagle3 ;;
  *) echo "AB_METHOD: draft_model or eagle3, got $METHOD"; exit 2 ;;
esac
K=${AB_K:-10}
spec() { echo "{\"method\":\"$METHOD\",\"model\":\"$PROPOSER\",\"num_speculative_tokens\":$K,\"adaptive\":$1}"; }

run() {  # run NAME BINARY CONCURRENCY [ARGS...]
  local name=$1 bin=$2 c=$3
  shift 3
  local iters=3
  [ "$c" = 1 ] && iters=${AB_ITERS_C1:-20}
  stage "$name" 60 "$bin" bench latency "$TINY" --dataset "$DATASET" --temperature 0 --batch-size "$c" \
    --input-len 128 --output-len 128 --num-iters "$iters" --num-iters-warmup 1 --max-model-len 1024 \
    --max-num-seqs "$(( c < 8 ? 8 : c ))" --output-json "$WORK/$name.json" "$@"
}

for c in ${AB_CONCURRENCY:-1 256}; do
  for rep in $(seq 1 "${AB_REPS:-3}"); do
    for bin in specula-baseline specula; do
      run "${bin}_c${c}_nospec_r${rep}" "$bin" "$c"
      run "${bin}_c${c}_k${K}adaptive_r${rep}" "$bin" "$c" --speculative-config "$(spec true)"
      run "${bin}_c${c}_k${K}pinned_r${rep}" "$bin" "$c" --speculative-config "$(spec false)"
    done
  done
done

{
  if [ -n "${AB_BASELINE_ENV:-}" ]; then
    echo "commit: $(head -1 .gpu/commit.txt 2>/dev/null); baseline: the same binary with $AB_BASELINE_ENV"
  else
    echo "commit: $(head -1 .gpu/commit.txt 2>/dev/null); baseline: $(cat .gpu/baseline.txt 2>/dev/null)"
  fi
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null
  cat "$WORK/status.txt"
  python3 - "$WORK" <<'PY'
import glob, json, os, re, statistics, sys
work = sys.argv[1]
rows = {}
for path in sorted(glob.glob(os.path.join(work, "*.json"))):
    m = re.match(r"(specula(?:-baseline)?)_c(\d+)_(\w+?)_r(\d+)\.json", os.path.basename(path))
    if not m:
        continue
    binary, c, config, rep = m.group(1), int(m.group(2)), m.group(3), int(m.group(4))
    j = json.load(open(path))
    value = j["tpot_ms"]["median"] if c == 1 else j["output_tokens_per_second"]
    depth = (j.get("spec_decoding") or {}).get("mean_depth")
    rows.setdefault((c, config, binary), []).append((rep, value, depth))
print("concurrency | config | binary | median (runs)      [c=1: TPOT ms, lower is better; else output tok/s]")
medians = {}
for (c, config, binary), runs in sorted(rows.items()):
    runs.sort()
    med = statistics.median(v for _, v, _ in runs)
    medians[(c, config, binary)] = med
    depths = [d for _, _, d in runs if d is not None]
    extra = f"  mean depth {min(depths):.2f}-{max(depths):.2f}" if depths else ""
    print(f"{c} | {config} | {binary} | {med:.4g} ({', '.join(f'{v:.4g}' for _, v, _ in runs)}){extra}")
for (c, config, binary), med in sorted(medians.items()):
    if binary != "specula" or config == "nospec":
        continue
    for b in ("specula-baseline", "specula"):
        base = medians.get((c, "nospec", b))
        mine = medians.get((c, config, b))
        if base and mine:
            gain = base / mine if c == 1 else mine / base
            print(f"{c} | {config} vs nospec | {b} | {gain:.2f}x")
PY
} | tee "$OUT/ab_summary.txt"
tar -czf "$OUT/ab_logs.tar.gz" -C "$WORK" .
! grep -qE "exit [1-9]|not run" "$WORK/status.txt"
