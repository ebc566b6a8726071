// Whether the engine keeps a step in flight (--async-scheduling) when the user did not say: on
// only where measurements showed it faster (docs/PERFORMANCE.md "Async scheduling"): one GPU,
// CUDA graphs, no speculation. A speculative step still runs whole under async scheduling (its
// proposer reads the accepted tokens on the host): measured, no clear gain; tensor parallelism and
// eager mode were not measured with it; on the CPU the host and the "device" share the same
// cores. The reason is what the startup log prints.
#pragma once

#include <optional>
#include <string>

namespace specula {

struct AsyncSchedulingFacts {
  bool on_cuda = false;
  bool speculative = false;
  int tensor_parallel_size = 1;
  bool enforce_eager = false;
};

struct AsyncSchedulingChoice {
  bool on = false;
  std::string reason;  // "on (--async-scheduling)", "off (default: speculation ...)", ...
};

AsyncSchedulingChoice choose_async_scheduling(std::optional<bool> requested, const AsyncSchedulingFacts& facts);

}  // namespace specula
