// The DeepSeek-V2/V3 causal LM over a flattened varlen batch:
//
//   h = embed_tokens[token_ids]                                   [T, H]
//   for each layer (deepseek_layer.h):
//     h = h + o_proj(MLA(RMSNorm(h)))                             latent KV cache, absorbed weights
//     h = h + MLP(RMSNorm(h))                                     dense, or routed + shared experts
//   logits = lm_head(RMSNorm(h)[logits_indices])                  [L, V]
#include "model/deepseek.h"

#include <string>
#include <vector>

#include "backend/communicator.h"
#include "core/logging.h"
#include "model/deepseek_layer.h"
#include "model/vocab_parallel_embedding.h"

namespace specula {
namespace {

class DeepseekModel final : public Model {
 public:
  DeepseekModel(const ModelConfig& config, WeightSource& weights, Backend& backend, const ModelOptions& options,
                const TensorParallelRank& tp);

  const ModelConfig& config() const override { return config_; }
  KVCacheSpec kv_cache_spec() const override {
    return KVCacheSpec{config_.num_hidden_layers, 1, decoder_.cache_entry_dim(), 0};
  }
  ForwardOutput forward(const ForwardInput& input, std::vector<KVCacheLayer>& kv) override;
  // Lent to the MTP layers (deepseek_mtp.h), whose checkpoint copies are usually identical.
  Tensor shared_weight(const std::string& name) const override {
    if (name == "model.embed_tokens.weight") return embed_tokens_;
    if (name == "lm_head.weight") return lm_head_;  // a tensor-parallel rank's: its rows (Model::shared_weight)
    return Tensor();
  }

 private:
  void check_input(const ForwardInput& input, const std::vector<KVCacheLayer>& kv) const;

  ModelConfig config_;
  TensorParallelRank tp_;
  ModelConfig layer_config_;  // the rank's heads and channels (config_ itself at size 1)
  Backend& backend_;
  DeepseekDecoder decoder_;
  int64_t hidden_, vocab_;
  int64_t vocab_rows_;  // lm_head rows this rank holds (vocab_ / tp.size)
  float eps_;

