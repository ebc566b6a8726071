// The Llama-family decoder over a flattened varlen batch (T tokens of many sequences at once):
//
//   h = embed_tokens[token_ids]                                  [T, H]
//   for each layer:
//     h = h + o_proj(Attention(RoPE(q), RoPE(k), v))             q, k, v from RMSNorm(h)
//     h = h + down_proj(silu(gate_proj(x)) * up_proj(x))         x = RMSNorm(h)
//   logits = lm_head(RMSNorm(h)[logits_indices])                 [L, V]
//
// The residual stream lives in `residual`; each block reads RMSNorm(h) and adds its output to it
// (LlamaDecoderLayer: the norm and the add ride on the block's first and last linear layer).
// Variants: Qwen2 adds q/k/v biases (and
// Llama's attention_bias adds o too, mlp_bias the MLP's), Qwen3 RMS-normalises each q and k head
// over head_dim before RoPE, and head_dim may differ from hidden_size / num_attention_heads.
//
// Shapes: H hidden, Hq query heads, Hk kv heads, D head_dim, I intermediate, V vocab.
#include "model/llama.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/communicator.h"
#include "core/logging.h"
#include "core/phase_profile.h"
#include "model/llama_layer.h"
#include "model/vocab_parallel_embedding.h"

namespace specula {
namespace {

class LlamaModel final : public Model {
 public:
  LlamaModel(const ModelConfig& config, WeightSource& weights, Backend& backend,
             const WeightQuantization& quantization, const TensorParallelRank& tp);

  const ModelConfig& config() const override { return config_; }
  KVCacheSpec kv_cache_spec() const override {
    return KVCacheSpec{config_.num_hidden_layers, num_kv_heads_, head_dim_, head_dim_};
  }
  std::vector<KVCacheScales> kv_cache_scales() const override;
  ForwardOutput forward(const ForwardInput& input, std::vector<KVCacheLayer>& kv) override;
  Tensor shared_weight(const std::string& name) const override;
  void set_aux_hidden_state_layers(const std::vector<int>& layers) override;
  bool decoder_chain(DecoderChain& chain) override;

 private:
  void check_input(const ForwardInput& input, const std::vector<KVCacheLayer>& kv) const;
  // The whole forward as one backend op (Backend::decoder_forward) where the backend has one for
  // this batch; false when it declined (nothing has run).
  bool fused_forward(const ForwardInput& input, std::vector<KVCacheLayer>& kv, ForwardOutput& out);
  void fill_decoder_weights(DecoderWeights& w);

  ModelConfig config_;
  TensorParallelRank tp_;
  ModelConfig layer_config_;  // the rank's heads and channels (config_ itself at size 1)
  Backend& backend_;
  int64_t hidden_, num_heads_, num_kv_heads_, head_dim_, vocab_;
  int64_t vocab_rows_;  // embedding and lm_head rows this rank holds (vocab_ / tp.size)

