#!/usr/bin/env bash
# Issue 20's tensor-parallel figures on a machine of 2 (or more) GPUs in ONE call (binaries from
#   PACK_NO_EXTRAS=1 tools/gpu/pack.sh specula test_app_cuda):
#   1. test_app_cuda's CudaTensorParallel.* (the split embedded target serves transformers'
#      greedy tokens, with draft_model and eagle3, sync and async);
#   2. Llama-3.1-8B (dummy weights): batch-1 TPOT of TP 1 with graphs, TP 1 eager and TP 2
#      (eager: the ranks' steps are not captured), alternated TP_REPS times, 20 requests each;
#      then batch 64 throughput once each.
# $OUT receives tp_summary.txt and tp_logs.tar.gz.   TP_REPS=2 TP_SKIP="tests b64" TP_BUDGET=540
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
BUDGET=${TP_BUDGET:-540}
SKIP=" ${TP_SKIP:-} "
source tools/gpu/stages.sh  # OUT, WORK (with status.txt), START

{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; nvidia-smi topo -m; } > "$WORK/gpus.txt" 2>&1
if ! skipped tests; then
  stage tp_tests 240 test_app_cuda --gtest_brief=1 --gtest_filter='CudaTensorParallel.*'
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\] .* ran|Failure|error" "$WORK/tp_tests.log" | head -20
fi

LLAMA=bench/configs/Llama-3.1-8B-Instruct
common=(latency "$LLAMA" --load-format dummy --skip-tokenizer-init --max-model-len 4096)
variant_args() {
  case $1 in
    tp1) ;;
    tp1_eager) echo --enforce-eager ;;
    tp2) echo -tp 2 ;;
  esac
}
for rep in $(seq 1 "${TP_REPS:-2}"); do
  for v in tp1 tp1_eager tp2; do
    bench "b1_${v}_r$rep" 90 "${common[@]}" $(variant_args $v) --batch-size 1 --input-len 128 --output-len 128 \
      --num-iters 20 --num-iters-warmup 2 --max-num-seqs 8
  done
done
if ! skipped b64; then
  for v in tp1 tp2; do
    bench "b64_${v}" 100 "${common[@]}" $(variant_args $v) --batch-size 64 --input-len 128 --output-len 256 \
      --num-iters 2 --num-iters-warmup 1 --max-num-seqs 64
  done
fi

{
  echo "commit: $(head -1 .gpu/commit.txt 2>/dev/null)"
  cat "$WORK/gpus.txt"
  python3 - "$WORK" <<'PY'
import glob, json, os, re, sys
work = sys.argv[1]
for path in sorted(glob.glob(os.path.join(work, "b*_*.json"))):
    j = json.load(open(path))
    name = os.path.basename(path)[:-5]
    t = j.get("tpot_ms") or {}
    if name.startswith("b1_"):
        print(f"{name}: TPOT p10/median/p90 {t.get('p10', 0):.3f}/{t.get('median', 0):.3f}/{t.get('p90', 0):.3f} ms")
    else:
        print(f"{name}: {j.get('output_tokens_per_second', 0):.0f} output tok/s, TPOT median {t.get('median', 0):.3f} ms")
PY
  cat "$WORK/status.txt"
  echo "total $(elapsed)s"
} | tee "$OUT/tp_summary.txt"
tar -czf "$OUT/tp_logs.tar.gz" -C "$WORK" .
! grep -qE "exit [1-9]|not run" "$WORK/status.txt"
