// Each subcommand of the `specula` binary registers its flags on the app and returns the
// callback that runs it.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace specula::cli {

using Runner = std::function<int()>;

Runner add_serve_command(CLI::App& app);     // specula serve [MODEL] ...
Runner add_generate_command(CLI::App& app);  // specula generate MODEL --prompt ...
Runner add_bench_command(CLI::App& app);     // specula bench latency|throughput ...

}  // namespace specula::cli
