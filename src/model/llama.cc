// The Llama-family decoder over a flattened varlen batch (T tokens of many sequences at once):
//
//   h = embed_tokens[token_ids]                                  [T, H]
//   for each layer:
//     h = h + o_proj(Attention(RoPE(q), RoPE(k), v))             q, k, v from RMSNorm(h)
//     h = h + down_proj(silu(gate_proj(x)) * up_proj(x))         x = RMSNorm(h)
//   logits = lm_head(RMSNorm(h)[logits_indices])                 [L, V]
//
// The residual stream lives in `residual`; add_rms_norm(x, residual, w) folds "add the block's
// output, then normalise for the next block" into one op. Variants: Qwen2 adds q/k/v biases (and
// Llama's attention_bias adds o too, mlp_bias the MLP's), Qwen3 RMS-normalises each q and k head
// over head_dim before RoPE, and head_dim may differ from hidden_size / num_attention_heads.
//
// Shapes: H hidden, Hq query heads, Hk kv heads, D head_dim, I intermediate, V vocab.
#include "model/llama.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/logging.h"
#include "core/phase_profile.h"
#include "model/rope.h"

namespace specula {
namespace {

struct LlamaLayer {
  Tensor input_layernorm;           // [H]
  Tensor qkv_proj;                  // [(Hq + 2 Hk) D, H]: q_proj, k_proj, v_proj stacked by rows
  Tensor qkv_bias;                  // [(Hq + 2 Hk) D]; Qwen2, attention_bias (else undefined)
  Tensor q_norm, k_norm;            // [D]; Qwen3 (else undefined)
  Tensor o_proj;                    // [H, Hq D]
  Tensor o_bias;                    // [H]; Llama/Qwen3 attention_bias
  Tensor post_attention_layernorm;  // [H]
  Tensor gate_up_proj;              // [2 I, H]: gate_proj then up_proj
  Tensor gate_up_bias;              // [2 I]; mlp_bias
  Tensor down_proj;                 // [H, I]
  Tensor down_bias;                 // [H]; mlp_bias
};

const Tensor* if_defined(const Tensor& t) { return t.defined() ? &t : nullptr; }

// Loads HF-named tensors in the backend's compute dtype, fusing row-stacked projections so that
// each fused projection is one GEMM at run time.
class WeightLoader {
 public:
  WeightLoader(WeightSource& source, Backend& backend) : source_(source), backend_(backend) {}

  Tensor load(const std::string& name, const Shape& shape) {
    return source_.load(name, shape, backend_.compute_dtype(), backend_);
  }

  // Concatenates tensors along dim 0 (weights [n_i, K] -> [sum n_i, K], biases [n_i] -> [sum n_i]).
  Tensor load_stacked(const std::vector<std::pair<std::string, Shape>>& parts) {
    Shape fused_shape = parts.front().second;
    fused_shape[0] = 0;
    for (const auto& [name, shape] : parts) fused_shape[0] += shape[0];
    Tensor fused = backend_.empty(fused_shape, backend_.compute_dtype());
    int64_t row = 0;
    for (const auto& [name, shape] : parts) {
      Tensor part = load(name, shape);
      Tensor rows = fused.slice(row, row + shape[0]);
      backend_.copy(part, rows);
      row += shape[0];
    }
    return fused;
  }

 private:
  WeightSource& source_;
  Backend& backend_;
};

class LlamaModel final : public Model {
 public:
  LlamaModel(const ModelConfig& config, WeightSource& weights, Backend& backend);

  const ModelConfig& config() const override { return config_; }
  KVCacheSpec kv_cache_spec() const override {
    return KVCacheSpec{config_.num_hidden_layers, num_kv_heads_, head_dim_, head_dim_};
  }
  ForwardOutput forward(const ForwardInput& input, std::vector<KVCacheLayer>& kv) override;
  bool greedy_chain(DecoderChain& chain) override;

 private:
  // Each block reads x and writes its output into `out` (which may be x itself).
  void attention(const LlamaLayer& w, const Tensor& x, const ForwardInput& input, KVCacheLayer& cache, Tensor& out);
  void mlp(const LlamaLayer& w, const Tensor& x, Tensor& out);
  void check_input(const ForwardInput& input, const std::vector<KVCacheLayer>& kv) const;

