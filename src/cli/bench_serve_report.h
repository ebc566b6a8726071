// The figures of a `specula bench serve` run, computed and printed as vLLM's `vllm bench serve`
// does (its "Serving Benchmark Result" block and its --save-result keys): throughput over the
// benchmark's duration, goodput under --goodput SLOs, and mean / median / std / percentiles of
// TTFT, TPOT, ITL and E2EL in milliseconds for the --percentile-metrics.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench_serve_request.h"

namespace specula::cli {

struct ReportSettings {
  std::vector<std::string> percentile_metrics = {"ttft", "tpot", "itl"};  // of ttft, tpot, itl, e2el
  std::vector<double> percentiles = {99};
  std::map<std::string, double> goodput_slo_ms;  // ttft / tpot / e2el -> SLO in ms; empty: no goodput
  int max_concurrency = 0;  // 0: none
  double request_rate = 0;  // <= 0 or inf: all at once
};

// "ttft:500 tpot:50" (or as separate items) -> {"ttft": 500, "tpot": 50}; throws specula::Error
// on an unknown metric or a value that is not a non-negative number.
std::map<std::string, double> parse_goodput(const std::vector<std::string>& items);

// The result JSON (vLLM's keys: duration, completed, failed, total_input_tokens, ...,
// mean_ttft_ms, median_ttft_ms, std_ttft_ms, p99_ttft_ms, ..., and the per-request arrays
// input_lens, output_lens, ttfts, itls (seconds), generated_texts, errors). spec is the
// acceptance from /metrics (null without speculation).
nlohmann::json compute_report(const std::vector<RequestOutcome>& outcomes, double duration_s,
                              const ReportSettings& settings, const nlohmann::json& spec);

// The block on stdout, vLLM's layout.
void print_report(const nlohmann::json& result, const ReportSettings& settings);

}  // namespace specula::cli