  Tensor embed_tokens_;  // [V / N, H]: the rank's rows
  std::vector<DeepseekLayerWeights> layers_;
  Tensor norm_;          // [H]
  Tensor lm_head_;       // [V / N, H]: the rank's rows; of the embedding itself when tie_word_embeddings
};

DeepseekModel::DeepseekModel(const ModelConfig& config, WeightSource& weights, Backend& backend,
                             const ModelOptions& options, const TensorParallelRank& tp)
    : config_(config),
      tp_(tp),
      layer_config_(rank_config(config, tp.size)),
      backend_(backend),
      decoder_(layer_config_, backend, options, tp.communicator),
      hidden_(config.hidden_size),
      vocab_(config.vocab_size),
      vocab_rows_(config.vocab_size / tp.size),
      eps_(static_cast<float>(config.rms_norm_eps)) {
  SPECULA_CHECK(tp.size == 1 || tp.communicator != nullptr, "{}: tensor-parallel rank {} of {} has no communicator",
                architecture_name(config.arch), tp.rank, tp.size);
  DeepseekWeightLoader w(layer_config_, weights, backend);
  embed_tokens_ = w.load("model.embed_tokens.weight", {vocab_rows_, hidden_});  // vocab-parallel
  layers_.reserve(config.num_hidden_layers);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) layers_.push_back(decoder_.load_layer(w, i));
  norm_ = w.load("model.norm.weight", {hidden_});
  // A tied lm_head is the embedding: both hold the rank's vocabulary rows.
  lm_head_ = config.tie_word_embeddings ? embed_tokens_ : w.load("lm_head.weight", {vocab_rows_, hidden_});
}

void DeepseekModel::check_input(const ForwardInput& in, const std::vector<KVCacheLayer>& kv) const {
  SPECULA_CHECK(in.token_ids.defined() && in.token_ids.ndim() == 1 && in.token_ids.dtype() == DType::kI32,
                "forward: token_ids must be I32 [T], got {}", in.token_ids.describe());
  const int64_t t = in.token_ids.size(0);
  SPECULA_CHECK(in.positions.defined() && in.positions.ndim() == 1 && in.positions.size(0) == t,
                "forward: positions {} must be [{}]", in.positions.describe(), t);
  SPECULA_CHECK(in.attn.num_tokens == t, "forward: attention metadata covers {} tokens, the batch has {}",
                in.attn.num_tokens, t);
  SPECULA_CHECK(static_cast<int64_t>(kv.size()) == config_.num_hidden_layers,
                "forward: {} KV cache layers given, the model has {}", kv.size(), config_.num_hidden_layers);
  SPECULA_CHECK(in.logits_indices.defined() && in.logits_indices.ndim() == 1,
                "forward: logits_indices must be I32 [L], got {}", in.logits_indices.describe());
}

ForwardOutput DeepseekModel::forward(const ForwardInput& in, std::vector<KVCacheLayer>& kv) {
  check_input(in, kv);
  backend_.reset_scratch();
  const DType dt = backend_.compute_dtype();
  const int64_t t = in.token_ids.size(0);

  Tensor x = backend_.scratch({t, hidden_}, dt);         // the current block's input / output
  Tensor residual = backend_.scratch({t, hidden_}, dt);  // the residual stream
  embed_tokens(backend_, tp_, in.token_ids, embed_tokens_, x);
  backend_.zero(residual);  // so that the first add_rms_norm makes residual = embeddings
  for (size_t i = 0; i < layers_.size(); ++i) x = decoder_.forward(layers_[i], x, residual, in, kv[i]);
  backend_.add_rms_norm(x, residual, norm_, eps_);  // final norm: x = RMSNorm(h)

  // Only the rows whose next token is wanted go through lm_head.
  const int64_t l = in.logits_indices.size(0);
  Tensor selected = backend_.scratch({l, hidden_}, dt);
  backend_.gather_rows(x, in.logits_indices, selected);
  ForwardOutput out;
  out.hidden_states = x;
  out.logits = backend_.scratch({l, vocab_}, DType::kF32);
  // This rank's vocabulary columns (all of them without tensor parallelism), in F32.
  Tensor part = tp_.size == 1 ? out.logits : backend_.scratch({l, vocab_rows_}, DType::kF32);
  if (dt == DType::kF32) {
    backend_.linear(selected, lm_head_, nullptr, part);
  } else {
    Tensor logits = backend_.scratch({l, vocab_rows_}, dt);
    backend_.linear(selected, lm_head_, nullptr, logits);
    backend_.cast(logits, part);
  }
  if (tp_.size > 1) tp_.communicator->all_gather_columns(part, out.logits);
  return out;
}

}  // namespace

std::unique_ptr<Model> create_deepseek_model(const ModelConfig& config, WeightSource& weights, Backend& backend,
                                             const ModelOptions& options, const TensorParallelRank& tp) {
  check_tensor_parallel(config, tp.size);
  auto model = std::make_unique<DeepseekModel>(config, weights, backend, options, tp);
  const int fusion = config.n_shared_experts > 0 ? options.shared_expert_fusion : 0;
  LOG_INFO("Loaded {} ({} layers, hidden {}, {} MLA heads, latent {} + rope {}, {} routed experts top-{}, {} shared{}, "
           "vocab {}) from {} onto {}",
           architecture_name(config.arch), config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
           config.kv_lora_rank, config.qk_rope_head_dim, config.n_routed_experts, config.num_experts_per_tok,
           config.n_shared_experts, fusion > 0 ? fmt::format(" fused x{}", fusion) : std::string(),
           config.vocab_size, weights.describe(), backend.name());
  return model;
}

}  // namespace specula
