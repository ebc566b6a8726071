// Opt-in wall-clock profile of a step's phases, for finding where host time goes on the GPU
// (SPECULA_PROFILE=1; off by default, when a Scope costs one branch). Each named phase sums its
// wall time, its calls and its longest call; the table goes to stderr when the process exits,
// phases in the order they first ran. Callers that want a phase to include its device work
// synchronize inside it when synchronizing() (the profile then measures a synchronous engine: use
// it to compare phases, not as a benchmark); SPECULA_PROFILE=host times the host alone, without
// those synchronisations (where the host waits under async scheduling).
#pragma once

#include <chrono>

namespace specula::phase_profile {

bool enabled();
bool synchronizing();  // enabled(), and SPECULA_PROFILE is not "host"
void add(const char* name, double seconds);

class Scope {
 public:
  explicit Scope(const char* name) : name_(enabled() ? name : nullptr) {
    if (name_) start_ = std::chrono::steady_clock::now();
  }
  ~Scope() {
    if (name_) add(name_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  const char* name_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace specula::phase_profile
