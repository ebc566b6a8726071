#include "engine/async_scheduling_default.h"

namespace specula {

AsyncSchedulingChoice choose_async_scheduling(std::optional<bool> requested, const AsyncSchedulingFacts& facts) {
  if (requested) return {*requested, *requested ? "on (--async-scheduling)" : "off (--no-async-scheduling)"};
  // The first constraint that fails names the default; --async-scheduling overrides each.
  if (!facts.on_cuda) return {false, "off (default on the CPU: no device to overlap with; --async-scheduling turns it on)"};
  if (facts.speculative && !facts.drafts_on_device)
    return {false, "off (default with a proposer whose drafts are made on the host: its steps run whole, not "
                   "measured faster; --async-scheduling turns it on)"};
  if (facts.tensor_parallel_size > 1)
    return {false, "off (default with tensor parallelism: not measured faster; --async-scheduling turns it on)"};
  if (facts.enforce_eager)
    return {false, "off (default with --enforce-eager: not measured faster; --async-scheduling turns it on)"};
  if (facts.speculative)
    return {true, "on (default on one GPU with drafts chained on the device: the host plans step N+1 while the GPU "
                  "drafts for it, measured faster; --no-async-scheduling turns it off)"};
  return {true, "on (default on one GPU without speculation: the host plans step N+1 while the GPU runs step N, "
                "measured faster; --no-async-scheduling turns it off)"};
}

}  // namespace specula
