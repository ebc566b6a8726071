#include "spec_decode/step_cost_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <optional>
#include <utility>

namespace specula {

namespace {
constexpr int kNumBuckets = 16;  // batches up to 2^15 requests
}  // namespace

OnlineCostModel::OnlineCostModel(int max_rows, double draft_ratio, double ema_weight, double draft_fixed)
    : max_rows_(std::max(1, max_rows)), draft_ratio_(draft_ratio), ema_weight_(ema_weight), draft_fixed_(draft_fixed),
      target_(kNumBuckets, std::vector<Entry>(static_cast<size_t>(max_rows_) + 1)),
      draft_(kNumBuckets, std::vector<Entry>(static_cast<size_t>(max_rows_))),
      host_(kNumBuckets, std::vector<Entry>(2)),
      period_(kNumBuckets, std::vector<Period>(static_cast<size_t>(max_rows_))) {}

int OnlineCostModel::bucket_of(int num_seqs) {
  int b = 0;
  while (b + 1 < kNumBuckets && (1 << b) < num_seqs) ++b;
  return b;
}

double OnlineCostModel::prior_target(double num_seqs, int rows) { return 1.0 + num_seqs * rows / 256.0; }

void OnlineCostModel::update(Entry& e, int num_seqs, double seconds) {
  if (e.samples < kSettleSamples) {
    if (!e.measured || seconds < e.seconds) {
      e.seconds = seconds;
      e.num_seqs = num_seqs;
    }
    e.measured = true;
    ++e.samples;
    return;
  }
  seconds = std::min(seconds, kMaxJump * e.seconds);
  e.seconds += ema_weight_ * (seconds - e.seconds);
  e.num_seqs += ema_weight_ * (num_seqs - e.num_seqs);
}

void OnlineCostModel::record_target(int num_seqs, int rows, double seconds) {
  if (num_seqs < 1 || rows < 1 || rows > max_rows_ || !(seconds >= 0.0)) return;
  update(target_[bucket_of(num_seqs)][rows], num_seqs, seconds);
}

void OnlineCostModel::record_draft(int num_seqs, int depth, double seconds) {
  if (num_seqs < 1 || depth < 1 || depth >= max_rows_ || !(seconds >= 0.0)) return;
  update(draft_[bucket_of(num_seqs)][depth], num_seqs, seconds);
}

void OnlineCostModel::record_host(int num_seqs, double seconds) {
  if (num_seqs < 1 || !(seconds >= 0.0)) return;
  update(host_[bucket_of(num_seqs)][1], num_seqs, seconds);
}

void OnlineCostModel::record_period(int num_seqs, int depth, double seconds) {
  // (A period of no time is a clock that did not move, not a step.)
  if (num_seqs < 1 || depth < 0 || depth >= max_rows_ || !(seconds > 0.0)) return;
  Period& p = period_[bucket_of(num_seqs)][depth];
  if (p.recent.size() < kPeriodSamples) {
    p.recent.push_back(seconds);
    p.num_seqs = p.recent.size() == 1 ? num_seqs : p.num_seqs + ema_weight_ * (num_seqs - p.num_seqs);
  } else {
    p.recent[p.next] = seconds;
    p.next = (p.next + 1) % kPeriodSamples;
    p.num_seqs += ema_weight_ * (num_seqs - p.num_seqs);
  }
  // A copy on the stack: this runs every step.
  std::array<double, kPeriodSamples> sorted{};
  // (the lower median: the rare sample off the steady period is a long one)
  const size_t n = p.recent.size(), mid = (n - 1) / 2;
  std::copy(p.recent.begin(), p.recent.end(), sorted.begin());
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(mid),
                   sorted.begin() + static_cast<std::ptrdiff_t>(n));
  p.median = sorted[mid];
}

std::optional<double> OnlineCostModel::period_seconds(int num_seqs, int depth) const {
  // Its own bucket only, rescaled to num_seqs as target steps are: a period measured at another
  // batch size says little about this one's overlap of host and device.
  num_seqs = std::max(1, num_seqs);
  if (depth < 0 || depth >= max_rows_) return std::nullopt;
  const Period& p = period_[bucket_of(num_seqs)][depth];
  if (p.recent.empty()) return std::nullopt;
  return p.median * prior_target(num_seqs, 1 + depth) / prior_target(p.num_seqs, 1 + depth);
}

double OnlineCostModel::host_seconds(int num_seqs) const {
  // The nearest measured bucket as measured (host work grows with the batch far less than in
  // proportion: it is mostly per step); 0 before any measurement.
  const std::optional<std::pair<int, int>> near = nearest(host_, bucket_of(std::max(1, num_seqs)), 1);
  return near ? host_[near->first][1].seconds : 0.0;
}

std::optional<std::pair<int, int>> OnlineCostModel::nearest(const std::vector<std::vector<Entry>>& table, int bucket,
                                                            int col) {
  // The key itself when measured (the common case, and what every step asks a few times);
  // otherwise the same bucket first (rows and depths are cheap to extrapolate with the prior),
  // then neighbouring buckets.
  if (bucket < static_cast<int>(table.size()) && col < static_cast<int>(table[bucket].size()) && table[bucket][col].measured)
    return std::make_pair(bucket, col);
  std::optional<std::pair<int, int>> best;
  int best_d = 1 << 30;
  for (int b = 0; b < static_cast<int>(table.size()); ++b) {
    for (int r = 1; r < static_cast<int>(table[b].size()); ++r) {
      if (!table[b][r].measured) continue;
      const int d = 4 * std::abs(b - bucket) + std::abs(r - col);
      if (d < best_d) {
        best_d = d;
        best = std::make_pair(b, r);
      }
    }
  }
  return best;
}

double OnlineCostModel::target_seconds(int num_seqs, int rows) const {
  num_seqs = std::max(1, num_seqs);
  rows = std::clamp(rows, 1, max_rows_);
  const std::optional<std::pair<int, int>> near = nearest(target_, bucket_of(num_seqs), rows);
  if (!near) return prior_target(num_seqs, rows);
  const Entry& e = target_[near->first][near->second];
  return e.seconds * prior_target(num_seqs, rows) / prior_target(e.num_seqs, near->second);
}

double OnlineCostModel::draft_seconds(int num_seqs, int depth) const {
  if (depth <= 0) return 0.0;
  num_seqs = std::max(1, num_seqs);
  const std::optional<std::pair<int, int>> near = nearest(draft_, bucket_of(num_seqs), depth);
  if (!near) return draft_ratio_ * target_seconds(num_seqs, 1) * prior_draft_shape(depth);
  const Entry& e = draft_[near->first][near->second];
  return e.seconds * prior_target(num_seqs, 1) / prior_target(e.num_seqs, 1) * prior_draft_shape(depth) /
         prior_draft_shape(near->second);
}

}  // namespace specula
