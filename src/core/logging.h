// Logging in the shape a vLLM user reads: `INFO 11-22 18:52:01 [scheduler.cc:88] message`.
#pragma once

#include <spdlog/spdlog.h>

namespace specula {

// Sets up the global logger once (level from SPECULA_LOGGING_LEVEL, default INFO; output stderr).
void init_logging();
void set_log_level(spdlog::level::level_enum level);

}  // namespace specula

#define LOG_DEBUG(...) SPDLOG_LOGGER_CALL(spdlog::default_logger_raw(), spdlog::level::debug, __VA_ARGS__)
#define LOG_INFO(...) SPDLOG_LOGGER_CALL(spdlog::default_logger_raw(), spdlog::level::info, __VA_ARGS__)
#define LOG_WARN(...) SPDLOG_LOGGER_CALL(spdlog::default_logger_raw(), spdlog::level::warn, __VA_ARGS__)
#define LOG_ERROR(...) SPDLOG_LOGGER_CALL(spdlog::default_logger_raw(), spdlog::level::err, __VA_ARGS__)
