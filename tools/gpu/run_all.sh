#!/usr/bin/env bash
# Everything issue 5 measures, on the GPU machine, in ONE call from the repository root, with the
# binaries tools/gpu/pack.sh carried in .gpu/:
#   tools/gpu/pack.sh specula test_backend_cuda test_sampling_cuda test_engine_cuda test_app_cuda cuda_roofline
#   # device tool: carry [".gpu"], command: bash tools/gpu/run_all.sh
# Stages (each bounded by `timeout`; the whole run by RUN_ALL_BUDGET seconds, default 450):
#   1. GPU tests: test_backend_cuda (every op vs the CPU, whole models vs transformers),
#      test_sampling_cuda (device samplers vs the CPU ones), test_engine_cuda (decode graphs vs
#      eager, memory plan, engine on CUDA), test_app_cuda (speculation's graphs on CUDA),
#      compute-sanitizer memcheck of this issue's new kernels;
#   2. `specula serve --device cuda` answering the openai-client e2e tests (node), else curl;
#   3. benchmarks: cuda_roofline (copy bandwidth, bf16 matmul rate); Llama-3.1-8B config with
#      dummy weights: batch-1 decode (input 128, output 256), batch-64 decode, one 4096-token
#      prefill; Qwen3-0.6B batch 1 with and without --enforce-eager, and its throughput;
#   4. a table of figures against their rooflines (tools/gpu/summarize.py).
# $OUT receives summary.txt, summary.json, commit.txt and logs.tar.gz (every log and JSON).
#   RUN_ALL_SKIP="tests e2e memcheck"   skip stages by name (tests, memcheck, e2e, roofline, bench)
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
BUDGET=${RUN_ALL_BUDGET:-450}
SKIP=" ${RUN_ALL_SKIP:-} "
source tools/gpu/stages.sh  # OUT, WORK (with status.txt), START
cp .gpu/commit.txt "$OUT/commit.txt" 2>/dev/null || git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null
command -v nvidia-smi >/dev/null && nvidia-smi > "$WORK/nvidia-smi.txt" 2>&1

# Carried extras (pack.sh): real tokenizers for the benchmarks, the e2e suite's node_modules.
if [ -f .gpu/extras.tar.xz ]; then tar -xJf .gpu/extras.tar.xz -C .gpu; fi
if [ -d .gpu/node_modules ] && [ ! -d tests/e2e/node_modules ]; then ln -s "$(pwd)/.gpu/node_modules" tests/e2e/node_modules; fi


gtest_summary() {  # the pass/fail lines of a gtest log
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\] .* ran" "$WORK/$1.log" | head -40
}

# ---- 1. GPU tests ----
if ! skipped tests; then
  stage test_backend_cuda 150 test_backend_cuda --gtest_brief=1 --gtest_filter="${TEST_CUDA_FILTER:-*}"
  gtest_summary test_backend_cuda
  for suite in test_sampling_cuda test_engine_cuda test_app_cuda; do
    stage $suite 120 $suite --gtest_brief=1
    gtest_summary $suite
  done
fi
if ! skipped memcheck; then
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [ -x "$sanitizer" ]; then
    stage memcheck 90 "$sanitizer" --tool memcheck --leak-check no --error-exitcode 9 test_sampling_cuda \
      --gtest_filter='DeviceSampler.FlatPeakedAndMaskedRows:DeviceSampler.MatchesTheCpuSamplerWithManyExactTies'
    grep -E "ERROR SUMMARY|Invalid|^\[  (PASSED|FAILED) " "$WORK/memcheck.log" | head -20
    stage memcheck_graphs 60 "$sanitizer" --tool memcheck --leak-check no --error-exitcode 9 test_engine_cuda \
      --gtest_filter='PaddedGraphs.*'
    grep -E "ERROR SUMMARY|Invalid|^\[  (PASSED|FAILED) " "$WORK/memcheck_graphs.log" | head -20
    stage memcheck_prologue 60 "$sanitizer" --tool memcheck --leak-check no --error-exitcode 9 test_backend_cuda \
      --gtest_filter='Shapes/CudaQkvPrologue.*'
    grep -E "ERROR SUMMARY|Invalid|^\[  (PASSED|FAILED) " "$WORK/memcheck_prologue.log" | head -20
  fi
