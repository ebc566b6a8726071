// A warning for an engine step that does not finish: a step takes milliseconds, so one still
// running after `timeout` seconds is stuck (a tensor-parallel rank waiting for a peer that never
// arrives, a device that hangs). The loop thread marks each step's start and end (two atomic
// stores: nothing on the hot path waits or wakes a thread); a thread of the watchdog looks every
// quarter timeout and logs what `describe` says (the model's per-rank progress) once a step has
// run `timeout` seconds, and again every `timeout` seconds while it still runs; the first time,
// also the stacks of the thread running the step and of every thread named for it (the
// ranks'), which say which call a stuck rank is blocked in. It only reports:
// a stuck step cannot be interrupted safely, and the operator decides. vLLM's engine has the same
// bound (VLLM_ENGINE_ITERATION_TIMEOUT_S, 60 s); here SPECULA_ENGINE_ITERATION_TIMEOUT_S, 0 = off.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include <sys/types.h>

namespace specula {

class StepWatchdog {
 public:
  // timeout_seconds <= 0: no thread, nothing reported.
  StepWatchdog(double timeout_seconds, std::function<std::string()> describe);
  ~StepWatchdog();
  StepWatchdog(const StepWatchdog&) = delete;
  StepWatchdog& operator=(const StepWatchdog&) = delete;

  void step_started();
  void step_finished() { running_.store(false, std::memory_order_release); }
  int warnings() const { return warnings_.load(); }  // how many times it has warned (tests)

  // SPECULA_ENGINE_ITERATION_TIMEOUT_S, else 60; throws specula::Error for a value that is not a number.
  static double timeout_from_env();

 private:
  void watch();

  const double timeout_;
  const std::function<std::string()> describe_;
  std::atomic<int64_t> started_ns_{0};  // the running step's start (steady clock)
  std::atomic<uint64_t> step_{0};       // steps started so far
  std::atomic<pid_t> step_thread_{0};   // the thread running them
  std::atomic<bool> running_{false};
  std::atomic<int> warnings_{0};
  std::mutex mu_;  // guards stopping_
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace specula
