// The periodic stats line a vLLM user knows, every `interval` seconds while the engine is busy:
//   Engine 000: Avg prompt throughput: 12.3 tokens/s, Avg generation throughput: 45.6 tokens/s,
//   Running: 3 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.2%, Prefix cache hit rate: 50.0%
// Throughputs cover the interval since the previous line; the prefix cache hit rate is cumulative.
// With speculative decoding on, vLLM's "SpecDecoding metrics: ..." line for the same interval
// follows (spec/spec_decoding_log.h).
#pragma once

#include <optional>
#include <string>

#include "engine/llm_engine.h"
#include "engine/spec_decoding_log.h"

namespace specula {

class StatsLogger {
 public:
  StatsLogger(std::string kv_cache_label, double interval_s = 10.0)
      : kv_label_(std::move(kv_cache_label)), interval_(interval_s) {}

  // Call when the loop wakes up from an idle wait: an interval starts with the first work.
  void on_wake(double now, const EngineMetrics& m);
  // Call after every engine iteration (and when an idle wait times out). Logs when a line is due.
  void maybe_log(double now, const EngineMetrics& m);
  // When the loop should wake up to print a pending line although it is idle (nullopt: nothing
  // pending).
  std::optional<double> pending_deadline() const;

  std::string format(double elapsed_s, const EngineMetrics& m) const;

 private:
  std::string kv_label_;
  double interval_;
  bool started_ = false;
  bool active_ = false;  // something happened since the last line
  double last_time_ = 0.0;
  int64_t last_prompt_ = 0, last_generation_ = 0;
  SpecDecodingLog spec_;
};

}  // namespace specula
