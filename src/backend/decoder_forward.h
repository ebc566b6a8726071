// One forward of a Llama-family decoder over a small flattened varlen batch as one backend op
// (Backend::decoder_forward): what Model::forward computes for decode steps, speculative
// verification and short chunks (at most kMaxDecoderForwardRows rows), with the new K/V written
// into the paged cache. For small models a step's cost is its ~7 launches a layer, not its
// weights (Qwen3-0.6B at batch 1: ~200 kernels of 3-10 us); a backend may run the whole decoder
// in one launch instead (the CUDA backend: one persistent kernel over the SMs, opt-in while it is
// slower than the launches it replaces: backend/cuda/cuda_decoder_forward.cc).
#pragma once

#include <vector>

#include "backend/attention_metadata.h"
#include "backend/decoder_weights.h"
#include "core/tensor.h"

namespace specula {

constexpr int kMaxDecoderForwardRows = 16;

struct DecoderForward : DecoderWeights {
  std::vector<KVCacheLayer>* kv = nullptr;  // one per layer: [num_blocks, block_size, Hk, D]
  // The batch, as Model::forward's input (model/model.h, backend/attention_metadata.h).
  const Tensor* token_ids = nullptr;       // I32 [T]
  const Tensor* positions = nullptr;       // I32 [T]
  const AttentionMetadata* attn = nullptr;
  const Tensor* logits_indices = nullptr;  // I32 [L]
  // Outputs, set (scratch memory) by a backend that ran the forward: F32 [L, V] logits, and the
  // final norm's [T, H] rows in the compute dtype (ForwardOutput::hidden_states).
  Tensor logits;
  Tensor hidden_states;
  // I32 [2], zero before the call and after it: the launch's grid barrier. One per model, since
  // two forwards that shared it could not run at once.
  Tensor grid_sync;
};

}  // namespace specula
