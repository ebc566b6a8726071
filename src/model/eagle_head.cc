// EagleHead: the EAGLE-1 / EAGLE-3 head's config checks, loading and forward; see eagle_head.h.
#include "model/eagle_head.h"

#include <algorithm>
#include <fstream>
#include <limits>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/logging.h"

namespace specula {
namespace {

bool is_eagle3_class(const std::string& name) {
  return name == "LlamaForCausalLMEagle3" || name == "Eagle3LlamaForCausalLM" || name == "Eagle3DraftModel";
}

// The first of `names` the checkpoint holds ("" when none).
std::string first_present(const WeightSource& weights, const std::vector<std::string>& names) {
  for (const std::string& n : names)
    if (weights.has(n)) return n;
  return "";
}

}  // namespace

EagleHeadConfig load_eagle_head_config(const std::filesystem::path& dir, EagleVersion version, const ModelConfig& target) {
  const std::filesystem::path path = dir / "config.json";
  const std::string head = dir.string();
  const char* method = version == EagleVersion::kEagle3 ? "eagle3" : "eagle";
  std::ifstream f(path);
  SPECULA_CHECK(f.good(), "--speculative-config: the {} head folder \"{}\" has no config.json", method, head);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON ({})", path.string(), e.what()));
  }
  SPECULA_CHECK(j.is_object(), "{}: expected a JSON object", path.string());

  std::string arch;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    arch = j["architectures"][0].get<std::string>();
  const nlohmann::json eagle = j.value("eagle_config", nlohmann::json::object());
  const bool looks_eagle3 = is_eagle3_class(arch) || j.contains("draft_vocab_size") ||
                            (eagle.is_object() && eagle.value("use_aux_hidden_state", false));
  if (version == EagleVersion::kEagle3) {
    SPECULA_CHECK(looks_eagle3, "--speculative-config: {} is not an EAGLE-3 head (architectures {}, no draft_vocab_size "
                  "or eagle_config.use_aux_hidden_state); an EAGLE-1 head runs with \"method\": \"eagle\"", head,
                  arch.empty() ? "missing" : arch);
  } else {
    SPECULA_CHECK(!looks_eagle3, "--speculative-config: {} is an EAGLE-3 head ({}); run it with \"method\": \"eagle3\"",
                  head, arch.empty() ? "draft_vocab_size" : arch);
  }
  // The layer is a Llama layer whatever class name the head carries.
  j["architectures"] = nlohmann::json::array({"LlamaForCausalLM"});
  if (!j.contains("model_type")) j["model_type"] = "llama";

  EagleHeadConfig c;
  c.version = version;
  c.layer = parse_model_config(j, path.string());
  c.layer.qk_norm = false;
  const ModelConfig& l = c.layer;
  SPECULA_CHECK(l.num_hidden_layers == 1, "--speculative-config: {} has num_hidden_layers {}; specula runs EAGLE heads "
                "of one layer", head, l.num_hidden_layers);
  SPECULA_CHECK(l.vocab_size == target.vocab_size, "--speculative-config: the {} head {} has vocab_size {} but the target "
                "has {}: the head must be trained for this target", method, head, l.vocab_size, target.vocab_size);
  c.draft_vocab_size = j.value("draft_vocab_size", l.vocab_size);
  SPECULA_CHECK(c.draft_vocab_size > 0 && c.draft_vocab_size <= l.vocab_size,
                "--speculative-config: {}: draft_vocab_size {} must be in 1..vocab_size ({})", head, c.draft_vocab_size,
                l.vocab_size);
  c.target_hidden_size = j.value("target_hidden_size", l.hidden_size);
  SPECULA_CHECK(c.target_hidden_size == target.hidden_size,
                "--speculative-config: the {} head {} reads target hidden states of {} ({}) but the target's hidden_size "
                "is {}", method, head, c.target_hidden_size, j.contains("target_hidden_size") ? "target_hidden_size" :
                "its hidden_size", target.hidden_size);
  if (version == EagleVersion::kEagle1) {
    SPECULA_CHECK(l.hidden_size == target.hidden_size, "--speculative-config: the EAGLE head {} has hidden_size {} but "
                  "the target has {}", head, l.hidden_size, target.hidden_size);
    return c;
  }
  c.norm_before_residual = j.value("norm_before_residual", false);
  const int layers = static_cast<int>(target.num_hidden_layers);
  if (eagle.is_object() && eagle.contains("eagle_aux_hidden_state_layer_ids") &&
      !eagle["eagle_aux_hidden_state_layer_ids"].is_null()) {
    const nlohmann::json& ids = eagle["eagle_aux_hidden_state_layer_ids"];
    SPECULA_CHECK(ids.is_array() && !ids.empty(), "{}: eagle_config.eagle_aux_hidden_state_layer_ids must be a "
                  "non-empty list of layer indices, got {}", path.string(), ids.dump());
    for (const auto& id : ids) {
      SPECULA_CHECK(id.is_number_integer(), "{}: eagle_aux_hidden_state_layer_ids holds {}, not a layer index",
                    path.string(), id.dump());
      c.aux_layers.push_back(id.get<int>());
    }
  } else {
    // vLLM's default: low, middle and high features.
    c.aux_layers = {2, layers / 2, layers - 3};
  }
  for (int id : c.aux_layers)
    SPECULA_CHECK(id >= 0 && id < layers, "--speculative-config: the EAGLE-3 head {} reads aux hidden state layer {}, "
                  "but the target has layers 0..{}", head, id, layers - 1);
  return c;
}

