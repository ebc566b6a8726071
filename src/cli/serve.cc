#include "cli/commands.h"
#include "core/error.h"

namespace specula::cli {

Runner add_serve_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "not implemented yet");
  cmd->allow_extras();
  return [] () -> int { throw Error("specula serve: not implemented yet"); };
}

}  // namespace specula::cli
