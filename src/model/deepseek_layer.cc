// DeepseekDecoder: the settings fixed at load time (attention scale, rope table, routing) and one
// decoder layer's load and forward. MLA lives in deepseek_mla.cc, the MLPs in deepseek_moe.cc.
//
// The reference is transformers 5.17 (modeling_deepseek_v2.py / modeling_deepseek_v3.py); where
// the two classes differ, so do we:
//   * rope: V2 rotates interleaved pairs (complex multiplication, apply_rotary_emb); V3 rotates
//     interleaved pairs when rope_interleave (its default) and rotate_half pairs otherwise. V3
//     de-interleaves q_pe and k_pe before rotating, which permutes the same dims of q and k alike
//     and so leaves every q.k product, and the attention, unchanged.
//   * softmax scale (both): qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 when the
//     rope is scaled (yarn) and mscale_all_dim is set, as DeepSeek's own code does. (Some older
//     transformers releases left it out of the V2 class; the 5.17 fixture with yarn needs it.)
//   * routing: see routing_for() below.
#include "model/deepseek_layer.h"

#include <cmath>
#include <string>

#include "core/logging.h"
#include "model/rope.h"

namespace specula {
namespace {

// DeepSeek's yarn_get_mscale: 0.1 * mscale * ln(scale) + 1 (1 when scale <= 1).
double yarn_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

float softmax_scale(const ModelConfig& c) {
  double scale = 1.0 / std::sqrt(static_cast<double>(c.qk_nope_head_dim + c.qk_rope_head_dim));
  if (c.rope.type != RopeConfig::Type::kDefault && c.rope.mscale_all_dim != 0.0) {
    const double m = yarn_mscale(c.rope.factor, c.rope.mscale_all_dim);
    scale *= m * m;
  }
  return static_cast<float>(scale);
}

// transformers' routers. V2 (DeepseekV2Moe): softmax scores; topk_method greedy (plain top-k) or
// group_limited_greedy (groups scored by their best expert); weights * routed_scaling_factor
// (norm_topk_prob and scoring_func are not read). V3 (DeepseekV3MoE): sigmoid scores, the
// e_score_correction_bias for the choice, groups scored by their two best, norm_topk_prob,
// routed_scaling_factor (topk_method and scoring_func are not read).
MoeRouting routing_for(const ModelConfig& c, int shared_expert_fusion) {
  const std::string arch = architecture_name(c.arch);
  MoeRouting r;
  r.top_k = static_cast<int>(c.num_experts_per_tok);
  r.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
  if (c.arch == Architecture::kDeepseekV2) {
    r.scoring = MoeRouting::Scoring::kSoftmax;
    r.group_score = MoeRouting::GroupScore::kMax;
    if (c.topk_method == "group_limited_greedy") {
      r.num_groups = static_cast<int>(c.n_group);
      r.topk_groups = static_cast<int>(c.topk_group);
    } else {
      SPECULA_CHECK(c.topk_method == "greedy",
                    "{}: topk_method '{}' is not supported (DeepseekV2 routes with greedy or group_limited_greedy)",
                    arch, c.topk_method);
    }
    if (c.norm_topk_prob) LOG_WARN("{}: norm_topk_prob=true is ignored, as transformers' DeepseekV2Moe ignores it", arch);
    if (c.scoring_func != "softmax")
      LOG_WARN("{}: scoring_func '{}' is ignored; DeepseekV2 routes with softmax", arch, c.scoring_func);
  } else {
    r.scoring = MoeRouting::Scoring::kSigmoid;
    r.group_score = MoeRouting::GroupScore::kTopTwoSum;
    r.num_groups = static_cast<int>(c.n_group);
    r.topk_groups = static_cast<int>(c.topk_group);
    r.renormalize = c.norm_topk_prob;
  }
  const int64_t selectable = c.n_routed_experts / r.num_groups * r.topk_groups;
  SPECULA_CHECK(r.top_k <= selectable,
                "{}: num_experts_per_tok ({}) exceeds the experts of the topk_group ({}) groups kept out of n_group "
                "({}): {}", arch, r.top_k, r.topk_groups, r.num_groups, selectable);
  if (shared_expert_fusion > 0 && c.n_shared_experts > 0) {
    r.shared_slots = static_cast<int>(c.n_shared_experts);
    r.shared_replicas = shared_expert_fusion;
    r.shared_first = static_cast<int>(c.n_routed_experts);
  }
  return r;
}

}  // namespace

DeepseekDecoder::DeepseekDecoder(const ModelConfig& c, Backend& backend, const ModelOptions& options,
                                 Communicator* communicator)
    : config_(c),
      backend_(backend),
      communicator_(communicator),
      shared_expert_fusion_(options.shared_expert_fusion),
      hidden_(c.hidden_size),
      heads_(c.num_attention_heads),
      nope_(c.qk_nope_head_dim),
      rope_dim_(c.qk_rope_head_dim),
      v_dim_(c.v_head_dim),
      latent_(c.kv_lora_rank),
      eps_(static_cast<float>(c.rms_norm_eps)),
      attn_scale_(softmax_scale(c)),
      neox_rope_(c.arch == Architecture::kDeepseekV3 && !c.rope_interleave) {
  const std::string arch = architecture_name(c.arch);
  SPECULA_CHECK(c.is_deepseek(), "DeepseekDecoder: {} is not a DeepSeek architecture", arch);
  SPECULA_CHECK(c.hidden_act == "silu", "{}: hidden_act '{}' is not supported (only silu)", arch, c.hidden_act);
  SPECULA_CHECK(!c.mlp_bias, "{}: mlp_bias=true is not supported", arch);
  SPECULA_CHECK(options.shared_expert_fusion >= 0, "shared_expert_fusion must be >= 0 (0 = off), got {}",
                options.shared_expert_fusion);
  routing_ = routing_for(c, shared_expert_fusion_);

  const int64_t max_positions = c.max_position_embeddings;
  SPECULA_CHECK(max_positions > 0, "{}: max_position_embeddings must be positive", arch);
  std::vector<float> table = rope_cos_sin_table(rope_frequencies(c.rope, rope_dim_, max_positions), max_positions);
  cos_sin_ = backend.empty({max_positions, rope_dim_}, DType::kF32);
  Tensor host = Tensor::from_f32(table, {max_positions, rope_dim_});
  backend.copy(host, cos_sin_);
}

DeepseekLayerWeights DeepseekDecoder::load_layer(DeepseekWeightLoader& l, int64_t index) const {
  const std::string p = "model.layers." + std::to_string(index) + ".";
  DeepseekLayerWeights w;
  w.input_layernorm = l.load(p + "input_layernorm.weight", {hidden_});
  w.post_attention_layernorm = l.load(p + "post_attention_layernorm.weight", {hidden_});
  w.attn = load_mla(l, p + "self_attn.");
  w.is_moe = config_.is_moe_layer(index);
  if (w.is_moe) {
    w.moe = load_moe(l, p + "mlp.");
  } else {
    const int64_t inter = config_.intermediate_size;
    w.mlp.gate_up_proj = l.load_stacked({{p + "mlp.gate_proj.weight", {inter, hidden_}},
                                         {p + "mlp.up_proj.weight", {inter, hidden_}}});
    w.mlp.down_proj = l.load(p + "mlp.down_proj.weight", {hidden_, inter});
  }
  return w;
}

Tensor DeepseekDecoder::forward(const DeepseekLayerWeights& w, Tensor& x, Tensor& residual, const ForwardInput& in,
                                KVCacheLayer& cache) {
  backend_.add_rms_norm(x, residual, w.input_layernorm, eps_);
  Tensor a = attention(w.attn, x, in, cache);
  all_reduce(a);
  backend_.add_rms_norm(a, residual, w.post_attention_layernorm, eps_);
  Tensor out = w.is_moe ? moe(w.moe, a) : mlp(w.mlp, a);
  all_reduce(out);  // routed and shared experts' partial sums together
  return out;
}

void DeepseekDecoder::all_reduce(Tensor& partial) {
  if (communicator_ != nullptr && communicator_->size() > 1) communicator_->all_reduce_sum(partial);
}

}  // namespace specula