EagleHead::EagleHead(const EagleHeadConfig& config, WeightSource& weights, Backend& backend, const Model& target,
                     bool dummy)
    : config_(config),
      backend_(backend),
      hidden_(config.layer.hidden_size),
      vocab_(config.layer.vocab_size),
      draft_vocab_(config.draft_vocab_size),
      cos_sin_(make_rope_table(config_.layer, backend)),
      layer_(config_.layer, backend, cos_sin_) {
  const bool v3 = config.version == EagleVersion::kEagle3;
  LlamaWeightLoader w(weights, backend);
  std::string prefix = "midlayer.";
  for (const char* p : {"midlayer.", "layers.0.", "model.layers.0."})
    if (weights.has(std::string(p) + "self_attn.q_proj.weight")) {
      prefix = p;
      break;
    }
  w_ = layer_.load(w, prefix, v3 ? 2 * hidden_ : hidden_, v3);
  if (v3) {
    hidden_norm_ = w.load(prefix + "hidden_norm.weight", {hidden_});
    const std::string norm = first_present(weights, {"norm.weight", "model.norm.weight"});
    norm_ = w.load(norm.empty() ? "norm.weight" : norm, {hidden_});
  }
  const std::string fc = first_present(weights, {"fc.weight", "model.fc.weight"});
  fc_ = w.load(fc.empty() ? "fc.weight" : fc, {hidden_, v3 ? config.feature_size() : 2 * hidden_});
  const std::string fc_bias = first_present(weights, {"fc.bias", "model.fc.bias"});
  if (!v3 && !dummy && !fc_bias.empty()) fc_bias_ = w.load(fc_bias, {hidden_});

  const std::string embed = dummy ? "" : first_present(weights, {"embed_tokens.weight", "model.embed_tokens.weight"});
  if (!embed.empty()) {
    embed_tokens_ = w.load(embed, {vocab_, hidden_});
  } else {
    embed_tokens_ = target.shared_weight("model.embed_tokens.weight");
    SPECULA_CHECK(embed_tokens_.defined() && embed_tokens_.shape() == Shape({vocab_, hidden_}),
                  "EAGLE head: it stores no embed_tokens and the target lends no [{}, {}] embedding", vocab_, hidden_);
  }
  if (v3 || (!dummy && weights.has("lm_head.weight"))) {
    lm_head_ = w.load("lm_head.weight", {v3 ? draft_vocab_ : vocab_, hidden_});
  } else {
    lm_head_ = target.shared_weight("lm_head.weight");
    SPECULA_CHECK(lm_head_.defined() && lm_head_.shape() == Shape({vocab_, hidden_}),
                  "EAGLE head: it stores no lm_head and the target lends no [{}, {}] head", vocab_, hidden_);
  }
  if (v3) load_maps(weights, dummy);
  LOG_INFO("Loaded EAGLE-{} head from {}: hidden {}, {} q / {} kv heads, draft vocabulary {} of {}{}", v3 ? 3 : 1,
           weights.describe(), hidden_, config.layer.num_attention_heads, config.layer.num_key_value_heads, draft_vocab_,
           vocab_, v3 ? fmt::format(", features of target layers {}", fmt::join(config.aux_layers, ", ")) : "");
}

