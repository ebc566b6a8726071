#include "cli/vllm_flags.h"

#include <cstdlib>

#include <cstdio>
#include <utility>
#include <string_view>
#include <vector>

#include "core/edit_distance.h"

namespace specula::cli {

void add_vllm_flags(CLI::App* cmd, VllmFlags& f) {
  cmd->add_option("--dtype", f.dtype,
                  "Weights and activations: auto (bfloat16 on CUDA, float32 on the CPU), or that type "
                  "(half/float16, bfloat16, float/float32) where the device computes in it")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "half", "float16", "bfloat16", "float", "float32"}));
  cmd->add_option("--kv-cache-dtype", f.kv_cache_dtype,
                  "KV cache type: auto (the compute type), or fp8 / fp8_e4m3 (e4m3 with the checkpoint's k/v "
                  "scales or 1.0: half the bytes, so twice the tokens fit; not for MLA models)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "bfloat16", "float16", "float32", "fp8", "fp8_e4m3", "fp8_e5m2"}));
  cmd->add_flag("--calculate-kv-scales", f.calculate_kv_scales,
               "With --kv-cache-dtype fp8: per-layer scales from a batch of random tokens at startup (largest |K| / "
               "200, |V| / 100) instead of the checkpoint's k/v_scale or 1.0");
  cmd->add_option("-q,--quantization", f.quantization,
                  "Weight quantisation: fp8 quantises bf16 linear layers to e4m3 at load (one scale per output "
                  "row); default: what the checkpoint's quantization_config says");
  cmd->add_option("--tensor-parallel-size", f.tensor_parallel_size, "Ranks to split the model over, Megatron-style (also -tp): one GPU each on CUDA (NCCL), "
                  "threads on the CPU")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_flag("--disable-custom-all-reduce", f.disable_custom_all_reduce,
                "Tensor parallel on GPUs: all-reduce through NCCL only (default: small all-reduces run as one "
                "peer-to-peer kernel where the GPUs map each other's memory)");
  cmd->add_option("--pipeline-parallel-size", f.pipeline_parallel_size, "Pipeline stages (also -pp; 1)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_flag("--enable-chunked-prefill,!--no-enable-chunked-prefill", f.enable_chunked_prefill,
                "Split long prompts over steps beside decodes (on); off: a step fits a whole max-model-len prompt");
  // A callback, not add_flag on the optional: CLI11 (2.1) sets an optional flag to false when it
  // is absent, which would hide the engine's default.
  cmd->add_flag_function("--async-scheduling,!--no-async-scheduling",
                         [&f](std::int64_t count) { f.async_scheduling = count > 0; },
                "Keep one engine step in flight: the host schedules step N+1 and processes step N's tokens "
                "while the device runs (default: on for one GPU with CUDA graphs, without speculation or with "
                "drafts made on the device (draft_model, eagle/eagle3, mtp), where it measured faster; off "
                "otherwise; the startup log says which and why)");
  cmd->add_flag("--disable-log-stats", f.disable_log_stats, "No periodic stats line");
  cmd->add_flag("--disable-log-requests", f.disable_log_requests,
                "Accepted for vLLM compatibility (specula does not log request contents)");
  cmd->add_flag("--trust-remote-code", f.trust_remote_code, "Accepted for vLLM compatibility (no model code runs)");
}

void apply_vllm_flags(const VllmFlags& f, EngineConfig& c) {
  c.dtype = f.dtype;
  c.kv_cache_dtype = f.kv_cache_dtype;
  c.calculate_kv_scales = f.calculate_kv_scales;
  c.quantization = f.quantization;
  c.tensor_parallel_size = f.tensor_parallel_size;
  // Ranks on several GPUs spin in NCCL kernels until their peers arrive; loading a kernel lazily at
  // its first launch (CUDA's default) may wait for its GPU to go idle, and then both wait for ever.
  // Every kernel loads when CUDA starts instead (this runs before the engine touches CUDA; a value
  // the user set wins).
  if (f.tensor_parallel_size > 1) setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
  c.custom_all_reduce = !f.disable_custom_all_reduce;
  c.pipeline_parallel_size = f.pipeline_parallel_size;
  c.enable_chunked_prefill = f.enable_chunked_prefill;
  c.log_stats = !f.disable_log_stats;
  if (f.async_scheduling) c.async_scheduling = f.async_scheduling;
}

namespace {

// The long names of `app`'s options ("--max-model-len"), for "did you mean".
std::vector<std::string> option_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : app.get_options()) {
    for (const std::string& n : opt->get_lnames()) names.push_back("--" + n);
    for (const std::string& n : opt->get_fnames()) names.push_back("--" + n);
  }
  return names;
}

}  // namespace

std::optional<int> parse_or_exit_code(CLI::App& app, int argc, char** argv) {
  // vLLM spells two flags with one dash and two letters, which CLI11 cannot name: -tp and -pp
  // become their long forms. CLI11 takes the arguments last first.
  std::vector<std::string> args;
  for (int i = argc - 1; i >= 1; --i) {
    std::string a = argv[i];
    for (const auto& [alias, name] : {std::pair<const char*, const char*>{"-tp", "--tensor-parallel-size"},
                                      {"-pp", "--pipeline-parallel-size"}}) {
      if (a == alias) a = name;
      else if (a.rfind(std::string(alias) + "=", 0) == 0) a = name + a.substr(3);
    }
    args.push_back(std::move(a));
  }
  try {
    app.parse(args);
  } catch (const CLI::ExtrasError& e) {
    // Which subcommand the stray flag was given to: the parsed one, else the top level.
    const CLI::App* scope = &app;
    for (const CLI::App* sub : app.get_subcommands()) scope = sub;
    for (const CLI::App* sub : scope->get_subcommands()) scope = sub;
    std::string stray;
    for (const std::string& a : (scope == &app ? app.remaining() : scope->remaining())) {
      if (a.rfind("--", 0) == 0) {
        stray = a.substr(0, a.find('='));
        break;
      }
    }
    const std::vector<std::string> names = option_names(*scope);
    std::vector<std::string_view> candidates(names.begin(), names.end());
    if (!stray.empty() && !candidates.empty()) {
      std::fprintf(stderr, "error: unrecognized argument %s; did you mean %s?\n", stray.c_str(),
                   std::string(nearest_key(stray, candidates)).c_str());
      return 2;
    }
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return std::nullopt;
}

}  // namespace specula::cli
