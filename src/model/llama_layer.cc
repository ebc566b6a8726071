// LlamaDecoderLayer: one Llama-family layer's loading and blocks; see llama_layer.h.
#include "model/llama_layer.h"

#include <cmath>

#include "core/error.h"
#include "core/phase_profile.h"
#include "model/rope.h"
#include "model/weight_upload.h"

namespace specula {
namespace {

const Tensor* if_defined(const Tensor& t) { return t.defined() ? &t : nullptr; }

}  // namespace

DecoderLayerWeights decoder_layer_weights(const LlamaLayerWeights& l) {
  DecoderLayerWeights w;
  w.input_layernorm = &l.input_layernorm;
  w.qkv_proj = &l.qkv_proj.weight;
  w.qkv_bias = if_defined(l.qkv_bias);
  w.q_norm = if_defined(l.q_norm);
  w.k_norm = if_defined(l.k_norm);
  w.o_proj = &l.o_proj.weight;
  w.o_bias = if_defined(l.o_bias);
  w.post_attention_layernorm = &l.post_attention_layernorm;
  w.gate_up_proj = &l.gate_up_proj.weight;
  w.gate_up_bias = if_defined(l.gate_up_bias);
  w.down_proj = &l.down_proj.weight;
  w.down_bias = if_defined(l.down_bias);
  return w;
}

Tensor LlamaWeightLoader::load(const std::string& name, const Shape& shape) {
  return source_.load(name, shape, backend_.compute_dtype(), backend_);
}

Tensor LlamaWeightLoader::load_stacked(const std::vector<std::pair<std::string, Shape>>& parts) {
  return stack_rows(backend_, backend_.compute_dtype(), parts,
                    [this](const std::string& name, const Shape& shape) { return load(name, shape); });
}

LinearWeight LlamaWeightLoader::load_linear(const std::vector<std::pair<std::string, Shape>>& parts) {
  const std::string suffix = ".weight";
  auto module_of = [&](const std::string& name) {
    return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0
               ? name.substr(0, name.size() - suffix.size())
               : name;
  };
  bool quantized = quantization_.quantizes(module_of(parts.front().first));
  for (const auto& [name, shape] : parts) {
    SPECULA_CHECK(quantization_.quantizes(module_of(name)) == quantized,
                  "{}: '{}' and '{}' are fused into one projection but only one of them is in the quantisation's "
                  "ignore list",
                  source_.describe(), parts.front().first, name);
  }
  if (!quantized) return LinearWeight{parts.size() == 1 ? load(parts[0].first, parts[0].second) : load_stacked(parts), {}};
  // Dummy weights stand in for an FP8 checkpoint by quantising their random bf16 values.
  if (quantization_.from_checkpoint && source_.stored_shape(parts.front().first)) return load_fp8_checkpoint(parts);
  // Quantised at load: the full-precision weight on the device, then one quantiser launch.
  Tensor full = parts.size() == 1 ? load(parts[0].first, parts[0].second) : load_stacked(parts);
  LinearWeight w{backend_.empty(full.shape(), DType::kF8E4M3), backend_.empty({full.size(0)}, DType::kF32)};
  backend_.quantize_fp8_rows(full, w.weight, w.scale);
  return w;
}

LinearWeight LlamaWeightLoader::load_fp8_checkpoint(const std::vector<std::pair<std::string, Shape>>& parts) {
  std::vector<float> scales;
  LinearWeight fused{stack_rows(backend_, DType::kF8E4M3, parts,
                                [&](const std::string& name, const Shape& shape) {
                                  const std::vector<float> s = load_row_scales(name, shape[0]);
                                  scales.insert(scales.end(), s.begin(), s.end());
                                  return source_.load(name, shape, DType::kF8E4M3, backend_);
                                }),
                     Tensor()};
  fused.scale = backend_.empty({static_cast<int64_t>(scales.size())}, DType::kF32);
  Tensor host = Tensor::from_f32(scales);
  backend_.copy(host, fused.scale);
  return fused;
}

std::optional<float> LlamaWeightLoader::load_scalar(const std::string& name) {
  const std::optional<Shape> shape = source_.stored_shape(name);
  if (!shape) return std::nullopt;
  int64_t numel = 1;
  for (int64_t d : *shape) numel *= d;
  SPECULA_CHECK(numel == 1, "{}: '{}' has shape {}: expected one value", source_.describe(), name, shape_str(*shape));
  Tensor dev = source_.load(name, *shape, DType::kF32, backend_);
  Tensor host = Tensor::empty(*shape, DType::kF32, Device::kCPU);
  backend_.copy(dev, host);
  backend_.synchronize();
  return host.to_f32_vector().front();
}

std::vector<float> LlamaWeightLoader::load_row_scales(const std::string& weight_name, int64_t rows) {
  const std::string name = weight_name + "_scale";
  const std::optional<Shape> shape = source_.stored_shape(name);
  SPECULA_CHECK(shape.has_value(), "{}: FP8 tensor '{}' has no '{}' beside it", source_.describe(), weight_name, name);
  int64_t numel = 1;
  for (int64_t d : *shape) numel *= d;
  SPECULA_CHECK(numel == 1 || numel == rows,
                "{}: '{}' has shape {}: expected one scale (per tensor) or {} (per output channel)",
                source_.describe(), name, shape_str(*shape), rows);
  Tensor dev = source_.load(name, *shape, DType::kF32, backend_);
  Tensor host = Tensor::empty(*shape, DType::kF32, Device::kCPU);
  backend_.copy(dev, host);
  backend_.synchronize();
  std::vector<float> s = host.to_f32_vector();
  if (numel == 1) s.assign(static_cast<size_t>(rows), s.front());
  return s;
}

Tensor make_rope_table(const ModelConfig& config, Backend& backend) {
  const int64_t max_positions = config.max_position_embeddings;
  SPECULA_CHECK(max_positions > 0, "{}: max_position_embeddings must be positive", architecture_name(config.arch));
  const int rotary_dim = static_cast<int>(config.rotary_dim());
  std::vector<float> table =
      rope_cos_sin_table(rope_frequencies(config.rope, rotary_dim, max_positions), max_positions);
  Tensor cos_sin = backend.empty({max_positions, rotary_dim}, DType::kF32);
  Tensor host = Tensor::from_f32(table, {max_positions, rotary_dim});
  backend.copy(host, cos_sin);
  return cos_sin;
}

LlamaDecoderLayer::LlamaDecoderLayer(const ModelConfig& config, Backend& backend, const Tensor& cos_sin,
                                     Communicator* communicator)
    : config_(config),
      backend_(backend),
      cos_sin_(cos_sin),
      communicator_(communicator),
      hidden_(config.hidden_size),
      num_heads_(config.num_attention_heads),
      num_kv_heads_(config.num_key_value_heads),
      head_dim_(config.head_dim),
      intermediate_(config.intermediate_size),
      rotary_dim_(static_cast<int>(config.rotary_dim())),
      eps_(static_cast<float>(config.rms_norm_eps)),
      // transformers: scaling = head_dim ** -0.5 (YaRN's attention factor lives in cos/sin).
      attn_scale_(static_cast<float>(1.0 / std::sqrt(static_cast<double>(config.head_dim)))) {
  SPECULA_CHECK(num_kv_heads_ > 0 && num_heads_ % num_kv_heads_ == 0,
                "{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                architecture_name(config.arch), num_heads_, num_kv_heads_);
  SPECULA_CHECK(config.hidden_act == "silu", "{}: hidden_act '{}' is not supported (only silu)",
                architecture_name(config.arch), config.hidden_act);
}

namespace {

// The layer's fp8 KV cache scales under the names checkpoints give them: self_attn.k_scale and
// v_scale (llm-compressor, vLLM), one self_attn.kv_scale for both, or AutoFP8's
// k_proj.output_scale and v_proj.output_scale.
std::optional<KVCacheScales> load_kv_cache_scales(LlamaWeightLoader& w, const std::string& p,
                                                  const std::string& source) {
  auto first_of = [&](std::initializer_list<std::string> names) -> std::pair<std::string, std::optional<float>> {
    for (const std::string& n : names) {
      if (std::optional<float> v = w.load_scalar(p + n)) return {p + n, v};
    }
    return {"", std::nullopt};
  };
  const auto [k_name, k] = first_of({"self_attn.k_scale", "self_attn.kv_scale", "self_attn.k_proj.output_scale"});
  const auto [v_name, v] = first_of({"self_attn.v_scale", "self_attn.kv_scale", "self_attn.v_proj.output_scale"});
  if (!k && !v) return std::nullopt;
  SPECULA_CHECK(k && v, "{}: '{}' has no {} scale beside it", source, k ? k_name : v_name, k ? "V" : "K");
  for (const auto& [name, value] : {std::pair{k_name, *k}, std::pair{v_name, *v}}) {
    SPECULA_CHECK(std::isfinite(value) && value > 0.0f, "{}: KV cache scale '{}' is {}: it must be positive",
                  source, name, value);
  }
  return KVCacheScales{*k, *v};
}

}  // namespace

LlamaLayerWeights LlamaDecoderLayer::load(LlamaWeightLoader& w, const std::string& p, int64_t k,
                                          bool with_input_layernorm) const {
  const int64_t nq = num_heads_ * head_dim_, nk = num_kv_heads_ * head_dim_;
  LlamaLayerWeights l;
  if (with_input_layernorm) l.input_layernorm = w.load(p + "input_layernorm.weight", {hidden_});
  l.qkv_proj = w.load_linear({{p + "self_attn.q_proj.weight", {nq, k}},
                              {p + "self_attn.k_proj.weight", {nk, k}},
                              {p + "self_attn.v_proj.weight", {nk, k}}});
  if (config_.attention_bias) {  // config.cc: Qwen2 always; Llama/Qwen3 attention_bias
    l.qkv_bias = w.load_stacked({{p + "self_attn.q_proj.bias", {nq}},
                                 {p + "self_attn.k_proj.bias", {nk}},
                                 {p + "self_attn.v_proj.bias", {nk}}});
  }
  if (config_.qk_norm) {
    l.q_norm = w.load(p + "self_attn.q_norm.weight", {head_dim_});
    l.k_norm = w.load(p + "self_attn.k_norm.weight", {head_dim_});
  }
  l.o_proj = w.load_linear({{p + "self_attn.o_proj.weight", {hidden_, nq}}});
  if (config_.o_proj_bias) l.o_bias = w.load(p + "self_attn.o_proj.bias", {hidden_});
  l.post_attention_layernorm = w.load(p + "post_attention_layernorm.weight", {hidden_});
  l.gate_up_proj = w.load_linear({{p + "mlp.gate_proj.weight", {intermediate_, hidden_}},
                                  {p + "mlp.up_proj.weight", {intermediate_, hidden_}}});
  l.down_proj = w.load_linear({{p + "mlp.down_proj.weight", {hidden_, intermediate_}}});
  if (config_.mlp_bias) {
    l.gate_up_bias = w.load_stacked({{p + "mlp.gate_proj.bias", {intermediate_}},
                                     {p + "mlp.up_proj.bias", {intermediate_}}});
    l.down_bias = w.load(p + "mlp.down_proj.bias", {hidden_});
  }
  l.kv_cache_scales = load_kv_cache_scales(w, p, w.describe());
  return l;
}

void LlamaDecoderLayer::attention(const LlamaLayerWeights& w, const Tensor& x, const Tensor* input_norm,
                                  const ForwardInput& in, KVCacheLayer& cache, Tensor& residual) const {
  const DType dt = backend_.compute_dtype();
  const int64_t t = x.size(0), hq = num_heads_, hk = num_kv_heads_, d = head_dim_;

  // One GEMM for q, k and v: [T, K] -> [T, (Hq + 2 Hk) D], then the prologue: split the heads,
  // apply Qwen3's per-head q/k RMSNorm, rope q and k, write k and v into the cache (the new
  // tokens' K/V go in first; attention then reads every key through the cache). One backend op,
  // so that a backend can fuse the two (Backend::qkv_projection).
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
    phase_profile::Scope p("model.qkv_projection (host)");
    backend_.qkv_projection(x, input_norm ? LinearPrologue::rms_norm(*input_norm, eps_) : LinearPrologue::none(),
                            w.qkv_proj, if_defined(w.qkv_bias), prologue, cache, in.attn.slot_mapping, q);
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

  // o_proj reads only attn: residual may be x, whose last reader (the qkv GEMM) ran before it.
  phase_profile::Scope p("model.o_gemm (host)");
  add_to_residual(attn.reshape({t, hq * d}), w.o_proj, if_defined(w.o_bias), residual);
}

void LlamaDecoderLayer::mlp(const LlamaLayerWeights& w, Tensor& residual) const {
  const DType dt = backend_.compute_dtype();
  const int64_t t = residual.size(0);
  phase_profile::Scope p("model.mlp (host)");
  Tensor act = backend_.scratch({t, intermediate_}, dt);  // silu(gate) * up
  backend_.fused_linear(residual, LinearPrologue::rms_norm(w.post_attention_layernorm, eps_), w.gate_up_proj,
                        if_defined(w.gate_up_bias), act, LinearEpilogue::kSiluMul);
  add_to_residual(act, w.down_proj, if_defined(w.down_bias), residual);
}

void LlamaDecoderLayer::add_to_residual(const Tensor& x, const LinearWeight& weight, const Tensor* bias,
                                        Tensor& residual) const {
  if (communicator_ == nullptr || communicator_->size() == 1) {
    backend_.fused_linear(x, LinearPrologue::none(), weight, bias, residual, LinearEpilogue::kAccumulate);
    return;
  }
  // Each rank's product covers its heads' or channels' columns only: sum them over the ranks first
  // (the bias is rank 0's alone, tensor_parallel_plan.h), then add once.
  Tensor partial = backend_.scratch(residual.shape(), backend_.compute_dtype());
  backend_.fused_linear(x, LinearPrologue::none(), weight, bias, partial, LinearEpilogue::kStore);
  communicator_->all_reduce_sum(partial);
  backend_.add(residual, partial, residual);
}

}  // namespace specula