  ModelConfig config_;
  Backend& backend_;
  int64_t hidden_, num_heads_, num_kv_heads_, head_dim_, intermediate_, vocab_;
  int rotary_dim_;
  float eps_, attn_scale_;

  Tensor embed_tokens_;  // [V, H]
  std::vector<LlamaLayer> layers_;
  Tensor norm_;          // [H]
  Tensor lm_head_;       // [V, H]; the embedding itself when tie_word_embeddings
  Tensor cos_sin_;       // F32 [max_position_embeddings, rotary_dim]
};

LlamaModel::LlamaModel(const ModelConfig& config, WeightSource& weights, Backend& backend)
    : config_(config),
      backend_(backend),
      hidden_(config.hidden_size),
      num_heads_(config.num_attention_heads),
      num_kv_heads_(config.num_key_value_heads),
      head_dim_(config.head_dim),
      intermediate_(config.intermediate_size),
      vocab_(config.vocab_size),
      rotary_dim_(static_cast<int>(config.rotary_dim())),
      eps_(static_cast<float>(config.rms_norm_eps)),
      // transformers: scaling = head_dim ** -0.5 (YaRN's attention factor lives in cos/sin).
      attn_scale_(static_cast<float>(1.0 / std::sqrt(static_cast<double>(config.head_dim)))) {
  SPECULA_CHECK(num_kv_heads_ > 0 && num_heads_ % num_kv_heads_ == 0,
                "{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                architecture_name(config.arch), num_heads_, num_kv_heads_);
  SPECULA_CHECK(config.hidden_act == "silu", "{}: hidden_act '{}' is not supported (only silu)",
                architecture_name(config.arch), config.hidden_act);
  if (config.sliding_window && *config.sliding_window < config.max_position_embeddings &&
      (config.arch == Architecture::kMistral || config.raw.value("use_sliding_window", false))) {
    LOG_WARN("sliding_window={} is not implemented: attention is full, which matches the model only for "
             "sequences of at most {} tokens", *config.sliding_window, *config.sliding_window);
  }

  const bool qkv_bias = config.attention_bias;  // config.cc: Qwen2 always; Llama/Qwen3 attention_bias
  const bool o_bias = config.o_proj_bias;
  const int64_t nq = num_heads_ * head_dim_, nk = num_kv_heads_ * head_dim_;
  WeightLoader w(weights, backend);
  embed_tokens_ = w.load("model.embed_tokens.weight", {vocab_, hidden_});
  layers_.resize(config.num_hidden_layers);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LlamaLayer& l = layers_[i];
    l.input_layernorm = w.load(p + "input_layernorm.weight", {hidden_});
    l.qkv_proj = w.load_stacked({{p + "self_attn.q_proj.weight", {nq, hidden_}},
                                 {p + "self_attn.k_proj.weight", {nk, hidden_}},
                                 {p + "self_attn.v_proj.weight", {nk, hidden_}}});
    if (qkv_bias) {
      l.qkv_bias = w.load_stacked({{p + "self_attn.q_proj.bias", {nq}},
                                   {p + "self_attn.k_proj.bias", {nk}},
                                   {p + "self_attn.v_proj.bias", {nk}}});
    }
    if (config.qk_norm) {
      l.q_norm = w.load(p + "self_attn.q_norm.weight", {head_dim_});
      l.k_norm = w.load(p + "self_attn.k_norm.weight", {head_dim_});
    }
    l.o_proj = w.load(p + "self_attn.o_proj.weight", {hidden_, nq});
    if (o_bias) l.o_bias = w.load(p + "self_attn.o_proj.bias", {hidden_});
    l.post_attention_layernorm = w.load(p + "post_attention_layernorm.weight", {hidden_});
    l.gate_up_proj = w.load_stacked({{p + "mlp.gate_proj.weight", {intermediate_, hidden_}},
                                     {p + "mlp.up_proj.weight", {intermediate_, hidden_}}});
    l.down_proj = w.load(p + "mlp.down_proj.weight", {hidden_, intermediate_});
    if (config.mlp_bias) {
      l.gate_up_bias = w.load_stacked({{p + "mlp.gate_proj.bias", {intermediate_}},
                                       {p + "mlp.up_proj.bias", {intermediate_}}});
      l.down_bias = w.load(p + "mlp.down_proj.bias", {hidden_});
    }
  }
  norm_ = w.load("model.norm.weight", {hidden_});
  lm_head_ = config.tie_word_embeddings ? embed_tokens_ : w.load("lm_head.weight", {vocab_, hidden_});

  // cos|sin for every position the model supports, computed once on the host.
  const int64_t max_positions = config.max_position_embeddings;
  SPECULA_CHECK(max_positions > 0, "{}: max_position_embeddings must be positive", architecture_name(config.arch));
  std::vector<float> table =
      rope_cos_sin_table(rope_frequencies(config.rope, rotary_dim_, max_positions), max_positions);
  cos_sin_ = backend.empty({max_positions, rotary_dim_}, DType::kF32);
  Tensor host = Tensor::from_f32(table, {max_positions, rotary_dim_});
  backend.copy(host, cos_sin_);
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
  const DType dt = backend_.compute_dtype();
  const int64_t t = in.token_ids.size(0);

  Tensor x = backend_.scratch({t, hidden_}, dt);         // the current block's input / output
  Tensor residual = backend_.scratch({t, hidden_}, dt);  // the residual stream
  backend_.embedding(in.token_ids, embed_tokens_, x);
  backend_.zero(residual);  // so that the first add_rms_norm makes residual = embeddings

  // Each block's temporaries go back to the scratch arena when it returns (its output is
  // written into x), so a step's scratch peak is one block's, not the sum over layers: at 8192
  // tokens of Llama-3.1-8B that is ~1 GB instead of ~35 GB, which the KV cache gets instead.
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LlamaLayer& layer = layers_[i];
    backend_.add_rms_norm(x, residual, layer.input_layernorm, eps_);
    size_t mark = backend_.scratch_mark();
    attention(layer, x, in, kv[i], x);
    backend_.scratch_release(mark);
    backend_.add_rms_norm(x, residual, layer.post_attention_layernorm, eps_);
    mark = backend_.scratch_mark();
    mlp(layer, x, x);
    backend_.scratch_release(mark);
  }
  backend_.add_rms_norm(x, residual, norm_, eps_);  // final norm: x = RMSNorm(h)