void EagleHead::load_maps(WeightSource& weights, bool dummy) {
  // column_of[target id] = draft id, from d2t (target = draft + d2t[draft]).
  std::vector<int32_t> column_of(static_cast<size_t>(vocab_), -1);
  const bool reduced = draft_vocab_ < vocab_;
  if (dummy || (!reduced && !weights.has("d2t"))) {
    for (int64_t d = 0; d < draft_vocab_; ++d) column_of[static_cast<size_t>(d)] = static_cast<int32_t>(d);
  } else {
    SPECULA_CHECK(weights.has("d2t"), "EAGLE-3 head {}: draft_vocab_size {} < vocab_size {} but the checkpoint has no "
                  "d2t map (draft id -> target id offsets)", weights.describe(), draft_vocab_, vocab_);
    Tensor d2t = weights.load("d2t", {draft_vocab_}, DType::kI64, backend_);
    Tensor host = Tensor::empty({draft_vocab_}, DType::kI64, Device::kCPU);
    backend_.copy(d2t, host);
    backend_.synchronize();
    const int64_t* off = host.data_as<int64_t>();
    for (int64_t d = 0; d < draft_vocab_; ++d) {
      const int64_t t = d + off[d];
      SPECULA_CHECK(t >= 0 && t < vocab_, "EAGLE-3 head {}: d2t maps draft id {} to target id {}, outside 0..{}",
                    weights.describe(), d, t, vocab_ - 1);
      SPECULA_CHECK(column_of[static_cast<size_t>(t)] < 0, "EAGLE-3 head {}: d2t maps draft ids {} and {} to the same "
                    "target id {}", weights.describe(), column_of[static_cast<size_t>(t)], d, t);
      column_of[static_cast<size_t>(t)] = static_cast<int32_t>(d);
    }
    if (weights.has("t2d")) {  // optional; when present it must agree with d2t
      Tensor t2d = weights.load("t2d", {vocab_}, DType::kBool, backend_);
      Tensor mask = Tensor::empty({vocab_}, DType::kBool, Device::kCPU);
      backend_.copy(t2d, mask);
      backend_.synchronize();
      const uint8_t* in = mask.data_as<uint8_t>();
      for (int64_t t = 0; t < vocab_; ++t)
        SPECULA_CHECK((in[t] != 0) == (column_of[static_cast<size_t>(t)] >= 0), "EAGLE-3 head {}: t2d and d2t disagree "
                      "at target id {}", weights.describe(), t);
    }
  }
  bool identity = !reduced;
  for (int64_t v = 0; identity && v < vocab_; ++v) identity = column_of[static_cast<size_t>(v)] == v;
  if (identity) return;  // the head's logits are the target's columns already
  column_of_ = backend_.empty({vocab_}, DType::kI32);
  Tensor host = Tensor::from_i32(column_of, {vocab_});
  backend_.copy(host, column_of_);
  std::vector<int32_t> target_of(static_cast<size_t>(draft_vocab_), 0);
  for (int64_t t = 0; t < vocab_; ++t) {
    const int32_t d = column_of[static_cast<size_t>(t)];
    if (d >= 0) target_of[static_cast<size_t>(d)] = static_cast<int32_t>(t);
  }
  target_of_ = backend_.empty({draft_vocab_}, DType::kI32);
  Tensor target_host = Tensor::from_i32(target_of, {draft_vocab_});
  backend_.copy(target_host, target_of_);
  backend_.synchronize();  // the host vectors go out of scope
}

KVCacheSpec EagleHead::kv_cache_spec() const {
  const ModelConfig& l = config_.layer;
  return KVCacheSpec{1, l.num_key_value_heads, l.head_dim, l.head_dim};
}

void EagleHead::check_input(const EagleForwardInput& in, const KVCacheLayer& cache) const {
  const ForwardInput& r = in.rows;
  SPECULA_CHECK(r.token_ids.defined() && r.token_ids.ndim() == 1 && r.token_ids.dtype() == DType::kI32,
                "EAGLE forward: token_ids must be I32 [T], got {}", r.token_ids.describe());
  const int64_t t = r.token_ids.size(0);
  SPECULA_CHECK(t > 0, "EAGLE forward: empty batch");
  SPECULA_CHECK(r.positions.defined() && r.positions.ndim() == 1 && r.positions.size(0) == t,
                "EAGLE forward: positions {} must be [{}]", r.positions.describe(), t);
  const int64_t width = in.from_target ? config_.feature_size() : hidden_;
  SPECULA_CHECK(in.hidden.defined() && in.hidden.ndim() == 2 && in.hidden.size(0) == t && in.hidden.size(1) == width &&
                    in.hidden.dtype() == backend_.compute_dtype(),
                "EAGLE forward: hidden states {} must be {}[{}, {}]", in.hidden.describe(),
                dtype_name(backend_.compute_dtype()), t, width);
  SPECULA_CHECK(r.attn.num_tokens == t, "EAGLE forward: attention metadata covers {} tokens, the batch has {}",
                r.attn.num_tokens, t);
  SPECULA_CHECK(r.logits_indices.defined() && r.logits_indices.ndim() == 1,
                "EAGLE forward: logits_indices must be I32 [L], got {}", r.logits_indices.describe());
  SPECULA_CHECK(cache.k.defined() && cache.k.ndim() == 4, "EAGLE forward: no KV cache, got {}", cache.k.describe());
}

