#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "cli/vllm_flags.h"
#include "core/error.h"
#include "core/logging.h"

int main(int argc, char** argv) {
  specula::init_logging();
  CLI::App app{"specula: an LLM inference engine with speculative decoding"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "specula 0.1.0");
  // A flag given twice: the last one wins, as with vLLM's argparse.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  auto serve = specula::cli::add_serve_command(app);
  auto generate = specula::cli::add_generate_command(app);
  auto bench = specula::cli::add_bench_command(app);
  if (std::optional<int> code = specula::cli::parse_or_exit_code(app, argc, argv)) return *code;
  try {
    if (app.got_subcommand("serve")) return serve();
    if (app.got_subcommand("generate")) return generate();
    if (app.got_subcommand("bench")) return bench();
  } catch (const specula::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 1;
}