  // Only the rows whose next token is wanted go through lm_head.
  const int64_t l = in.logits_indices.size(0);
  Tensor selected = backend_.scratch({l, hidden_}, dt);
  backend_.gather_rows(x, in.logits_indices, selected);
  ForwardOutput out;
  out.hidden_states = x;
  // lm_head writes F32 logits straight from its fp32 accumulators (no rounding to the compute
  // dtype and no separate cast launch).
  out.logits = backend_.scratch({l, vocab_}, DType::kF32);
  phase_profile::Scope p("model.lm_head (host)");
  backend_.linear(selected, lm_head_, nullptr, out.logits);
  return out;
}

bool LlamaModel::greedy_chain(DecoderChain& c) {
  c.layers.clear();
  for (const LlamaLayer& l : layers_) {
    DecoderChainLayerWeights w;
    w.input_layernorm = &l.input_layernorm;
    w.qkv_proj = &l.qkv_proj;
    w.qkv_bias = if_defined(l.qkv_bias);
    w.q_norm = if_defined(l.q_norm);
    w.k_norm = if_defined(l.k_norm);
    w.o_proj = &l.o_proj;
    w.o_bias = if_defined(l.o_bias);
    w.post_attention_layernorm = &l.post_attention_layernorm;
    w.gate_up_proj = &l.gate_up_proj;
    w.gate_up_bias = if_defined(l.gate_up_bias);
    w.down_proj = &l.down_proj;
    w.down_bias = if_defined(l.down_bias);
    c.layers.push_back(w);
  }
  c.embed_tokens = &embed_tokens_;
  c.norm = &norm_;
  c.lm_head = &lm_head_;
  c.cos_sin = &cos_sin_;
  c.rotary_dim = rotary_dim_;
  c.num_q_heads = num_heads_;
  c.num_kv_heads = num_kv_heads_;
  c.head_dim = head_dim_;
  c.eps = eps_;
  c.attn_scale = attn_scale_;
  return backend_.decoder_greedy_chain(c);
}

// Grouped-query self-attention over the paged cache. x: [T, H] -> out [T, H].
void LlamaModel::attention(const LlamaLayer& w, const Tensor& x, const ForwardInput& in, KVCacheLayer& cache,
                           Tensor& out) {
  const DType dt = backend_.compute_dtype();
  const int64_t t = x.size(0), hq = num_heads_, hk = num_kv_heads_, d = head_dim_;

  // One GEMM for q, k and v: [T, H] -> [T, (Hq + 2 Hk) D]; then one fused op splits the heads,
  // applies Qwen3's per-head q/k RMSNorm, ropes q and k, and writes k and v into the cache (the
  // new tokens' K/V go in first; attention then reads every key through the cache).
  Tensor qkv = backend_.scratch({t, (hq + 2 * hk) * d}, dt);
  {
    phase_profile::Scope p("model.qkv_gemm (host)");
    backend_.linear(x, w.qkv_proj, if_defined(w.qkv_bias), qkv);
  }
  Tensor q = backend_.scratch({t, hq, d}, dt);
  Backend::QkvPrologue prologue;
  prologue.num_q_heads = hq;
  prologue.num_kv_heads = hk;
  prologue.q_norm = if_defined(w.q_norm);
  prologue.k_norm = if_defined(w.k_norm);
  prologue.eps = eps_;
  prologue.positions = &in.positions;
  prologue.cos_sin = &cos_sin_;
  prologue.rotary_dim = rotary_dim_;
  prologue.neox = true;
  {
    phase_profile::Scope p("model.qkv_prologue (host)");
    backend_.qkv_prologue(qkv, prologue, cache, in.attn.slot_mapping, q);
  }

  Tensor attn = backend_.scratch({t, hq, d}, dt);
  const auto& qsl = in.attn.query_start_loc_host;
  const int64_t real_rows = qsl.empty() ? 0 : qsl.back();
  if (real_rows < t) {  // padding rows: attention leaves them alone, keep them finite
    Tensor pad = attn.slice(real_rows, t);
    backend_.zero(pad);
  }
  {
    phase_profile::Scope p("model.paged_attention (host)");
    backend_.paged_attention(q, cache, in.attn, attn_scale_, attn);
  }

  // o_proj reads only attn: out may be x, whose last reader (the qkv GEMM) ran before it.
  phase_profile::Scope p("model.o_gemm (host)");
  backend_.linear(attn.reshape({t, hq * d}), w.o_proj, if_defined(w.o_bias), out);
}

// SwiGLU MLP: down_proj(silu(gate_proj(x)) * up_proj(x)), gate and up as one GEMM. [T, H] -> out.
void LlamaModel::mlp(const LlamaLayer& w, const Tensor& x, Tensor& out) {
  const DType dt = backend_.compute_dtype();
  const int64_t t = x.size(0);
  phase_profile::Scope p("model.mlp (host)");
  Tensor gate_up = backend_.scratch({t, 2 * intermediate_}, dt);
  backend_.linear(x, w.gate_up_proj, if_defined(w.gate_up_bias), gate_up);
  Tensor act = backend_.scratch({t, intermediate_}, dt);
  backend_.silu_mul(gate_up, act);
  backend_.linear(act, w.down_proj, if_defined(w.down_bias), out);  // out may be x: only act is read
}

}  // namespace

std::unique_ptr<Model> create_llama_model(const ModelConfig& config, WeightSource& weights, Backend& backend) {
  auto model = std::make_unique<LlamaModel>(config, weights, backend);
  LOG_INFO("Loaded {} ({} layers, hidden {}, {} q / {} kv heads of {}, vocab {}) from {} onto {}",
           architecture_name(config.arch), config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
           config.num_key_value_heads, config.head_dim, config.vocab_size, weights.describe(), backend.name());
  return model;
}

}  // namespace specula