  Tensor embed_tokens_;  // [V / N, H]: the rank's rows
  std::vector<LlamaLayerWeights> layers_;
  Tensor norm_;          // [H]
  Tensor lm_head_;       // [V / N, H]: the rank's rows; of the embedding itself when tie_word_embeddings
  Tensor cos_sin_;       // F32 [max_position_embeddings, rotary_dim]
  LlamaDecoderLayer layer_;  // after config_ and cos_sin_, which it keeps references to
  std::vector<int> aux_layers_;  // ForwardOutput::aux_hidden_states: inputs of these layers
  // The model as Backend::decoder_forward takes it (weights, dims and its grid barrier's
  // counters), each forward adding its batch.
  DecoderForward fused_;
};

LlamaModel::LlamaModel(const ModelConfig& config, WeightSource& weights, Backend& backend,
                       const WeightQuantization& quantization, const TensorParallelRank& tp)
    : config_(config),
      tp_(tp),
      layer_config_(rank_config(config, tp.size)),
      backend_(backend),
      hidden_(config.hidden_size),
      num_heads_(layer_config_.num_attention_heads),
      num_kv_heads_(layer_config_.num_key_value_heads),
      head_dim_(config.head_dim),
      vocab_(config.vocab_size),
      vocab_rows_(config.vocab_size / tp.size),
      cos_sin_(make_rope_table(config, backend)),
      layer_(layer_config_, backend, cos_sin_, tp.communicator) {
  SPECULA_CHECK(tp.size == 1 || tp.communicator != nullptr, "{}: tensor-parallel rank {} of {} has no communicator",
                architecture_name(config.arch), tp.rank, tp.size);
  if (config.sliding_window && *config.sliding_window < config.max_position_embeddings &&
      (config.arch == Architecture::kMistral || config.raw.value("use_sliding_window", false))) {
    LOG_WARN("sliding_window={} is not implemented: attention is full, which matches the model only for "
             "sequences of at most {} tokens", *config.sliding_window, *config.sliding_window);
  }
  LlamaWeightLoader w(weights, backend, quantization);
  embed_tokens_ = w.load("model.embed_tokens.weight", {vocab_rows_, hidden_});  // vocab-parallel
  layers_.resize(config.num_hidden_layers);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i)
    layers_[i] = layer_.load(w, "model.layers." + std::to_string(i) + ".", hidden_, true);
  norm_ = w.load("model.norm.weight", {hidden_});
  // A tied lm_head is the embedding: both hold the rank's vocabulary rows.
  lm_head_ = config.tie_word_embeddings ? embed_tokens_ : w.load("lm_head.weight", {vocab_rows_, hidden_});
  fill_decoder_weights(fused_);
  fused_.grid_sync = backend.empty({2}, DType::kI32);
  backend.zero(fused_.grid_sync);
}

// Every layer's, or none: a checkpoint calibrated for an fp8 cache scales all of them.
std::vector<KVCacheScales> LlamaModel::kv_cache_scales() const {
  std::vector<KVCacheScales> scales;
  for (size_t i = 0; i < layers_.size(); ++i) {
    SPECULA_CHECK(layers_[i].kv_cache_scales.has_value() == layers_.front().kv_cache_scales.has_value(),
                  "{}: layer 0 {} KV cache scales (self_attn.k_scale / v_scale) but layer {} {}",
                  architecture_name(config_.arch), layers_.front().kv_cache_scales ? "has" : "has no", i,
                  layers_[i].kv_cache_scales ? "has" : "has none");
    if (layers_[i].kv_cache_scales) scales.push_back(*layers_[i].kv_cache_scales);
  }
  return scales;
}

Tensor LlamaModel::shared_weight(const std::string& name) const {
  if (name == "model.embed_tokens.weight") return embed_tokens_;
  if (name == "lm_head.weight") return lm_head_;  // a tensor-parallel rank's: its rows (Model::shared_weight)
  return Tensor();
}

void LlamaModel::set_aux_hidden_state_layers(const std::vector<int>& layers) {
  for (int l : layers)
    SPECULA_CHECK(l >= 0 && l < config_.num_hidden_layers, "{}: auxiliary hidden state layer {} does not exist (the "
                  "model has layers 0..{})", architecture_name(config_.arch), l, config_.num_hidden_layers - 1);
  aux_layers_ = layers;
}

void LlamaModel::check_input(const ForwardInput& in, const std::vector<KVCacheLayer>& kv) const {
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

ForwardOutput LlamaModel::forward(const ForwardInput& in, std::vector<KVCacheLayer>& kv) {
  check_input(in, kv);
  phase_profile::Scope whole("model.forward (host)");
  {
    phase_profile::Scope p("model.reset_scratch (host)");
    backend_.reset_scratch();
  }
  if (ForwardOutput fused; fused_forward(in, kv, fused)) return fused;
  const DType dt = backend_.compute_dtype();
  const int64_t t = in.token_ids.size(0);
  const float eps = layer_.eps();

  Tensor residual = backend_.scratch({t, hidden_}, dt);  // the residual stream h
  embed_tokens(backend_, tp_, in.token_ids, embed_tokens_, residual);
  // EAGLE-3's features: the residual stream entering each chosen layer, side by side.
  const int64_t num_aux = in.with_aux_hidden_states ? static_cast<int64_t>(aux_layers_.size()) : 0;
  Tensor aux = num_aux > 0 ? backend_.scratch({t, num_aux * hidden_}, dt) : Tensor();

  // Each block's temporaries go back to the scratch arena when it returns (its output is
  // written into x), so a step's scratch peak is one block's, not the sum over layers: at 8192
  // tokens of Llama-3.1-8B that is ~1 GB instead of ~35 GB, which the KV cache gets instead.
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LlamaLayerWeights& layer = layers_[i];
    for (int64_t j = 0; j < num_aux; ++j)
      if (aux_layers_[static_cast<size_t>(j)] == static_cast<int>(i)) backend_.copy_columns(residual, 0, aux, j * hidden_, hidden_);
    size_t mark = backend_.scratch_mark();
    layer_.attention(layer, residual, &layer.input_layernorm, in, kv[i], residual);
    backend_.scratch_release(mark);
    mark = backend_.scratch_mark();
    layer_.mlp(layer, residual);
    backend_.scratch_release(mark);
  }
  Tensor x = backend_.scratch({t, hidden_}, dt);
  backend_.rms_norm(residual, norm_, eps, x);  // final norm: x = RMSNorm(h)

  // Only the rows whose next token is wanted go through lm_head.
  const int64_t l = in.logits_indices.size(0);
  Tensor selected = backend_.scratch({l, hidden_}, dt);
  backend_.gather_rows(x, in.logits_indices, selected);
  ForwardOutput out;
  out.hidden_states = x;
  out.aux_hidden_states = aux;
  // lm_head writes F32 logits straight from its fp32 accumulators (no rounding to the compute
  // dtype and no separate cast launch).
  out.logits = backend_.scratch({l, vocab_}, DType::kF32);
  phase_profile::Scope p("model.lm_head (host)");
  if (tp_.size == 1) {
    backend_.linear(selected, lm_head_, nullptr, out.logits);
    return out;
  }
  Tensor part = backend_.scratch({l, vocab_rows_}, DType::kF32);  // this rank's vocabulary columns
  backend_.linear(selected, lm_head_, nullptr, part);
  tp_.communicator->all_gather_columns(part, out.logits);
  return out;
}

bool LlamaModel::fused_forward(const ForwardInput& in, std::vector<KVCacheLayer>& kv, ForwardOutput& out) {
  // Tensor-parallel ranks need collectives between layers, and EAGLE-3's features the residual
  // stream entering layers, which the fused forward keeps to itself.
  const int64_t t = in.token_ids.size(0), l = in.logits_indices.size(0);
  if (tp_.size > 1 || (in.with_aux_hidden_states && !aux_layers_.empty()) || t > kMaxDecoderForwardRows ||
      l > kMaxDecoderForwardRows)
    return false;
  DecoderForward& f = fused_;  // its weights filled once, at load
  f.kv = &kv;
  f.token_ids = &in.token_ids;
  f.positions = &in.positions;
  f.attn = &in.attn;
  f.logits_indices = &in.logits_indices;
  f.logits = Tensor();
  f.hidden_states = Tensor();
  if (!backend_.decoder_forward(f)) return false;
  out.logits = f.logits;
  out.hidden_states = f.hidden_states;
  return true;
}

void LlamaModel::fill_decoder_weights(DecoderWeights& c) {
  c.layers.clear();
  for (const LlamaLayerWeights& l : layers_) c.layers.push_back(decoder_layer_weights(l));
  c.embed_tokens = &embed_tokens_;
  c.norm = &norm_;
  c.lm_head = &lm_head_;
  c.cos_sin = &cos_sin_;
  c.rotary_dim = layer_.rotary_dim();
  c.num_q_heads = num_heads_;
  c.num_kv_heads = num_kv_heads_;
  c.head_dim = head_dim_;
  c.eps = layer_.eps();
  c.attn_scale = layer_.attn_scale();
}

bool LlamaModel::decoder_chain(DecoderChain& c) {
  if (tp_.size > 1) return false;  // the fused chain has no collectives
  fill_decoder_weights(c);
  return backend_.decoder_chain(c);
}

}  // namespace

std::unique_ptr<Model> create_llama_model(const ModelConfig& config, WeightSource& weights, Backend& backend,
                                          const WeightQuantization& quantization, const TensorParallelRank& tp) {
  check_tensor_parallel(config, tp.size);
  auto model = std::make_unique<LlamaModel>(config, weights, backend, quantization, tp);
  if (quantization.fp8()) LOG_INFO("Linear layers: {}", quantization.describe());
  LOG_INFO("Loaded {} ({} layers, hidden {}, {} q / {} kv heads of {}, vocab {}) from {} onto {}",
           architecture_name(config.arch), config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
           config.num_key_value_heads, config.head_dim, config.vocab_size, weights.describe(), backend.name());
  return model;
}

}  // namespace specula
