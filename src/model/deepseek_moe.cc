// DeepSeek's MLPs: the dense SwiGLU MLP of the first first_k_dense_replace layers, and the MoE
// block of the others: routed experts chosen by the router, plus shared experts every token
// passes through:
//   out = sum_k w_k expert_{id_k}(x) + shared(x)
// With shared-expert fusion on, the shared expert sits among the experts (cut into
// n_shared_experts experts of the routed width, times the number of replicas), moe_route adds it
// to every row with weight 1, and one fused_moe call computes both terms.
#include <string>

#include "model/deepseek_layer.h"

namespace specula {

MoeWeights DeepseekDecoder::load_moe(DeepseekWeightLoader& l, const std::string& p) const {
  const int64_t e = config_.n_routed_experts, inter = config_.moe_intermediate_size;
  const int64_t shared_width = config_.n_shared_experts * inter;
  MoeWeights w;
  w.router = l.load_f32(p + "gate.weight", {e, hidden_});
  // V3 only; a checkpoint without it routes as with a zero bias (transformers' initial buffer).
  if (config_.arch == Architecture::kDeepseekV3 && l.has(p + "gate.e_score_correction_bias"))
    w.router_bias = l.load_f32(p + "gate.e_score_correction_bias", {e});
  const bool fused = routing_.shared_slots > 0;
  w.experts = l.load_experts(p, fused ? routing_.shared_replicas : 0);
  if (!fused && shared_width > 0) {
    w.shared.gate_up_proj = l.load_stacked({{p + "shared_experts.gate_proj.weight", {shared_width, hidden_}},
                                            {p + "shared_experts.up_proj.weight", {shared_width, hidden_}}});
    w.shared.down_proj = l.load(p + "shared_experts.down_proj.weight", {hidden_, shared_width});
  }
  return w;
}

// x: [T, H] -> [T, H].
Tensor DeepseekDecoder::moe(const MoeWeights& w, const Tensor& x) {
  const DType dt = backend_.compute_dtype();
  const int64_t t = x.size(0), e = w.router.size(0);

  // Router logits in fp32, as transformers computes them (hidden.float() @ gate.float()^T): linear
  // widens compute-dtype rows exactly against the fp32 router weights.
  Tensor logits = backend_.scratch({t, e}, DType::kF32);
  backend_.linear(x, w.router, nullptr, logits);
  const int64_t cols = routing_.columns();
  Tensor ids = backend_.scratch({t, cols}, DType::kI32);
  Tensor weights = backend_.scratch({t, cols}, DType::kF32);
  backend_.moe_route(logits, w.router_bias.defined() ? &w.router_bias : nullptr, routing_, ids, weights);

  Tensor out = backend_.scratch({t, hidden_}, dt);
  backend_.fused_moe(x, w.experts.w13, w.experts.w2, ids, weights, out);
  if (w.shared.gate_up_proj.defined()) {  // unfused shared experts: added after, as transformers does
    Tensor shared = mlp(w.shared, x);
    backend_.add(out, shared, out);
  }
  return out;
}

// SwiGLU: down_proj(silu(gate_proj(x)) * up_proj(x)), gate and up as one GEMM. [T, H] -> [T, H].
Tensor DeepseekDecoder::mlp(const DenseMlpWeights& w, const Tensor& x) {
  const DType dt = backend_.compute_dtype();
  const int64_t t = x.size(0), inter = w.down_proj.size(1);
  Tensor gate_up = backend_.scratch({t, 2 * inter}, dt);
  backend_.linear(x, w.gate_up_proj, nullptr, gate_up);
  Tensor act = backend_.scratch({t, inter}, dt);
  backend_.silu_mul(gate_up, act);
  Tensor out = backend_.scratch({t, hidden_}, dt);
  backend_.linear(act, w.down_proj, nullptr, out);
  return out;
}

}  // namespace specula
