// One Llama-family decoder layer (RMSNorm -> grouped-query attention over the paged cache ->
// RMSNorm -> SwiGLU MLP) and the loader of its HF-named weights. Shared by the Llama/Qwen decoder
// (llama.cc) and the EAGLE heads (eagle_head.h), whose single layer is this one with a wider
// attention input (EAGLE-3: [embedding | hidden], 2 H).
//
// Shapes: T tokens, H hidden, K the attention input width (H, or 2 H for EAGLE-3), Hq query heads,
// Hk kv heads, D head_dim, I intermediate.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "model/config.h"
#include "model/model.h"
#include "model/weight_quantization.h"
#include "model/weight_source.h"

namespace specula {

struct LlamaLayerWeights {
  Tensor input_layernorm;           // [H] (absent in EAGLE-1's layer)
  LinearWeight qkv_proj;            // [(Hq + 2 Hk) D, K]: q_proj, k_proj, v_proj stacked by rows
  Tensor qkv_bias;                  // [(Hq + 2 Hk) D]; Qwen2, attention_bias (else undefined)
  Tensor q_norm, k_norm;            // [D]; Qwen3 (else undefined)
  LinearWeight o_proj;              // [H, Hq D]
  Tensor o_bias;                    // [H]; Llama/Qwen3 attention_bias
  Tensor post_attention_layernorm;  // [H]
  LinearWeight gate_up_proj;        // [2 I, H]: gate_proj then up_proj
  Tensor gate_up_bias;              // [2 I]; mlp_bias
  LinearWeight down_proj;           // [H, I]
  Tensor down_bias;                 // [H]; mlp_bias
  std::optional<KVCacheScales> kv_cache_scales;  // the checkpoint's, for an fp8 cache
};

// The layer's weights as the fused decoder ops take them (backend/decoder_weights.h).
DecoderLayerWeights decoder_layer_weights(const LlamaLayerWeights& w);

// Loads HF-named tensors in the backend's compute dtype, fusing row-stacked projections so that
// each fused projection is one GEMM at run time. Linear layers follow `quantization`: FP8 weights
// and scales read from the checkpoint, or quantised here from the full-precision weights.
class LlamaWeightLoader {
 public:
  LlamaWeightLoader(WeightSource& source, Backend& backend, WeightQuantization quantization = {})
      : source_(source), backend_(backend), quantization_(std::move(quantization)) {}
  Tensor load(const std::string& name, const Shape& shape);
  // Concatenates tensors along dim 0 (weights [n_i, K] -> [sum n_i, K], biases [n_i] -> [sum n_i]).
  Tensor load_stacked(const std::vector<std::pair<std::string, Shape>>& parts);
  // A linear layer's weight from its row-stacked parts ("<module>.weight" [n_i, K] each).
  LinearWeight load_linear(const std::vector<std::pair<std::string, Shape>>& parts);
  // A one-element tensor's value (any shape of one element), or nothing where the source has no
  // tensor of that name.
  std::optional<float> load_scalar(const std::string& name);
  std::string describe() const { return source_.describe(); }

 private:
  LinearWeight load_fp8_checkpoint(const std::vector<std::pair<std::string, Shape>>& parts);
  // weight_scale of one part: a scalar (per tensor, spread over its rows) or one per row.
  std::vector<float> load_row_scales(const std::string& weight_name, int64_t rows);

  WeightSource& source_;
  Backend& backend_;
  WeightQuantization quantization_;
};

// The dimensions and tables a layer runs with, fixed by the config at load time.
class LlamaDecoderLayer {
 public:
  // `cos_sin`: F32 [max_positions, rotary_dim], owned by the caller. A tensor-parallel rank passes
  // its rank_config (its heads and intermediate channels) and its communicator: the blocks' row-
  // parallel outputs are then all-reduced before they reach the residual stream.
  LlamaDecoderLayer(const ModelConfig& config, Backend& backend, const Tensor& cos_sin,
                    Communicator* communicator = nullptr);

  // Loads layer `prefix` ("model.layers.3."): the attention reads `attention_input` columns (H for
  // a decoder, 2 H for EAGLE-3's layer); input_layernorm only when `with_input_layernorm`.
  LlamaLayerWeights load(LlamaWeightLoader& w, const std::string& prefix, int64_t attention_input,
                         bool with_input_layernorm) const;

  // Both blocks add their output to the residual stream [T, H]: the norm before a block and the
  // add after it are the prologue and epilogue of its first and last linear layer
  // (Backend::fused_linear), which CUDA fuses at decode batch sizes.
  //
  // Grouped-query self-attention over the paged cache: residual += o_proj(attention(a)), with
  // a = RMSNorm(x) * input_norm when input_norm is given, else x itself; x [T, K] (may be
  // residual when K = H). The new tokens' K/V go into `cache` first (slot -1 skips a row).
  void attention(const LlamaLayerWeights& w, const Tensor& x, const Tensor* input_norm, const ForwardInput& in,
                 KVCacheLayer& cache, Tensor& residual) const;
  // SwiGLU MLP: residual += down_proj(silu(gate_proj(a)) * up_proj(a)), a = RMSNorm(residual) *
  // post_attention_layernorm.
  void mlp(const LlamaLayerWeights& w, Tensor& residual) const;

  float eps() const { return eps_; }
  float attn_scale() const { return attn_scale_; }
  int rotary_dim() const { return rotary_dim_; }

 private:
  // residual += x @ weight^T (+ bias): the last linear layer of a block, whose output a tensor-
  // parallel rank holds only a partial sum of until the all-reduce.
  void add_to_residual(const Tensor& x, const LinearWeight& weight, const Tensor* bias, Tensor& residual) const;

  const ModelConfig& config_;
  Backend& backend_;
  const Tensor& cos_sin_;
  Communicator* communicator_;
  int64_t hidden_, num_heads_, num_kv_heads_, head_dim_, intermediate_;
  int rotary_dim_;
  float eps_, attn_scale_;
};

// cos|sin for every position the config supports, F32 [max_position_embeddings, rotary_dim] on
// the backend, computed once on the host.
Tensor make_rope_table(const ModelConfig& config, Backend& backend);

}  // namespace specula
