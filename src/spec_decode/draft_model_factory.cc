// make_draft_model_proposer: the draft checkpoint named by --speculative-config, checked against
// the target and loaded onto the target's backend.
#include <chrono>
#include <filesystem>

#include "core/error.h"
#include "core/logging.h"
#include "model/weight_source.h"
#include "sampling/device_draft_sampler.h"
#include "spec_decode/draft_model_proposer.h"
#include "spec_decode/proposer_registry.h"
#include "tokenizer/tokenizer.h"

namespace specula {

namespace {

// Weights touched per decode step, roughly: attention and MLP matrices of every layer plus the
// head. Only the ratio draft / target matters (the prior of the adaptive depth's cost model).
double approx_step_params(const ModelConfig& c) {
  const double h = static_cast<double>(c.hidden_size);
  const double d = static_cast<double>(c.head_dim > 0 ? c.head_dim : c.hidden_size / std::max<int64_t>(1, c.num_attention_heads));
  const double attn = h * d * static_cast<double>(2 * c.num_attention_heads + 2 * c.num_key_value_heads);
  const double mlp = 3.0 * h * static_cast<double>(c.intermediate_size);
  return static_cast<double>(c.num_hidden_layers) * (attn + mlp) + h * static_cast<double>(c.vocab_size);
}

}  // namespace

std::unique_ptr<Proposer> make_draft_model_proposer(const ProposerContext& ctx) {
  namespace fs = std::filesystem;
  const SpeculativeConfig& spec = ctx.spec;
  SPECULA_CHECK(fs::exists(fs::path(spec.model) / "config.json"),
                "--speculative-config: the draft model folder \"{}\" has no config.json", spec.model);
  const ModelConfig draft_config = load_model_config(spec.model);
  std::unique_ptr<Tokenizer> draft_tokenizer;
  if (fs::exists(fs::path(spec.model) / "tokenizer.json")) {
    draft_tokenizer = Tokenizer::from_dir(spec.model);
  } else {
    LOG_WARN("The draft model {} has no tokenizer.json: assuming the target's tokenizer (vocab_size checked only)",
             spec.model);
  }
  const int draft_len = validate_draft_model(spec, ctx.engine.target_config, ctx.engine.target_tokenizer, draft_config,
                                             draft_tokenizer ? *draft_tokenizer : ctx.engine.target_tokenizer,
                                             ctx.engine.max_model_len);

  std::unique_ptr<WeightSource> weights = ctx.engine.load_format == "dummy"
                                              ? make_dummy_weight_source(draft_config, ctx.engine.seed + 1)
                                              : open_safetensors_checkpoint(spec.model);
  // vLLM's rule: the draft on the first GPU, or split like the target.
  const int ranks = spec.draft_tensor_parallel_size;
  SPECULA_CHECK(ranks == 1 || ranks == ctx.engine.tensor_parallel_size,
                "--speculative-config: draft_tensor_parallel_size={} must be 1 or the target's --tensor-parallel-size "
                "({})", ranks, ctx.engine.tensor_parallel_size);
  LOG_INFO("Loading draft model {} ({}) on {}{}", weights->describe(), architecture_name(draft_config.arch),
           ctx.engine.backend.name(), ranks > 1 ? fmt::format(", split over {} ranks", ranks) : std::string());
  const auto t0 = std::chrono::steady_clock::now();
  ModelOptions options;
  options.tensor_parallel_size = ranks;
  options.make_rank_backend = ctx.engine.make_rank_backend;
  options.custom_all_reduce = ctx.engine.custom_all_reduce;
  std::unique_ptr<Model> draft = create_model(draft_config, *weights, ctx.engine.backend, options);
  LOG_INFO("Draft model loading took {:.2f} seconds",
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  DraftModelProposerConfig c;
  c.num_speculative_tokens = spec.num_speculative_tokens;
  c.argmax_drafts = spec.draft_sampling == "argmax";
  c.max_num_seqs = ctx.engine.max_num_seqs;
  c.max_num_batched_tokens = ctx.engine.max_num_batched_tokens;
  c.max_model_len = ctx.engine.max_model_len;
  c.draft_max_model_len = draft_len;
  c.relative_step_cost =
      std::clamp(approx_step_params(draft_config) / std::max(1.0, approx_step_params(ctx.engine.target_config)), 0.02, 1.0);
  return std::make_unique<DraftModelProposer>(
      std::move(draft), ctx.engine.backend, make_draft_sampler(ctx.engine.backend, ctx.engine.max_num_seqs, draft_config.vocab_size), c);
}

}  // namespace specula
