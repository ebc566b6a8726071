// `specula generate MODEL --prompt "..."`: one completion, streamed to stdout as the engine
// produces it. It goes through the same LLMEngine as `specula serve` (queue, scheduler, streams),
// so what it prints is what the server would send.
#include <chrono>
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "cli/vllm_flags.h"
#include "core/error.h"
#include "engine/generation_defaults.h"
#include "app/create_engine.h"
#include "engine/llm_engine.h"
#include "tokenizer/tokenizer.h"

namespace specula::cli {
namespace {

struct GenerateArgs {
  EngineConfig engine;
  std::string prompt;
  int max_tokens = 0;
  float temperature = 0, top_p = 0, min_p = 0;
  int top_k = 0;
  uint64_t seed = 0;
  bool ignore_eos = false;
  VllmFlags vllm;
  CLI::Option *max_tokens_opt = nullptr, *temperature_opt = nullptr, *top_p_opt = nullptr, *top_k_opt = nullptr,
              *min_p_opt = nullptr, *seed_opt = nullptr;
};

int run_generate(GenerateArgs& a) {
  auto engine = create_engine(a.engine);
  engine->start();

  // generation_config.json's defaults, then the flags given.
  SamplingParams p = default_sampling_params(engine->generation_config());
  if (a.max_tokens_opt->count()) p.max_tokens = a.max_tokens;
  if (a.temperature_opt->count()) p.temperature = a.temperature;
  if (a.top_p_opt->count()) p.top_p = a.top_p;
  if (a.top_k_opt->count()) p.top_k = a.top_k;
  if (a.min_p_opt->count()) p.min_p = a.min_p;
  if (a.seed_opt->count()) p.seed = a.seed;
  p.ignore_eos = a.ignore_eos;
  std::vector<int32_t> ids = engine->tokenizer().encode(a.prompt, /*add_special_tokens=*/true);
  if (p.max_tokens && static_cast<int>(ids.size()) + *p.max_tokens > engine->max_model_len())
    p.max_tokens = std::max(1, engine->max_model_len() - static_cast<int>(ids.size()));

  const auto t0 = std::chrono::steady_clock::now();
  auto stream = engine->add_request(NewRequest{"generate-0", std::move(ids), p});
  RequestOutput out;
  size_t generated = 0;
  int prompt_tokens = 0;
  FinishReason reason = FinishReason::kNone;
  double first_token_s = -1;
  while (true) {
    if (!stream->pop(&out, std::chrono::milliseconds(100))) continue;
    if (out.error) throw Error(*out.error);
    prompt_tokens = out.num_prompt_tokens;
    for (const ChoiceDelta& d : out.choices) {
      if (first_token_s < 0 && !d.token_ids.empty())
        first_token_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fwrite(d.text.data(), 1, d.text.size(), stdout);
      generated += d.token_ids.size();
      if (d.finish_reason != FinishReason::kNone) reason = d.finish_reason;
    }
    std::fflush(stdout);
    if (out.finished) break;
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "finish_reason=%s, %d prompt tokens, %zu generated tokens, time to first token %.3f s, %.1f tokens/s\n",
               finish_reason_name(reason).c_str(), prompt_tokens, generated, first_token_s,
               secs > 0 ? static_cast<double>(generated) / secs : 0.0);
  engine->shutdown();
  return 0;
}

}  // namespace

Runner add_generate_command(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate", "generate one completion, streamed to stdout");
  cmd->add_option("model", args->engine.model, "model folder (config.json, *.safetensors, tokenizer.json)")->required();
  cmd->add_option("--prompt", args->prompt, "the prompt text")->required();
  args->max_tokens_opt = cmd->add_option("--max-tokens", args->max_tokens, "tokens to generate (default: up to max-model-len)");
  args->temperature_opt = cmd->add_option("--temperature", args->temperature, "0 = greedy");
  args->top_p_opt = cmd->add_option("--top-p", args->top_p);
  args->top_k_opt = cmd->add_option("--top-k", args->top_k);
  args->min_p_opt = cmd->add_option("--min-p", args->min_p);
  args->seed_opt = cmd->add_option("--seed", args->seed, "sampling seed (also seeds dummy weights)");
  cmd->add_flag("--ignore-eos", args->ignore_eos, "keep generating past eos");
  cmd->add_option("--device", args->engine.device, "auto | cuda | cpu")->check(CLI::IsMember({"auto", "cuda", "cpu"}));
  cmd->add_option("--load-format", args->engine.load_format, "auto | safetensors | dummy")
      ->check(CLI::IsMember({"auto", "safetensors", "dummy"}));
  cmd->add_option("--max-model-len", args->engine.max_model_len, "context length (default: the model's)");
  cmd->add_option("--tokenizer", args->engine.tokenizer, "tokenizer folder (default: the model folder)");
  cmd->add_option("--speculative-config", args->engine.speculative_config,
                  "speculative decoding as JSON, e.g. '{\"method\": \"draft_model\", \"model\": "
                  "\"models/specula-tiny-draft\", \"num_speculative_tokens\": 3}'");
  cmd->add_option("--shared-expert-fusion", args->engine.shared_expert_fusion, kSharedExpertFusionHelp)
      ->capture_default_str()->check(CLI::Range(-1, 64));
  add_vllm_flags(cmd, args->vllm);
  return [args]() -> int {
    apply_vllm_flags(args->vllm, args->engine);
    if (args->seed_opt->count()) args->engine.seed = args->seed;
    // One request: a small batch keeps the default CPU KV cache small.
    args->engine.max_num_seqs = 1;
    return run_generate(*args);
  };
}

}  // namespace specula::cli
