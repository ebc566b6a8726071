#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after `source tools/gpu/env.sh`, with the
# binaries that tools/gpu/pack.sh carried in .gpu/bin:
#   1. every GPU test suite (tests/unit/backend/cuda and the cuda_*_test.cc files of the other
#      folders): test_backend_cuda (every CUDA op against the CPU backend, whole models against
#      transformers), test_sampling_cuda (device samplers against the CPU ones), test_engine_cuda
#      (decode graphs, memory plan, the engine on CUDA), test_app_cuda (speculation's graphs and
#      fused chains through the whole engine), each that was packed;
#   2. compute-sanitizer memcheck over a subset of test_backend_cuda (every kernel family once)
#      and, when test_app_cuda is packed, over async scheduling's stress workload (memcheck and
#      synccheck; STRESS_SANITIZER_TOOLS adds racecheck);
#   3. cuda_roofline (copy bandwidth, GEMM rate, attention), when packed.
# Logs go under $OUT (the device tool's output folder). Exit status: the first failing suite's
# (77: a suite skipped tests, i.e. something it needs was missing), or memcheck's.
#   RUN_TESTS_FILTER='CudaAttention.*' bash tools/gpu/run_tests.sh   to run a subset
#   SKIP_MEMCHECK=1 / SKIP_ROOFLINE=1                                 to skip a stage
set -uo pipefail
OUT=${OUT:-$(pwd)/.gpu/out}
mkdir -p "$OUT"
command -v nvidia-smi >/dev/null && nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
cp .gpu/commit.txt "$OUT/commit.txt" 2>/dev/null || true  # written by pack.sh

status=0
for suite in test_backend_cuda test_sampling_cuda test_engine_cuda test_app_cuda; do
  command -v $suite >/dev/null || { echo "== $suite not packed"; continue; }
  echo "== $suite"
  start=$(date +%s)
  $suite --gtest_brief=1 --gtest_filter="${RUN_TESTS_FILTER:-*}" > "$OUT/$suite.log" 2>&1
  rc=$?
  # The counts first: a suite's ~70 "cuda-model" error lines must not push them out of the head.
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|tests skipped" "$OUT/$suite.log" | head -10
  grep -E "Failure|error|cuda-model" "$OUT/$suite.log" | head -60
  echo "$suite exit $rc in $(( $(date +%s) - start ))s (log: $suite.log)"
  [ $status -eq 0 ] && status=$rc
done

if [ -z "${SKIP_MEMCHECK:-}" ]; then
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [ -x "$sanitizer" ]; then
    echo "== compute-sanitizer memcheck"
    start=$(date +%s)
    # One case per kernel family; memcheck slows kernels 10-100x.
    filter='CudaMemory.CastsBetweenFloatTypesLikeTheCpu:CudaRowwise.*:CudaKvCache.*:CudaLinear.MatchesCpu:CudaGraph.*:CudaSampling.*'
    filter+=':Decode/CudaAttention.MatchesCpu/decode_long_splits:Decode/CudaAttention.MatchesCpu/decode_d24_dv16'
    filter+=':Decode/CudaAttention.MatchesCpu/decode_long_splits_8kv:Decode/CudaAttention.MatchesCpu/decode_batch64:Decode/CudaAttention.MatchesCpu/verify_long_splits:Prefill/CudaAttention.MatchesCpu/mixed_prefill_decode'
    filter+=':Prefill/CudaAttention.MatchesCpu/prefill_d200:Prefill/CudaAttention.MatchesCpu/mixed_block5'
    filter+=':CudaForward.ChunkedBatchedScheduleMatchesTransformers/qwen3_qknorm_headdim'
    "$sanitizer" --tool memcheck --leak-check no --error-exitcode 9 test_backend_cuda --gtest_filter="$filter" \
      > "$OUT/memcheck.log" 2>&1
    mc=$?
    grep -E "ERROR SUMMARY|Invalid|^\[  (PASSED|FAILED) " "$OUT/memcheck.log" | head -40
    echo "memcheck exit $mc in $(( $(date +%s) - start ))s (log: memcheck.log)"
    [ $status -eq 0 ] && status=$mc
    if command -v test_app_cuda >/dev/null; then
      # Async scheduling's stress workload (random arrivals and aborts, a step always in flight),
      # shortened: the sanitizers slow every kernel. memcheck with STRESS_MEMCHECK_REQUESTS
      # requests per configuration, synccheck (barrier misuse) with STRESS_RACECHECK_REQUESTS.
      # racecheck (shared-memory hazards) only when named in STRESS_SANITIZER_TOOLS, without CUDA
      # graphs (under it the process died at their capture on the H200) and slowly: 3 requests of
      # one configuration take minutes (STRESS_CONFIG names the ones to run).
      for tool in ${STRESS_SANITIZER_TOOLS:-memcheck synccheck}; do
        echo "== compute-sanitizer $tool: CudaAsyncScheduling.StressRandomArrivalsAndAborts"
        start=$(date +%s)
        n=${STRESS_MEMCHECK_REQUESTS:-120}
        extra=(--leak-check no)
        [ "$tool" != memcheck ] && n=${STRESS_RACECHECK_REQUESTS:-40} && extra=()
        eager=0
        [ "$tool" = racecheck ] && eager=1
        # synccheck reports barrier divergence in every clustered launch of more than a few
        # clusters, a kernel without any included (synccheck_clusters.sh): the plain-row sampler
        # runs one block a row under it, so that what it reports is the rest's.
        clusters=1
        [ "$tool" = synccheck ] && clusters=0
        SPECULA_PLAIN_ROW_CLUSTERS=$clusters SPECULA_STRESS_EAGER=$eager SPECULA_STRESS_CONFIG=${STRESS_CONFIG:-} SPECULA_STRESS_REQUESTS=$n "$sanitizer" --tool "$tool" "${extra[@]}" --error-exitcode 9 test_app_cuda \
          --gtest_filter='CudaAsyncScheduling.StressRandomArrivalsAndAborts' > "$OUT/${tool}_async_stress.log" 2>&1
        mc=$?
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race|Barrier|^\[  (PASSED|FAILED) " "$OUT/${tool}_async_stress.log" | head -20
        echo "$tool (async stress, $n requests) exit $mc in $(( $(date +%s) - start ))s (log: ${tool}_async_stress.log)"
        [ $status -eq 0 ] && status=$mc
      done
    fi
  else
    echo "== compute-sanitizer not found; memcheck skipped"
  fi
fi

if [ -z "${SKIP_ROOFLINE:-}" ] && command -v cuda_roofline >/dev/null; then
  echo "== cuda_roofline"
  cuda_roofline ${ROOFLINE_ARGS:-} 2>&1 | tee "$OUT/roofline.txt"
fi
exit $status
