#include "engine/step_watchdog.h"

#include <cstdlib>

#include "core/error.h"
#include "core/logging.h"

namespace specula {

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
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = true;
    ++step_;
    started_ = std::chrono::steady_clock::now();
  }
  cv_.notify_all();
}

void StepWatchdog::step_finished() {
  if (!thread_.joinable()) return;
  std::lock_guard<std::mutex> lock(mu_);
  running_ = false;
}

int StepWatchdog::warnings() const {
  std::lock_guard<std::mutex> lock(mu_);
  return warnings_;
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
  const auto timeout = std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout_);
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t watched = 0;  // the step `due` belongs to
  std::chrono::steady_clock::time_point due;
  while (!stopping_) {
    if (!running_) {
      cv_.wait(lock, [&] { return stopping_ || running_; });
      continue;
    }
    if (step_ != watched) {
      watched = step_;
      due = started_ + timeout;
    }
    if (cv_.wait_until(lock, due, [&] { return stopping_ || !running_ || step_ != watched; })) continue;
    const double ran = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    due += timeout;  // again a timeout later while the step still runs
    ++warnings_;
    lock.unlock();
    const std::string where = describe_ ? describe_() : std::string();
    LOG_WARN("Engine step {} has been running for {:.1f} s (SPECULA_ENGINE_ITERATION_TIMEOUT_S={:g}){}{}", watched,
             ran, timeout_.count(), where.empty() ? "" : ": ", where);
    lock.lock();
  }
}

}  // namespace specula
