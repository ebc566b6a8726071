// Speculative-decoding acceptance of a `specula bench serve` run, from the server's Prometheus
// /metrics (vLLM's counter names) scraped before and after the run: the deltas cover exactly the
// benchmark's requests when nothing else runs on the server meanwhile.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace specula::cli {

struct SpecCounters {
  bool present = false;  // the server exposes vllm:spec_decode_num_drafts
  double drafts = 0;
  double draft_tokens = 0;
  double accepted_tokens = 0;
  std::vector<double> accepted_per_pos;  // by position label
};

// Sums each counter over its label sets (engines, models); per-position counters by "position".
SpecCounters parse_spec_counters(const std::string& prometheus_text);

// vLLM's figures over after - before: acceptance rate (accepted / drafted), mean acceptance length
// (1 + accepted / drafts) and per-position acceptance (accepted at position i / drafts). Null when
// the server does not speculate (no counters, or no drafts during the run).
nlohmann::json spec_delta(const SpecCounters& before, const SpecCounters& after);

}  // namespace specula::cli
