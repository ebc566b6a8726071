// Small configs the model tests share: a Llama-family config of each variant's structure, and a
// real DeepSeek config (bench/configs) cut to a few small layers with its structure kept.
#pragma once

#include <algorithm>
#include <cstdint>

#include "model/config.h"

namespace specula::testing {

// 2 layers, hidden 48, 4 query / 2 kv heads of 12, MLP 80.
inline ModelConfig small_llama_config(Architecture arch, int64_t vocab = 97) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = vocab;
  c.hidden_size = 48;
  c.intermediate_size = 80;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 12;
  c.rms_norm_eps = 1e-6;
  c.max_position_embeddings = 128;
  c.rope.theta = 10000.0;
  return c;
}

// The same structure (MLA with or without q LoRA, yarn, routing, dense first layers) at small
// dims, with `shared` shared experts and `heads` MLA heads.
inline ModelConfig shrink_deepseek_config(ModelConfig c, int64_t shared, int64_t heads = 3) {
  c.num_hidden_layers = std::min<int64_t>(c.first_k_dense_replace + 2, 4);
  c.hidden_size = 96;
  c.intermediate_size = 160;
  c.moe_intermediate_size = 24;
  c.num_attention_heads = c.num_key_value_heads = heads;
  if (c.q_lora_rank) c.q_lora_rank = 48;
  c.kv_lora_rank = 40;
  c.qk_nope_head_dim = 16;
  c.qk_rope_head_dim = 8;
  c.head_dim = 8;
  c.v_head_dim = 20;
  c.n_routed_experts = c.n_group * 4;
  c.num_experts_per_tok = std::min<int64_t>(c.num_experts_per_tok, c.topk_group * 4);
  c.n_shared_experts = shared;
  c.vocab_size = 400;
  c.max_position_embeddings = 512;
  return c;
}

}  // namespace specula::testing
