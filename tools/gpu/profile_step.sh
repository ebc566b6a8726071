#!/usr/bin/env bash
# Where a step's time goes on the GPU machine, at concurrency 1 on the embedded pair, in ONE call
# (binaries from tools/gpu/pack.sh carried in .gpu/):
#   1. SPECULA_PROFILE=1 phase tables (wall time per phase, synchronised) for no speculation and
#      pinned depths PROFILE_DEPTHS (default "3 5");
#   2. Nsight Compute's duration of every kernel of a window of steady decode steps (graph nodes
#      profiled one by one), summed per kernel name and per step: the GPU time a step needs, beside
#      the wall time the phases show.
# $OUT receives profile_*.log and kernels_*.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
OUT=${OUT:-$(pwd)/.gpu/out}
mkdir -p "$OUT"
DATASET=$(mktemp)
prompt_dataset "$DATASET"
TINY=models/specula-tiny
DRAFT=models/specula-tiny-draft
common=(--dataset "$DATASET" --temperature 0 --batch-size 1 --input-len 128 --output-len 128 --max-model-len 1024
  --max-num-seqs 8)
cfg() { echo "{\"method\":\"draft_model\",\"model\":\"$DRAFT\",\"num_speculative_tokens\":$1,\"adaptive\":false}"; }

SPECULA_PROFILE=1 specula bench latency "$TINY" "${common[@]}" --num-iters 5 --num-iters-warmup 1 \
  > "$OUT/profile_nospec.log" 2>&1
for k in ${PROFILE_DEPTHS:-3 5}; do
  SPECULA_PROFILE=1 specula bench latency "$TINY" "${common[@]}" --num-iters 5 --num-iters-warmup 1 \
    --speculative-config "$(cfg "$k")" > "$OUT/profile_k${k}.log" 2>&1
done

NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
kernels() {  # kernels NAME ARGS...: per-kernel GPU time over launches SKIP..SKIP+COUNT
  local name=$1
  shift
  timeout 240 "$NCU" --graph-profiling node --metrics gpu__time_duration.sum --csv \
    --launch-skip "${NCU_SKIP:-3000}" --launch-count "${NCU_COUNT:-400}" \
    specula bench latency "$TINY" "${common[@]}" --num-iters 1 --num-iters-warmup 0 "$@" \
    > "$OUT/ncu_$name.csv" 2> "$OUT/ncu_$name.err"
  python3 - "$OUT/ncu_$name.csv" > "$OUT/kernels_$name.txt" <<'EOF'
import csv, sys, collections
rows = []
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "ns")
    v = v / 1000 if unit in ("ns", "nsecond") else v * 1000 if unit in ("ms", "msecond") else v
    rows.append((r["Kernel Name"][:90], v))
tot = collections.defaultdict(float)
cnt = collections.Counter()
for n, v in rows:
    tot[n] += v
    cnt[n] += 1
s = sum(tot.values())
print("%d kernels, %.1f us in all, %.2f us mean" % (len(rows), s, s / max(1, len(rows))))
for n, v in sorted(tot.items(), key=lambda x: -x[1]):
    print("%8.1f us %5d x %6.2f us  %s" % (v, cnt[n], v / cnt[n], n))
print("-- in launch order (first 80):")
for n, v in rows[:80]:
    print("%6.2f  %s" % (v, n))
EOF
}
kernels nospec
kernels k3 --speculative-config "$(cfg 3)"
tail -n 3 "$OUT"/ncu_*.err
head -n 40 "$OUT"/kernels_*.txt
grep -hE "^(TPOT|TTFT)|SpecDecoding" "$OUT"/profile_*.log
