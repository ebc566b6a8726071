// Whether the engine keeps a step in flight (--async-scheduling) when the user did not say: on
// only where measurements showed it faster (docs/PERFORMANCE.md "Async scheduling"): one GPU,
// CUDA graphs, and either no speculation or a proposer whose drafts stay on the device between
// steps (draft_model, eagle/eagle3, mtp: the host plans the next step while they are made). A
// proposer whose drafts are made on the host (ngram) runs each step whole: not measured faster;
// tensor parallelism and eager mode were not measured with it; on the CPU the host and the
// "device" share the same cores. The reason is what the startup log prints.
#pragma once

#include <optional>
#include <string>

namespace specula {

struct AsyncSchedulingFacts {
  bool on_cuda = false;
  bool speculative = false;
  bool drafts_on_device = false;  // the speculator's drafts can stay on the device between steps
  int tensor_parallel_size = 1;
  bool enforce_eager = false;
};

struct AsyncSchedulingChoice {
  bool on = false;
  std::string reason;  // "on (--async-scheduling)", "off (default: speculation ...)", ...
};

AsyncSchedulingChoice choose_async_scheduling(std::optional<bool> requested, const AsyncSchedulingFacts& facts);

}  // namespace specula
