// StepWatchdog: a warning (with the model's progress) for a step that runs past the timeout, again
// every timeout while it runs, none for steps within it, none when off; the timeout's variable.
#include "engine/step_watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "core/error.h"

namespace specula {
namespace {

using std::chrono::milliseconds;

TEST(StepWatchdog, WarnsWhileAStepRunsPastItsTimeoutAndStopsWhenItEnds) {
  std::atomic<int> asked{0};
  StepWatchdog w(0.05, [&] {
    ++asked;
    return std::string("rank 0: 3 collectives entered, device busy");
  });
  w.step_started();
  std::this_thread::sleep_for(milliseconds(280));  // past 50, 100, 150, 200 and 250 ms
  w.step_finished();
  const int warned = w.warnings();
  EXPECT_GE(warned, 2);
  EXPECT_LE(warned, 6);
  EXPECT_EQ(asked.load(), warned);
  std::this_thread::sleep_for(milliseconds(150));
  EXPECT_EQ(w.warnings(), warned);
}

TEST(StepWatchdog, QuietForStepsWithinTheTimeout) {
  StepWatchdog w(0.3, [] { return std::string(); });
  for (int i = 0; i < 20; ++i) {  // 400 ms of steps, none longer than 20 ms
    w.step_started();
    std::this_thread::sleep_for(milliseconds(20));
    w.step_finished();
  }
  EXPECT_EQ(w.warnings(), 0);
}

TEST(StepWatchdog, OffAtZero) {
  StepWatchdog w(0.0, [] { return std::string(); });
  w.step_started();
  std::this_thread::sleep_for(milliseconds(50));
  w.step_finished();
  EXPECT_EQ(w.warnings(), 0);
}

TEST(StepWatchdog, TimeoutFromTheEnvironment) {
  unsetenv("SPECULA_ENGINE_ITERATION_TIMEOUT_S");
  EXPECT_EQ(StepWatchdog::timeout_from_env(), 60.0);
  setenv("SPECULA_ENGINE_ITERATION_TIMEOUT_S", "2.5", 1);
  EXPECT_EQ(StepWatchdog::timeout_from_env(), 2.5);
  setenv("SPECULA_ENGINE_ITERATION_TIMEOUT_S", "soon", 1);
  EXPECT_THROW(StepWatchdog::timeout_from_env(), Error);
  unsetenv("SPECULA_ENGINE_ITERATION_TIMEOUT_S");
}

}  // namespace
}  // namespace specula
