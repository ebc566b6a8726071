// /metrics: the engine's counters and gauges plus the latencies the server measures itself (TTFT,
// inter-token latency, end-to-end), in Prometheus text exposition format with vLLM's metric names
// (vllm:...) and a model_name label, so that vLLM dashboards work unchanged.
//
// Observations come from every streaming thread at once, so histograms are lock-free (atomic
// buckets): recording a token never serialises the streams on one mutex.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/api.h"
#include "engine/llm_engine.h"

namespace specula::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  // Appends the _bucket/_sum/_count lines (cumulative buckets and +Inf, as Prometheus expects).
  void render(std::string* out, const std::string& name, const std::string& labels) const;
  // The same lines for counts kept elsewhere (the engine's): counts[i] observations at or below
  // bounds[i] and above bounds[i - 1], the last entry above every bound.
  static void render_counts(std::string* out, const std::string& name, const std::string& labels,
                            std::span<const double> bounds, std::span<const int64_t> counts, double sum);
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // non-cumulative; the last is +Inf
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0.0};
};

// What the server measures per request.
class ServerMetrics {
 public:
  explicit ServerMetrics(int max_model_len);

  void observe_ttft(double seconds) { ttft_.observe(seconds); }
  void observe_inter_token(double seconds) { itl_.observe(seconds); }
  // A request (one prompt with its n choices) finished.
  void observe_request_done(double e2e_seconds, int prompt_tokens, int generation_tokens) {
    e2e_.observe(e2e_seconds);
    prompt_tokens_.observe(prompt_tokens);
    generation_tokens_.observe(generation_tokens);
  }
  // vLLM's request phase histograms from the engine's times: queue (arrival -> scheduled),
  // prefill (-> first token), decode (first -> last token), inference (scheduled -> last token).
  void observe_request_phases(const RequestTimes& t);
  // One sequence (choice) finished, counted by reason as vllm:request_success_total.
  void count_finished(FinishReason reason);

  std::string render(const EngineMetrics& engine, const std::string& model_name) const;

 private:
  Histogram ttft_, itl_, e2e_, prompt_tokens_, generation_tokens_;
  Histogram queue_, prefill_, decode_, inference_;
  std::array<std::atomic<int64_t>, 3> finished_{};  // stop, length, abort
};

// vLLM's bucket layout for token-count histograms: 1, 2, 5, 10, 20, 50, ... up to `max`.
std::vector<double> buckets_1_2_5(int max);

}  // namespace specula::server
