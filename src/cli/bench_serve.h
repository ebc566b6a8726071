// `specula bench serve`: a client benchmark against a running OpenAI-compatible server, as vLLM's
// `vllm bench serve` (bench_serve.cc).
#pragma once

#include "cli/commands.h"

namespace specula::cli {

// Registers `serve` under the `bench` subcommand; the runner returns the exit status.
Runner add_bench_serve_command(CLI::App& bench);

}  // namespace specula::cli
