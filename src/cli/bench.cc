#include "cli/commands.h"
#include "core/error.h"

namespace specula::cli {

Runner add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "not implemented yet");
  cmd->allow_extras();
  return [] () -> int { throw Error("specula bench: not implemented yet"); };
}

}  // namespace specula::cli
