// A decode chain of a Llama-family decoder as one backend op (Backend::decoder_chain): `steps`
// decode steps of `rows` rows (one per sequence), the token each step draws from its logits (the
// argmax, or a sample whose distribution q is kept) being the next step's input token, with every
// step's K/V written into the paged cache on the way. The
// draft model's drafts 2..k are such a chain, and an EAGLE-3 head's (DecoderWeights::hidden_norm),
// which carries its hidden state g from step to step; a backend that can run it without a kernel launch
// per op (the CUDA backend: one kernel on one thread-block cluster) makes a small draft's step several times
// cheaper than the layer-by-layer forward, whose cost at that size is launches, not work.
#pragma once

#include <cstdint>
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
  Tensor out_tokens;    // I32 [steps * rows]: step s's token at s * rows + r
  Tensor first_hidden;  // EAGLE-3 heads: [rows, H], step 0's g (each step's output is the next's)

  // How each row draws. Empty `temperatures`, or a row's 0: the argmax (ties: the lower id).
  // Otherwise, while s < q_steps[r], step s of row r draws from q = softmax(logits / temperature)
  // (an EAGLE-3 head: over its draft vocabulary, placed at the target ids) as the token sampler
  // draws a plain row (backend/token_sampler.h: fixed-point masses, the first id whose cumulative
  // mass passes uniform_draw(seeds[r], positions[s * rows + r] + draw_offset, draw_stream) of the
  // total) and writes q into row q_first_rows[r] + s of q_store (F32 [R, vocab]); later steps
  // (a row with no drafts left) take the argmax.
  std::vector<float> temperatures;    // [rows]
  std::vector<uint64_t> seeds;        // [rows]
  std::vector<int32_t> q_first_rows;  // [rows]
  std::vector<int32_t> q_steps;       // [rows]
  int draw_offset = 1;  // a step's drawn token sits this many positions after its row's position
  uint32_t draw_stream = 0;
  Tensor q_store;
  bool samples() const {
    for (float t : temperatures)
      if (t > 0.0f) return true;
    return false;
  }
};

}  // namespace specula
