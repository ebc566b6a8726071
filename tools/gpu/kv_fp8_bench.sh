#!/usr/bin/env bash
# --kv-cache-dtype fp8 on the GPU machine in ONE call (binaries from tools/gpu/pack.sh in .gpu/:
#   PACK_NO_EXTRAS=1 tools/gpu/pack.sh specula test_backend_cuda test_engine_cuda cuda_roofline):
#   1. the fp8-cache tests (attention, KV writes, the qkv prologue against the CPU; the engine with
#      graphs and eager) and compute-sanitizer memcheck of the kernel tests;
#   2. cuda_roofline --quick: the copy bandwidth the roofline uses;
#   3. Llama-3.1-8B (dummy weights) with the bf16 cache against the fp8 one, alternated KV_REPS
#      times, where attention streams the most cache: batch 64 x (2048 + 128) tokens and batch 1
#      at 8192 + 128 tokens (20 requests a run); and a 4096-token prefill (TTFT, 5 requests).
# $OUT receives kv_fp8_summary.txt (tools/gpu/kv_fp8_summary.py: TPOT spreads, tok/s, each against
# the roofline of the weight and cache bytes a step reads) and kv_fp8_logs.tar.gz.
#   KV_REPS=2 KV_SKIP="tests memcheck roofline b64 b1 prefill" KV_BUDGET=560
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
BUDGET=${KV_BUDGET:-560}
SKIP=" ${KV_SKIP:-} "
source tools/gpu/stages.sh  # OUT, WORK (with status.txt), START

tests='*CudaAttention.Fp8*:CudaKvCache.*:*CudaQkvPrologue.Fp8*'
if ! skipped tests; then
  stage test_backend_cuda_fp8kv 120 test_backend_cuda --gtest_brief=1 --gtest_filter="$tests"
  stage test_engine_cuda_fp8kv 120 test_engine_cuda --gtest_filter='CudaEngine.Fp8*'
  grep -hE "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\] .* ran|fp8 kv" "$WORK"/test_*_fp8kv.log | head -20
fi
if ! skipped memcheck; then
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  stage memcheck_fp8kv 150 "$sanitizer" --tool memcheck --leak-check no --error-exitcode 9 test_backend_cuda \
    --gtest_filter="$tests"
  grep -E "ERROR SUMMARY|Invalid|^\[  (PASSED|FAILED) " "$WORK/memcheck_fp8kv.log" | head -20
fi
if ! skipped roofline; then
  stage roofline 90 cuda_roofline --quick --attention
  grep -E "^copy|attention" "$WORK/roofline.log" | head -40
fi

LLAMA=bench/configs/Llama-3.1-8B-Instruct
common=(latency "$LLAMA" --load-format dummy --skip-tokenizer-init --max-model-len 8448)
for rep in $(seq 1 "${KV_REPS:-2}"); do
  for kv in auto fp8; do
    skipped b64 || bench "b64_${kv}_r$rep" 120 "${common[@]}" --kv-cache-dtype "$kv" --batch-size 64 \
      --input-len 2048 --output-len 128 --num-iters 2 --num-iters-warmup 1 --max-num-seqs 64
    skipped b1 || bench "b1_${kv}_r$rep" 100 "${common[@]}" --kv-cache-dtype "$kv" --batch-size 1 \
      --input-len 8192 --output-len 128 --num-iters 20 --num-iters-warmup 2 --max-num-seqs 8
    skipped prefill || bench "prefill4096_${kv}_r$rep" 75 "${common[@]}" --kv-cache-dtype "$kv" --batch-size 1 \
      --input-len 4096 --output-len 1 --num-iters 5 --num-iters-warmup 2 --max-num-seqs 1
  done
done

python3 tools/gpu/kv_fp8_summary.py "$WORK" "$LLAMA/config.json" | tee "$OUT/kv_fp8_summary.txt"
cat "$WORK/status.txt" >> "$OUT/kv_fp8_summary.txt"
echo "total $(elapsed)s" | tee -a "$OUT/kv_fp8_summary.txt"
tar -czf "$OUT/kv_fp8_logs.tar.gz" -C "$WORK" .
! grep -qE "exit [1-9]|not run" "$WORK/status.txt"