bool EagleHead::decoder_chain(DecoderChain& c) {
  if (config_.version != EagleVersion::kEagle3 || config_.norm_before_residual) return false;
  c.layers = {decoder_layer_weights(w_)};
  c.embed_tokens = &embed_tokens_;
  c.norm = &norm_;
  c.lm_head = &lm_head_;
  c.cos_sin = &cos_sin_;
  c.rotary_dim = layer_.rotary_dim();
  c.num_q_heads = config_.layer.num_attention_heads;
  c.num_kv_heads = config_.layer.num_key_value_heads;
  c.head_dim = config_.layer.head_dim;
  c.eps = layer_.eps();
  c.attn_scale = layer_.attn_scale();
  c.hidden_norm = &hidden_norm_;
  c.draft_to_target = target_of_.defined() ? &target_of_ : nullptr;
  return backend_.decoder_chain(c);
}

EagleForwardOutput EagleHead::forward(const EagleForwardInput& in, KVCacheLayer& cache) {
  check_input(in, cache);
  const DType dt = backend_.compute_dtype();
  const int64_t t = in.rows.token_ids.size(0), h = hidden_;
  const float eps = layer_.eps();
  const bool v3 = config_.version == EagleVersion::kEagle3;

  Tensor residual = backend_.scratch({t, h}, dt);  // the layer's residual stream
  Tensor x;                                         // the attention's input
  if (v3) {
    Tensor g = in.hidden;
    if (in.from_target) {
      g = backend_.scratch({t, h}, dt);
      backend_.linear(in.hidden, fc_, nullptr, g);
    }
    // [input_layernorm(embedding) | hidden_norm(g)], residual g (or its norm): one backend op.
    Backend::Eagle3LayerInput input;
    input.embed_tokens = &embed_tokens_;
    input.input_norm = &w_.input_layernorm;
    input.hidden_norm = &hidden_norm_;
    input.eps = eps;
    input.norm_before_residual = config_.norm_before_residual;
    x = backend_.scratch({t, 2 * h}, dt);
    backend_.eagle3_layer_input(in.rows.token_ids, g, input, x, residual);
  } else {
    Tensor e = backend_.scratch({t, h}, dt);
    backend_.embedding(in.rows.token_ids, embed_tokens_, e);
    Tensor cat = backend_.scratch({t, 2 * h}, dt);
    backend_.copy_columns(e, 0, cat, 0, h);
    backend_.copy_columns(in.hidden, 0, cat, h, h);
    x = backend_.scratch({t, h}, dt);
    backend_.linear(cat, fc_, fc_bias_.defined() ? &fc_bias_ : nullptr, x);
    backend_.copy(x, residual);
  }
  layer_.attention(w_, x, /*input_norm=*/nullptr, in.rows, cache, residual);
  layer_.mlp(w_, residual);
  EagleForwardOutput out;
  out.prenorm = residual;

  const int64_t l = in.rows.logits_indices.size(0);
  if (l == 0) return out;
  Tensor selected = backend_.scratch({l, h}, dt);
  backend_.gather_rows(out.prenorm, in.rows.logits_indices, selected);
  // F32 logits straight from the GEMM's fp32 accumulators, as the target's lm_head; EAGLE-3's
  // final norm folded into it (one launch fewer on CUDA, the same op sequence elsewhere).
  Tensor logits = backend_.scratch({l, lm_head_.size(0)}, DType::kF32);
  backend_.fused_linear(selected, v3 ? LinearPrologue::rms_norm(norm_, eps) : LinearPrologue::none(),
                        LinearWeight{lm_head_}, nullptr, logits, LinearEpilogue::kStore);
  if (!column_of_.defined()) {
    out.logits = logits;
  } else {
    out.logits = backend_.scratch({l, vocab_}, DType::kF32);
    backend_.gather_columns(logits, column_of_, -std::numeric_limits<float>::infinity(), out.logits);
  }
  return out;
}

}  // namespace specula
