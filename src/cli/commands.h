// Each subcommand of the `specula` binary registers its flags on the app and returns the
// callback that runs it.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace specula::cli {

using Runner = std::function<int()>;

// --shared-expert-fusion N, shared by serve and generate (EngineConfig::shared_expert_fusion).
inline constexpr const char* kSharedExpertFusionHelp =
    "DeepSeek MoE: fold N replicas of the shared expert into the routed experts, so one fused MoE call "
    "computes both (lossless); 0 = off, -1 = auto (1 on CUDA for models with shared experts, 0 on the CPU)";

Runner add_serve_command(CLI::App& app);     // specula serve [MODEL] ...
Runner add_generate_command(CLI::App& app);  // specula generate MODEL --prompt ...
Runner add_bench_command(CLI::App& app);     // specula bench latency|throughput ...

}  // namespace specula::cli
