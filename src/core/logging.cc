#include "core/logging.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <mutex>
#include <string>

namespace specula {
namespace {

// vLLM prints the level in capitals ("INFO", "WARNING"); spdlog's %l prints "info".
class UpperLevelFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    static constexpr const char* kNames[] = {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", "OFF"};
    std::string_view name = kNames[static_cast<int>(msg.level)];
    dest.append(name.data(), name.data() + name.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<UpperLevelFlag>();
  }
};

}  // namespace

void init_logging() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_color_mt("specula");
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<UpperLevelFlag>('*').set_pattern("%^%*%$ %m-%d %H:%M:%S [%s:%#] %v");
    logger->set_formatter(std::move(formatter));
    spdlog::set_default_logger(logger);
    spdlog::level::level_enum level = spdlog::level::info;
    if (const char* env = std::getenv("SPECULA_LOGGING_LEVEL")) {
      level = spdlog::level::from_str(std::string(env));
      if (std::string(env) == "WARNING" || std::string(env) == "warning") level = spdlog::level::warn;
      if (std::string(env) == "DEBUG") level = spdlog::level::debug;
      if (std::string(env) == "ERROR") level = spdlog::level::err;
      if (std::string(env) == "INFO") level = spdlog::level::info;
    }
    logger->set_level(level);
    logger->flush_on(spdlog::level::info);
  });
}

void set_log_level(spdlog::level::level_enum level) {
  init_logging();
  spdlog::default_logger()->set_level(level);
}

}  // namespace specula
