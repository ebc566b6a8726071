#!/usr/bin/env bash
# Issue 19's FP8 figures on the GPU machine in ONE call (binaries from tools/gpu/pack.sh in .gpu/:
#   PACK_NO_EXTRAS=1 tools/gpu/pack.sh specula test_backend_cuda cuda_roofline):
#   1. test_backend_cuda (every op, FP8 linear included, vs the CPU; whole models vs transformers)
#      and compute-sanitizer memcheck of the FP8 kernels;
#   2. cuda_roofline --quick: copy bandwidth, bf16 and FP8 GEMMs at Llama-3.1-8B's shapes; then
#      cuda_roofline --fp8: the FP8 projections at 1-64 rows as a step runs them, the activations'
#      quantiser, and each of cuBLASLt's first 16 FP8 GEMM candidates at 8-64 rows;
#   3. Llama-3.1-8B (dummy weights) bf16 against --quantization fp8, alternated FP8_REPS times:
#      batch 1 (20 iterations of 128 tokens after a 128-token prompt), then batch 64 and a
#      4096-token prefill once each.
# $OUT receives fp8_summary.txt (tools/gpu/fp8_summary.py: each figure against the roofline of
# the bytes it must read, measured in this call) and fp8_logs.tar.gz.
#   FP8_REPS=2 FP8_SKIP="tests memcheck roofline fp8paths b64 prefill" FP8_BUDGET=560
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
BUDGET=${FP8_BUDGET:-560}
SKIP=" ${FP8_SKIP:-} "
source tools/gpu/stages.sh  # OUT, WORK (with status.txt), START

if ! skipped tests; then
  stage test_backend_cuda 150 test_backend_cuda --gtest_brief=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\] .* ran" "$WORK/test_backend_cuda.log" | head -20
fi
if ! skipped memcheck; then
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  stage memcheck_fp8 90 "$sanitizer" --tool memcheck --leak-check no --error-exitcode 9 test_backend_cuda \
    --gtest_filter='CudaLinear.Fp8WeightsMatchCpu'
  grep -E "ERROR SUMMARY|Invalid|^\[  (PASSED|FAILED) " "$WORK/memcheck_fp8.log" | head -20
fi
if ! skipped roofline; then
  stage roofline 90 cuda_roofline --quick
  grep -E "^(copy|gemm|fp8)" "$WORK/roofline.log" | grep -vE "M=4096 .*lm_head" | head -40
fi
if ! skipped fp8paths; then
  stage fp8paths 150 cuda_roofline --fp8
  grep -E "^(quantize|decode|fp8algo)" "$WORK/fp8paths.log" | head -160
fi

LLAMA=bench/configs/Llama-3.1-8B-Instruct
common=(latency "$LLAMA" --load-format dummy --skip-tokenizer-init --max-model-len 4608)
for rep in $(seq 1 "${FP8_REPS:-2}"); do
  for q in bf16 fp8; do
    qa=()
    [ "$q" = fp8 ] && qa=(--quantization fp8)
    bench "b1_${q}_r$rep" 100 "${common[@]}" "${qa[@]}" --batch-size 1 --input-len 128 --output-len 128 \
      --num-iters 20 --num-iters-warmup 2 --max-num-seqs 8
  done
done
for q in bf16 fp8; do
  qa=()
  [ "$q" = fp8 ] && qa=(--quantization fp8)
  skipped b64 || bench "b64_${q}" 100 "${common[@]}" "${qa[@]}" --batch-size 64 --input-len 128 --output-len 256 \
    --num-iters 2 --num-iters-warmup 1 --max-num-seqs 64
  skipped prefill || bench "prefill4096_${q}" 75 "${common[@]}" "${qa[@]}" --batch-size 1 --input-len 4096 \
    --output-len 1 --num-iters 5 --num-iters-warmup 2 --max-num-seqs 1
done

python3 tools/gpu/fp8_summary.py "$WORK" "$LLAMA/config.json" | tee "$OUT/fp8_summary.txt"
cat "$WORK/status.txt" >> "$OUT/fp8_summary.txt"
echo "total $(elapsed)s" | tee -a "$OUT/fp8_summary.txt"
tar -czf "$OUT/fp8_logs.tar.gz" -C "$WORK" .
! grep -qE "exit [1-9]|not run" "$WORK/status.txt"
