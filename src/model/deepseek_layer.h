// One DeepSeek-V2/V3 decoder layer: multi-head latent attention (MLA) and a dense or MoE MLP.
// Exposed (rather than private to deepseek.cc) so that DeepSeek-V3's MTP module, whose transformer
// block is an ordinary decoder layer stored at model.layers.{num_hidden_layers + i}, can load and
// run it with the same code.
//
// Shapes: T tokens, H hidden, Hq heads, dn = qk_nope_head_dim, dr = qk_rope_head_dim,
// dv = v_head_dim, C = kv_lora_rank, E routed experts, K experts per token, I = moe_intermediate_size,
// S = n_shared_experts.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "model/deepseek_weights.h"
#include "model/model.h"

namespace specula {

struct MlaWeights {
  Tensor q_proj;          // [Hq (dn + dr), H] when q_lora_rank is null
  Tensor q_a_proj;        // [q_lora_rank, H] otherwise, then
  Tensor q_a_bias;        // [q_lora_rank] (attention_bias)
  Tensor q_a_layernorm;   // [q_lora_rank]
  Tensor q_b_proj;        // [Hq (dn + dr), q_lora_rank]
  Tensor kv_a_proj;       // [C + dr, H]: kv_a_proj_with_mqa, the compressed latent then the rope key
  Tensor kv_a_bias;       // [C + dr] (attention_bias)
  Tensor kv_a_layernorm;  // [C]
  Tensor w_uk_t;          // [Hq, C, dn]: kv_b_proj's key half, per head, transposed (absorbed into q)
  Tensor w_uv;            // [Hq, dv, C]: kv_b_proj's value half, per head
  Tensor o_proj;          // [H, Hq dv]
  Tensor o_bias;          // [H] (attention_bias)
};

struct DenseMlpWeights {
  Tensor gate_up_proj;  // [2 I', H]: gate_proj then up_proj
  Tensor down_proj;     // [H, I']
};

struct MoeWeights {
  Tensor router;       // F32 [E, H]: mlp.gate.weight
  Tensor router_bias;  // F32 [E]: mlp.gate.e_score_correction_bias (V3; selection only)
  StackedExperts experts;  // [E', 2I, H] / [E', H, I], E' = E + replicas * S with fusion on
  DenseMlpWeights shared;  // the shared experts as one MLP of width S I (undefined when fused or S = 0)
};

struct DeepseekLayerWeights {
  Tensor input_layernorm;           // [H]
  Tensor post_attention_layernorm;  // [H]
  MlaWeights attn;
  bool is_moe = false;
  DenseMlpWeights mlp;  // dense layers (layer < first_k_dense_replace)
  MoeWeights moe;       // MoE layers
};

// What a decoder layer needs at run time besides its weights: the dimensions, the rope table, the
// attention scale and the routing, all fixed by the config (and ModelOptions) at load time.
class DeepseekDecoder {
 public:
  // A tensor-parallel rank passes its rank_config (its heads and channels) and its communicator:
  // each block's output is then all-reduced over the ranks before it joins the residual stream.
  DeepseekDecoder(const ModelConfig& config, Backend& backend, const ModelOptions& options,
                  Communicator* communicator = nullptr);

  // Loads model.layers.{index}.* (index may be past num_hidden_layers: the MTP layers).
  DeepseekLayerWeights load_layer(DeepseekWeightLoader& loader, int64_t index) const;

  // One layer on the varlen batch, with the residual stream kept as in llama.cc:
  //   residual += x; a = MLA(RMSNorm(residual)); residual += a; returns MLP(RMSNorm(residual)).
  // x [T, H] is the previous block's output (the embeddings with residual zeroed, for the first
  // layer); the layer's latent K entries are written into `cache` before attention reads it.
  Tensor forward(const DeepseekLayerWeights& w, Tensor& x, Tensor& residual, const ForwardInput& in,
                 KVCacheLayer& cache);

  // The per-layer cache: one latent "head" of C + dr values per token, no separate V.
  int64_t cache_entry_dim() const { return latent_ + rope_dim_; }
  float attention_scale() const { return attn_scale_; }
  const MoeRouting& routing() const { return routing_; }

 private:
  MlaWeights load_mla(DeepseekWeightLoader& loader, const std::string& prefix) const;
  MoeWeights load_moe(DeepseekWeightLoader& loader, const std::string& prefix) const;
  Tensor attention(const MlaWeights& w, const Tensor& x, const ForwardInput& in, KVCacheLayer& cache);
  Tensor moe(const MoeWeights& w, const Tensor& x);
  Tensor mlp(const DenseMlpWeights& w, const Tensor& x);

  // Sums a row-parallel block's partial output over the ranks (nothing without tensor parallelism).
  void all_reduce(Tensor& partial);

  const ModelConfig& config_;
  Backend& backend_;
  Communicator* communicator_;
  int shared_expert_fusion_;
  int64_t hidden_, heads_, nope_, rope_dim_, v_dim_, latent_;
  float eps_, attn_scale_;
  bool neox_rope_;     // V3 with rope_interleave = false; otherwise interleaved pairs
  Tensor cos_sin_;     // F32 [max_position_embeddings, dr]
  MoeRouting routing_;
};

}  // namespace specula
