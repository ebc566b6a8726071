// A Llama-family decoder's weights and dims as the fused backend ops take them
// (Backend::decoder_chain, Backend::decoder_forward): pointers to the model's own tensors,
// so that a backend can run the whole decoder in one launch.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace specula {

struct DecoderLayerWeights {
  const Tensor* input_layernorm = nullptr;           // [H]
  const Tensor* qkv_proj = nullptr;                  // [(Hq + 2 Hk) D, H]
  const Tensor* qkv_bias = nullptr;                  // or null
  const Tensor* q_norm = nullptr;                    // [D] or null (Qwen3)
  const Tensor* k_norm = nullptr;                    // [D] or null
  const Tensor* o_proj = nullptr;                    // [H, Hq D]
  const Tensor* o_bias = nullptr;                    // or null
  const Tensor* post_attention_layernorm = nullptr;  // [H]
  const Tensor* gate_up_proj = nullptr;              // [2 I, H]
  const Tensor* gate_up_bias = nullptr;              // or null
  const Tensor* down_proj = nullptr;                 // [H, I]
  const Tensor* down_bias = nullptr;                 // or null
};

struct DecoderWeights {
  std::vector<DecoderLayerWeights> layers;
  const Tensor* embed_tokens = nullptr;  // [V, H]
  const Tensor* norm = nullptr;          // [H]
  const Tensor* lm_head = nullptr;       // [V, H]; an EAGLE-3 head's: [draft V, H]
  const Tensor* cos_sin = nullptr;       // F32 [max_positions, rotary_dim], neox pairs
  int rotary_dim = 0;
  int64_t num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  float eps = 1e-6f, attn_scale = 1.0f;

  // An EAGLE-3 head (model/eagle_head.h; hidden_norm set, one layer): the layer's attention reads
  // [input_layernorm(embedding), hidden_norm(g)] (qkv_proj [(Hq + 2 Hk) D, 2 H]) with g, the head's
  // hidden input, as the residual; lm_head's row d is the token draft_to_target[d].
  const Tensor* hidden_norm = nullptr;      // [H]
  const Tensor* draft_to_target = nullptr;  // I32 [draft V]; null: the identity
};

}  // namespace specula
