// make_eagle_proposer: the EAGLE head named by --speculative-config, checked against the target,
// loaded onto the target's backend; the target then returns the head's features every forward.
#include <algorithm>
#include <chrono>
#include <filesystem>

#include "core/error.h"
#include "core/logging.h"
#include "model/weight_source.h"
#include "sampling/device_draft_sampler.h"
#include "spec_decode/eagle_proposer.h"
#include "spec_decode/proposer_registry.h"

namespace specula {

namespace {

// Weights one token reads: attention and MLP of `layers` layers of `c` plus a head of `head_rows`
// rows. Only the ratio head / target matters (the cost model's prior).
double step_params(const ModelConfig& c, int64_t layers, int64_t attention_input, int64_t head_rows) {
  const double h = static_cast<double>(c.hidden_size), d = static_cast<double>(c.head_dim);
  const double qkv = static_cast<double>(attention_input) * d *
                     static_cast<double>(c.num_attention_heads + 2 * c.num_key_value_heads);
  const double o = h * d * static_cast<double>(c.num_attention_heads);
  const double mlp = 3.0 * h * static_cast<double>(c.intermediate_size);
  return static_cast<double>(layers) * (qkv + o + mlp) + h * static_cast<double>(head_rows);
}

}  // namespace

std::unique_ptr<Proposer> make_eagle_proposer(const ProposerContext& ctx) {
  const SpeculativeConfig& spec = ctx.spec;
  const SpeculatorContext& engine = ctx.engine;
  const EagleVersion version = spec.method == "eagle3" ? EagleVersion::kEagle3 : EagleVersion::kEagle1;
  const ModelConfig& tc = engine.target_config;
  EagleHeadConfig config = load_eagle_head_config(spec.model, version, tc);
  // The head attends over the target's positions, whatever length it was trained at.
  config.layer.max_position_embeddings =
      std::max<int64_t>({config.layer.max_position_embeddings, tc.max_position_embeddings,
                         static_cast<int64_t>(engine.max_model_len) + spec.num_speculative_tokens});
  const bool dummy = engine.load_format == "dummy";
  std::unique_ptr<WeightSource> weights =
      dummy ? make_dummy_weight_source(config.layer, engine.seed + 1) : open_safetensors_checkpoint(spec.model);
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<EagleHead> head;
  try {
    head = std::make_unique<EagleHead>(config, *weights, engine.backend, engine.target, dummy);
  } catch (const Error& e) {
    throw Error(fmt::format("--speculative-config: the {} head {} does not fit the target {}: {}", spec.method,
                            spec.model, engine.target_model, e.what()));
  }
  LOG_INFO("EAGLE head loading took {:.2f} seconds",
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  if (version == EagleVersion::kEagle3) engine.target.set_aux_hidden_state_layers(config.aux_layers);

  ModelProposerConfig c;
  c.num_speculative_tokens = spec.num_speculative_tokens;
  c.argmax_drafts = spec.draft_sampling == "argmax";
  c.max_num_seqs = engine.max_num_seqs;
  c.max_num_batched_tokens = engine.max_num_batched_tokens;
  c.max_model_len = engine.max_model_len;
  const int64_t h = config.layer.hidden_size;
  const double head_cost = step_params(config.layer, 1, version == EagleVersion::kEagle3 ? 2 * h : h,
                                       version == EagleVersion::kEagle3 ? config.draft_vocab_size : tc.vocab_size);
  const double target_cost = step_params(tc, tc.num_hidden_layers, tc.hidden_size, tc.vocab_size);
  c.relative_step_cost = std::clamp(head_cost / std::max(1.0, target_cost), 0.02, 1.0);
  return std::make_unique<EagleProposer>(std::move(head), engine.backend,
                                         make_draft_sampler(engine.backend, engine.max_num_seqs, tc.vocab_size), c);
}

}  // namespace specula
