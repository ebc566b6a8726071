// make_mtp_proposer: the target checkpoint's own MTP layers (DeepSeek-V3's
// model.layers.{num_hidden_layers + i}), loaded onto the target's backend beside it.
#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/logging.h"
#include "model/shared_expert_fusion.h"
#include "model/weight_source.h"
#include "sampling/device_draft_sampler.h"
#include "spec_decode/mtp_proposer.h"
#include "spec_decode/proposer_registry.h"

namespace specula {

namespace {

// Weights one token reads in a DeepSeek decoder layer: MLA's projections and the MLP's active
// experts (top_k routed + shared) or its dense MLP. Only ratios matter (the cost model's prior).
double layer_params(const ModelConfig& c, int64_t layer) {
  const double h = static_cast<double>(c.hidden_size), heads = static_cast<double>(c.num_attention_heads);
  const double qk = static_cast<double>(c.qk_nope_head_dim + c.qk_rope_head_dim), v = static_cast<double>(c.v_head_dim);
  const double latent = static_cast<double>(c.kv_lora_rank), rope = static_cast<double>(c.qk_rope_head_dim);
  const double q = c.q_lora_rank ? static_cast<double>(*c.q_lora_rank) * (h + heads * qk) : h * heads * qk;
  const double attn = q + h * (latent + rope) + latent * heads * (static_cast<double>(c.qk_nope_head_dim) + v) + heads * v * h;
  const double mlp = c.is_moe_layer(layer)
                         ? 3.0 * h * static_cast<double>(c.moe_intermediate_size) *
                               static_cast<double>(c.num_experts_per_tok + c.n_shared_experts)
                         : 3.0 * h * static_cast<double>(c.intermediate_size);
  return attn + mlp;
}

double relative_cost(const ModelConfig& c) {
  const double h = static_cast<double>(c.hidden_size), head = h * static_cast<double>(c.vocab_size);
  double target = head;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) target += layer_params(c, l);
  const double mtp = layer_params(c, c.num_hidden_layers) + 2.0 * h * h + head;
  return std::clamp(mtp / std::max(1.0, target), 0.02, 1.0);
}

}  // namespace

std::unique_ptr<Proposer> make_mtp_proposer(const ProposerContext& ctx) {
  const ModelConfig& tc = ctx.engine.target_config;
  check_mtp_target(ctx.spec, tc, ctx.engine.target_model);
  const bool dummy = ctx.engine.load_format == "dummy";
  std::unique_ptr<WeightSource> weights =
      dummy ? make_dummy_weight_source(tc, ctx.engine.seed) : open_safetensors_checkpoint(ctx.engine.target_model);
  // The same fusion as the target's MoE layers, so the MTP block takes the same fused path.
  ModelOptions options;
  options.shared_expert_fusion = resolve_shared_expert_fusion(ctx.engine.shared_expert_fusion, tc, ctx.engine.backend.device());
  const auto t0 = std::chrono::steady_clock::now();
  // Dummy weights stand in for a real checkpoint, whose MTP copies of the embedding and head are
  // the target's own: share them rather than fill two more random vocab x hidden matrices.
  auto mtp = std::make_unique<DeepseekMtp>(tc, *weights, ctx.engine.backend, options, &ctx.engine.target, dummy);
  LOG_INFO("MTP loading took {:.2f} seconds",
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  if (ctx.spec.num_speculative_tokens > mtp->num_layers())
    LOG_INFO("MTP: {} draft tokens per step from {} MTP layer(s): drafts past the last layer reuse it on its own "
             "output", ctx.spec.num_speculative_tokens, mtp->num_layers());

  MtpProposerConfig c;
  c.num_speculative_tokens = ctx.spec.num_speculative_tokens;
  c.argmax_drafts = ctx.spec.draft_sampling == "argmax";
  c.max_num_seqs = ctx.engine.max_num_seqs;
  c.max_num_batched_tokens = ctx.engine.max_num_batched_tokens;
  c.max_model_len = ctx.engine.max_model_len;
  c.relative_step_cost = relative_cost(tc);
  return std::make_unique<MtpProposer>(std::move(mtp), ctx.engine.backend,
                                       make_draft_sampler(ctx.engine.backend, ctx.engine.max_num_seqs, tc.vocab_size), c);
}

}  // namespace specula
