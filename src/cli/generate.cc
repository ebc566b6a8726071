#include "cli/commands.h"
#include "core/error.h"

namespace specula::cli {

Runner add_generate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "not implemented yet");
  cmd->allow_extras();
  return [] () -> int { throw Error("specula generate: not implemented yet"); };
}

}  // namespace specula::cli
