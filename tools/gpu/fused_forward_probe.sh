#!/usr/bin/env bash
# The persistent decoder forward (SPECULA_FUSED_DECODER_FORWARD=1, backend/cuda/cuda_decoder_forward.cu)
# on the GPU machine, in one call (binaries from `tools/gpu/pack.sh specula test_backend_cuda`):
#   1. its tests against the layer-by-layer forward and transformers' logits;
#   2. where a step's time goes (SPECULA_FUSED_FORWARD_TRACE: each phase's span and barrier, the
#      median over layers) for Qwen3-0.6B (dummy weights) and the embedded model at batch 1;
#   3. batch-1 TPOT with it off and on, alternated, PROBE_REPS times (default 2).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
timeout 300 test_backend_cuda --gtest_filter='*DecoderForward*' 2>&1 |
  grep -E "fused-forward|FAILED|PASSED|Failure|Expected|Which" | head -60
SPECULA_FUSED_DECODER_FORWARD=1 timeout 300 test_backend_cuda --gtest_filter='*CudaForward*' 2>&1 |
  grep -E "Fused decoder|FAILED|PASSED|Failure" | head -20
Q="bench/configs/Qwen3-0.6B --load-format dummy --skip-tokenizer-init --batch-size 1 --input-len 128 --output-len 128
  --num-iters 20 --num-iters-warmup 2 --max-num-seqs 8 --max-model-len 4096"
DATASET=$(mktemp)
prompt_dataset "$DATASET"
T="models/specula-tiny --dataset $DATASET --temperature 0 --batch-size 1 --input-len 128 --output-len 128
  --max-model-len 1024 --max-num-seqs 8 --num-iters 20 --num-iters-warmup 1"
for model in Q T; do
  echo "== $model trace"
  SPECULA_FUSED_FORWARD_TRACE=1 SPECULA_FUSED_DECODER_FORWARD=1 timeout 120 specula bench latency ${!model} 2>&1 |
    grep -E "trace" | head -2
done
for rep in $(seq 1 "${PROBE_REPS:-2}"); do
  for model in Q T; do
    for on in 0 1; do
      echo "== $model fused=$on rep $rep"
      SPECULA_FUSED_DECODER_FORWARD=$on timeout 120 specula bench latency ${!model} 2>&1 | grep -E "^TPOT" | head -1
    done
  done
done
