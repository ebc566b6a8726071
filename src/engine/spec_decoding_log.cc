#include "engine/spec_decoding_log.h"

#include <fmt/format.h>

#include <algorithm>

namespace specula {

void SpecDecodingLog::begin(const EngineMetrics& m) {
  drafts_ = m.spec_num_drafts;
  draft_tokens_ = m.spec_num_draft_tokens;
  accepted_ = m.spec_num_accepted_tokens;
  depth_steps_ = m.spec_depth_steps;
  depth_sum_ = m.spec_depth_sum;
  per_pos_ = m.spec_accepted_per_pos;
}

std::optional<std::string> SpecDecodingLog::interval_line(double elapsed_s, const EngineMetrics& m) {
  const int64_t drafts = m.spec_num_drafts - drafts_;
  const int64_t draft_tokens = m.spec_num_draft_tokens - draft_tokens_;
  const int64_t accepted = m.spec_num_accepted_tokens - accepted_;
  const int64_t steps = m.spec_depth_steps - depth_steps_;
  const double mean_depth = steps > 0 ? static_cast<double>(m.spec_depth_sum - depth_sum_) / steps : 0.0;
  std::vector<int64_t> per_pos(static_cast<size_t>(std::max<int64_t>(0, m.spec_num_speculative_tokens)), 0);
  for (size_t i = 0; i < per_pos.size() && i < m.spec_accepted_per_pos.size(); ++i)
    per_pos[i] = m.spec_accepted_per_pos[i] - (i < per_pos_.size() ? per_pos_[i] : 0);
  begin(m);
  if (m.spec_num_speculative_tokens <= 0 || (steps == 0 && drafts == 0)) return std::nullopt;

  const std::string depth =
      fmt::format("Mean speculative depth: {:.2f} ({}k={})", mean_depth, m.spec_adaptive ? "adaptive, " : "",
                  m.spec_num_speculative_tokens);
  if (drafts == 0) return fmt::format("SpecDecoding metrics: no drafts in this interval, {}", depth);
  const double dt = elapsed_s > 0 ? elapsed_s : 1.0;
  std::string rates;
  for (size_t i = 0; i < per_pos.size(); ++i)
    rates += fmt::format("{}{:.3f}", i ? ", " : "", static_cast<double>(per_pos[i]) / drafts);
  return fmt::format(
      "SpecDecoding metrics: Mean acceptance length: {:.2f}, Accepted throughput: {:.2f} tokens/s, Drafted "
      "throughput: {:.2f} tokens/s, Accepted: {} tokens, Drafted: {} tokens, Per-position acceptance rate: {}, Avg "
      "Draft acceptance rate: {:.1f}%, {}",
      1.0 + static_cast<double>(accepted) / drafts, accepted / dt, draft_tokens / dt, accepted, draft_tokens, rates,
      draft_tokens > 0 ? 100.0 * accepted / draft_tokens : 0.0, depth);
}

}  // namespace specula
