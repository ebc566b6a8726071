#include "core/phase_profile.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace specula::phase_profile {
namespace {

struct Phase {
  std::string name;
  double seconds = 0.0;
  long long calls = 0;
  double max_seconds = 0.0;
};

struct Table {
  std::mutex mu;
  std::vector<Phase> phases;  // first-run order; a handful of entries, so a linear search
  ~Table() {
    if (phases.empty()) return;
    std::fprintf(stderr, "\n== SPECULA_PROFILE: wall time per phase%s\n%-34s %10s %12s %12s %12s\n",
                 synchronizing() ? "" : " (host only: no synchronisation)", "phase", "calls", "total ms", "mean us",
                 "max us");
    for (const Phase& p : phases)
      std::fprintf(stderr, "%-34s %10lld %12.2f %12.2f %12.2f\n", p.name.c_str(), p.calls, p.seconds * 1e3,
                   p.calls ? p.seconds * 1e6 / static_cast<double>(p.calls) : 0.0, p.max_seconds * 1e6);
  }
};

Table& table() {
  static Table t;
  return t;
}

}  // namespace

bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("SPECULA_PROFILE");
    return v && *v && std::string(v) != "0";
  }();
  return on;
}

bool synchronizing() {
  static const bool on = [] {
    const char* v = std::getenv("SPECULA_PROFILE");
    return enabled() && std::string(v) != "host";
  }();
  return on;
}

void add(const char* name, double seconds) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  for (Phase& p : t.phases) {
    if (p.name == name) {
      p.seconds += seconds;
      ++p.calls;
      p.max_seconds = std::max(p.max_seconds, seconds);
      return;
    }
  }
  t.phases.push_back(Phase{name, seconds, 1, seconds});
}

}  // namespace specula::phase_profile
