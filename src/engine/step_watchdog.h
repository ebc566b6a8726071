// A warning for an engine step that does not finish: a step takes milliseconds, so one still
// running after `timeout` seconds is stuck (a tensor-parallel rank waiting for a peer that never
// arrives, a device that hangs). The loop thread brackets each step; a thread of the watchdog logs
// what `describe` says (the model's per-rank progress) once the step has run `timeout` seconds and
// again every `timeout` seconds while it still runs. It only reports: a stuck step cannot be
// interrupted safely, and the operator decides. vLLM's engine has the same bound
// (VLLM_ENGINE_ITERATION_TIMEOUT_S, 60 s); here SPECULA_ENGINE_ITERATION_TIMEOUT_S, 0 = off.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace specula {

class StepWatchdog {
 public:
  // timeout_seconds <= 0: no thread, nothing reported.
  StepWatchdog(double timeout_seconds, std::function<std::string()> describe);
  ~StepWatchdog();
  StepWatchdog(const StepWatchdog&) = delete;
  StepWatchdog& operator=(const StepWatchdog&) = delete;

  void step_started();
  void step_finished();
  int warnings() const;  // how many times it has warned (tests)

  // SPECULA_ENGINE_ITERATION_TIMEOUT_S, else 60; throws specula::Error for a value that is not a number.
  static double timeout_from_env();

 private:
  void watch();

  const std::chrono::duration<double> timeout_;
  const std::function<std::string()> describe_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool running_ = false;  // a step is running
  uint64_t step_ = 0;     // steps started so far
  bool stopping_ = false;
  int warnings_ = 0;
  std::chrono::steady_clock::time_point started_;
  std::thread thread_;
};

}  // namespace specula
