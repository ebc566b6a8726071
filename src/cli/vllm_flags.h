// vLLM's everyday engine flags that every subcommand accepts (serve, generate, bench), so that a
// vLLM command line works unchanged: each either does what it does in vLLM or, where specula
// cannot (yet), fails with one line saying so; none is silently ignored unless it has no effect
// in vLLM either (--trust-remote-code: specula runs no model code).
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>

#include "engine/llm_engine.h"

namespace specula::cli {

struct VllmFlags {
  std::string dtype = "auto";
  std::string kv_cache_dtype = "auto";
  bool calculate_kv_scales = false;
  std::string quantization;
  int tensor_parallel_size = 1;
  int pipeline_parallel_size = 1;
  bool enable_chunked_prefill = true;
  bool disable_log_stats = false;
  bool disable_log_requests = false;
  bool trust_remote_code = false;
  bool disable_custom_all_reduce = false;
  std::optional<bool> async_scheduling;
};

void add_vllm_flags(CLI::App* cmd, VllmFlags& flags);
// Copies the flags' meanings into the engine's config (validated by LLMEngine::create).
void apply_vllm_flags(const VllmFlags& flags, EngineConfig& config);

// Parses argv: nothing when it parsed, else the exit code after the message (--help, errors). An
// unknown flag is answered with the nearest flag of its subcommand ("did you mean ...?").
std::optional<int> parse_or_exit_code(CLI::App& app, int argc, char** argv);

}  // namespace specula::cli
