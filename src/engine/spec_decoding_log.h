// The periodic speculative-decoding log line, in vLLM's shape (vllm/v1/spec_decode/metrics.py),
// logged right after the engine's stats line for the same interval:
//   SpecDecoding metrics: Mean acceptance length: 2.45, Accepted throughput: 12.30 tokens/s,
//   Drafted throughput: 20.10 tokens/s, Accepted: 123 tokens, Drafted: 201 tokens, Per-position
//   acceptance rate: 0.800, 0.550, 0.400, Avg Draft acceptance rate: 61.2%, Mean speculative
//   depth: 2.31 (adaptive, k=3)
// The mean acceptance length counts the bonus token (1 + accepted / drafts); per-position rates
// are accepted-at-position / drafts, k of them. The last field is specula's: the mean depth the
// adaptive depth chose per step over the interval.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/llm_engine.h"

namespace specula {

class SpecDecodingLog {
 public:
  // Starts an interval at these cumulative counters.
  void begin(const EngineMetrics& m);
  // The line for the interval since begin() (which it then restarts); nullopt when speculation is
  // off or no step ran in the interval.
  std::optional<std::string> interval_line(double elapsed_s, const EngineMetrics& m);

 private:
  int64_t drafts_ = 0, draft_tokens_ = 0, accepted_ = 0, depth_steps_ = 0, depth_sum_ = 0;
  std::vector<int64_t> per_pos_;
};

}  // namespace specula
