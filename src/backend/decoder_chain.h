// A greedy decode chain of a Llama-family decoder as one backend op (Backend::decoder_greedy_chain):
// `steps` decode steps of `rows` rows (one per sequence), the argmax of each step's logits being
// the next step's input token, with every step's K/V written into the paged cache on the way. The
// draft model's drafts 2..k are such a chain, and an EAGLE-3 head's (DecoderWeights::hidden_norm),
// which carries its hidden state g from step to step; a backend that can run it without a kernel launch
// per op (the CUDA backend: one kernel on one thread-block cluster) makes a small draft's step several times
// cheaper than the layer-by-layer forward, whose cost at that size is launches, not work.
#pragma once

#include <vector>

#include "backend/attention_metadata.h"
#include "backend/decoder_weights.h"
#include "core/tensor.h"

namespace specula {

struct DecoderChain : DecoderWeights {
  std::vector<KVCacheLayer>* kv = nullptr;  // one per layer: [num_blocks, block_size, Hk, D]
  int block_size = 0;

  // The chain. Row r of step s sits at s * rows + r in positions and slots; it attends to keys
  // 0..position of its sequence (block_tables row r), its own K/V written at the slot first (-1:
  // not written).
  int rows = 0;
  int steps = 0;
  Tensor first_tokens;  // I32 [rows]: step 0's input tokens
  Tensor positions;     // I32 [steps * rows]
  Tensor slots;         // I64 [steps * rows]
  Tensor block_tables;  // I32 [rows, width]
  Tensor out_tokens;    // I32 [steps * rows]: step s's argmax at s * rows + r (ties: the lower id)
  Tensor first_hidden;  // EAGLE-3 heads: [rows, H], step 0's g (each step's output is the next's)
};

}  // namespace specula
