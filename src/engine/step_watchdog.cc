#include "engine/step_watchdog.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include <unistd.h>

#include "core/error.h"
#include "core/logging.h"
#include "core/thread_stacks.h"

namespace specula {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

StepWatchdog::StepWatchdog(double timeout_seconds, std::function<std::string()> describe)
    : timeout_(timeout_seconds), describe_(std::move(describe)) {
  if (timeout_seconds > 0) thread_ = std::thread([this] { watch(); });
}

StepWatchdog::~StepWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StepWatchdog::step_started() {
  thread_local const pid_t tid = current_thread_id();
  step_thread_.store(tid, std::memory_order_relaxed);
  // The start before the count: a watcher that sees the new count sees its start.
  started_ns_.store(now_ns(), std::memory_order_relaxed);
  step_.fetch_add(1, std::memory_order_release);
  running_.store(true, std::memory_order_release);
}

double StepWatchdog::timeout_from_env() {
  const char* v = std::getenv("SPECULA_ENGINE_ITERATION_TIMEOUT_S");
  if (v == nullptr || *v == '\0') return 60.0;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  SPECULA_CHECK(end != v && *end == '\0', "SPECULA_ENGINE_ITERATION_TIMEOUT_S=\"{}\" is not a number of seconds", v);
  return s;
}

void StepWatchdog::watch() {
  const auto poll = std::chrono::duration<double>(std::clamp(timeout_ / 4, 0.01, 5.0));
  uint64_t warned_step = 0;  // the step the last warnings were about
  int64_t warned = 0;        // how many of them
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, poll, [&] { return stopping_; })) {
    if (!running_.load(std::memory_order_acquire)) continue;
    const uint64_t step = step_.load(std::memory_order_acquire);
    const double ran = static_cast<double>(now_ns() - started_ns_.load(std::memory_order_relaxed)) * 1e-9;
    const auto due = static_cast<int64_t>(ran / timeout_);  // warnings this step has earned
    if (step != warned_step) {
      warned_step = step;
      warned = 0;
    }
    if (due <= warned) continue;
    const bool first = warned == 0;
    warned = due;
    warnings_.fetch_add(1);
    lock.unlock();
    const std::string where = describe_ ? describe_() : std::string();
    LOG_WARN("Engine step {} has been running for {:.1f} s (SPECULA_ENGINE_ITERATION_TIMEOUT_S={:g}){}{}", step, ran,
             timeout_, where.empty() ? "" : ": ", where);
    if (first) {
      LOG_WARN("Stacks of the engine's threads (frames `binary(+0xOFFSET)`: addr2line -f -C -e <unstripped binary> "
               "0xOFFSET):");
      spdlog::default_logger_raw()->flush();
      write_thread_stacks(STDERR_FILENO, {step_thread_.load(std::memory_order_relaxed)});
    }
    lock.lock();
  }
}

}  // namespace specula
