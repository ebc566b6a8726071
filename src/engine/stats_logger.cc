#include "engine/stats_logger.h"

#include <fmt/format.h>

#include "core/logging.h"

namespace specula {

std::string StatsLogger::format(double elapsed_s, const EngineMetrics& m) const {
  const double dt = elapsed_s > 0 ? elapsed_s : 1.0;
  const double hit_rate =
      m.prefix_cache_queries > 0 ? 100.0 * static_cast<double>(m.prefix_cache_hits) / m.prefix_cache_queries : 0.0;
  return fmt::format(
      "Engine 000: Avg prompt throughput: {:.1f} tokens/s, Avg generation throughput: {:.1f} tokens/s, "
      "Running: {} reqs, Waiting: {} reqs, {} KV cache usage: {:.1f}%, Prefix cache hit rate: {:.1f}%",
      static_cast<double>(m.prompt_tokens_total - last_prompt_) / dt,
      static_cast<double>(m.generation_tokens_total - last_generation_) / dt, m.num_requests_running,
      m.num_requests_waiting, kv_label_, 100.0 * m.kv_cache_usage, hit_rate);
}

void StatsLogger::on_wake(double now, const EngineMetrics& m) {
  if (active_ && started_) return;  // mid-interval: keep counting
  started_ = true;
  last_time_ = now;
  last_prompt_ = m.prompt_tokens_total;
  last_generation_ = m.generation_tokens_total;
  spec_.begin(m);
}

void StatsLogger::maybe_log(double now, const EngineMetrics& m) {
  if (!started_) {
    started_ = true;
    last_time_ = now;
    last_prompt_ = m.prompt_tokens_total;
    last_generation_ = m.generation_tokens_total;
    spec_.begin(m);
  }
  if (m.num_requests_running + m.num_requests_waiting > 0 || m.prompt_tokens_total != last_prompt_ ||
      m.generation_tokens_total != last_generation_)
    active_ = true;
  if (now - last_time_ < interval_) return;
  if (active_) {
    LOG_INFO("{}", format(now - last_time_, m));
    if (std::optional<std::string> spec = spec_.interval_line(now - last_time_, m)) LOG_INFO("{}", *spec);
  }
  spec_.begin(m);
  // The interval is over either way: an idle engine logs nothing until work arrives.
  active_ = m.num_requests_running + m.num_requests_waiting > 0;
  last_time_ = now;
  last_prompt_ = m.prompt_tokens_total;
  last_generation_ = m.generation_tokens_total;
}

std::optional<double> StatsLogger::pending_deadline() const {
  if (!active_) return std::nullopt;
  return last_time_ + interval_;
}

}  // namespace specula