fi

# ---- 2. the server on the GPU, driven by the openai client (or curl) ----
if ! skipped e2e; then
  if command -v node >/dev/null && [ -d tests/e2e/node_modules/openai ]; then
    export SPECULA_E2E_ARGS="--device cuda --max-model-len 512 --gpu-memory-utilization 0.3"
    stage e2e_openai 90 bash tests/e2e/run.sh .gpu/bin/specula
    grep -E "^# (pass|fail)|e2e:" "$WORK/e2e_openai.log" | tail -6
  else
    command -v node >/dev/null || echo "(node is not installed here: the server is checked with curl)"
    command -v node >/dev/null && echo "(tests/e2e/node_modules absent: the server is checked with curl)"
    stage e2e_curl 60 bash tools/gpu/serve_check.sh "$WORK"
    cat "$WORK/e2e_curl.log"
  fi
fi

# ---- 3. benchmarks ----
if ! skipped roofline && command -v cuda_roofline >/dev/null; then
  stage roofline 60 cuda_roofline --quick
fi
LLAMA=bench/configs/Llama-3.1-8B-Instruct
QWEN=bench/configs/Qwen3-0.6B
tok_llama=()
tok_qwen=()
[ -f .gpu/tokenizers/llama3/tokenizer.json ] && tok_llama=(--tokenizer .gpu/tokenizers/llama3)
[ -f .gpu/tokenizers/qwen3/tokenizer.json ] && tok_qwen=(--tokenizer .gpu/tokenizers/qwen3)
if ! skipped bench; then
  bench llama8b_b1 90 latency "$LLAMA" --load-format dummy "${tok_llama[@]}" --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters 3 --num-iters-warmup 1 --max-model-len 4608 --max-num-seqs 8
  bench llama8b_b64 100 latency "$LLAMA" --load-format dummy "${tok_llama[@]}" --batch-size 64 --input-len 128 --output-len 256 \
    --num-iters 2 --num-iters-warmup 1 --max-model-len 4608 --max-num-seqs 64
  bench llama8b_prefill4096 75 latency "$LLAMA" --load-format dummy "${tok_llama[@]}" --batch-size 1 --input-len 4096 --output-len 1 \
    --num-iters 5 --num-iters-warmup 2 --max-model-len 4608 --max-num-seqs 1
  bench qwen06b_b1 50 latency "$QWEN" --load-format dummy "${tok_qwen[@]}" --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters 3 --num-iters-warmup 1 --max-model-len 4096 --max-num-seqs 8
  bench qwen06b_b1_eager 50 latency "$QWEN" --load-format dummy "${tok_qwen[@]}" --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters 3 --num-iters-warmup 1 --max-model-len 4096 --max-num-seqs 8 --enforce-eager
  bench qwen06b_throughput 60 throughput "$QWEN" --load-format dummy "${tok_qwen[@]}" --num-prompts 256 --input-len 128 \
    --output-len 256 --max-model-len 4096
fi

# ---- 4. the table ----
python3 tools/gpu/summarize.py "$WORK" "$OUT/summary.json" | tee "$OUT/summary.txt"
cat "$WORK/status.txt" >> "$OUT/summary.txt"
echo "total $(elapsed)s" | tee -a "$OUT/summary.txt"
tar -czf "$OUT/logs.tar.gz" -C "$WORK" .
# Exit status: failed tests or benchmarks show in status.txt; non-zero when any stage failed.
! grep -qE "exit [1-9]|not run" "$WORK/status.txt"
