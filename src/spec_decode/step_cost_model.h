// How long a step takes, as the adaptive depth needs it: a target forward over B decoding
// requests with r query rows each (r = 1 + drafts verified), and the proposer's work for d drafts
// per request over B requests.
//
// OnlineCostModel MEASURES it: an exponential moving average of the wall time of each, keyed by
// (batch bucket, rows) for the target and by (batch bucket, depth) for the proposer (buckets are
// powers of two of B). Drafting d tokens is not d times drafting one: the proposer's catch-up,
// staging and the copy of the drafts to the host are paid once per step (on the H100,
// specula-tiny-draft: ~115 us for 1 draft, ~75 us per further draft), so a per-draft average
// learned at one depth would make every other depth look worse or better than it is, and the choice
// would stick wherever it started. Before a key has been measured it is estimated from the nearest
// measured key, scaled by a prior shape: t(B, r) proportional to 1 + B r / 256 (flat while the GPU
// is weight-bandwidth bound, growing once B r rows make it compute bound), drafting d proportional
// to d + f (f: the proposer's per-step fixed cost in further drafts, draft_fixed_cost(); 0.5 by
// default), and one draft at `draft_ratio` times a target decode step. With nothing measured at all
// the prior itself is used (its unit is arbitrary, the same for target and draft, which is all the
// choice of depth compares).
//
// Beside the parts, a step's PERIOD at each depth: the wall time from one step to the next while
// the engine runs the same depth step after step. Async scheduling hides a plain step's host work
// behind the device, and a speculative step's draft and host work overlap in ways the parts do
// not say, so where a depth's period was measured it is what that depth costs (AdaptiveDepth).
// It is the lower median of the last kPeriodSamples: a period spans everything the engine did,
// so it catches the rare long one (the thread descheduled, a log write): as an EMA (MTP, one
// request, H200, traced) depth 5's stood at 440-630 us where its steps took ~380, while a depth
// run rarely kept the minimum of its first samples, and the choice drifted to the depths measured
// least.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace specula {

class StepCostModel {
 public:
  virtual ~StepCostModel() = default;
  // Seconds of one target forward (with verification) over num_seqs requests of `rows` rows each.
  virtual double target_seconds(int num_seqs, int rows) const = 0;
  // Seconds of the proposer's work for `depth` drafts per request over num_seqs requests (its
  // catch-up, draft forwards and sampling); 0 for depth 0.
  virtual double draft_seconds(int num_seqs, int depth) const = 0;
  // Seconds of the engine's host work per step outside the two above (scheduling, staging the
  // inputs, output processing), paid once a step whatever the depth: it is why fewer, longer
  // steps pay more than target and draft times alone say.
  virtual double host_seconds(int num_seqs) const { return 0.0; }
  virtual void record_target(int num_seqs, int rows, double seconds) {}
  virtual void record_draft(int num_seqs, int depth, double seconds) {}
  virtual void record_host(int num_seqs, double seconds) {}
  // The measured period of a step at `depth` over num_seqs requests (a batch of its bucket), if
  // any; and one more measurement of it.
  virtual std::optional<double> period_seconds(int num_seqs, int depth) const { return std::nullopt; }
  virtual void record_period(int num_seqs, int depth, double seconds) {}
};

class OnlineCostModel : public StepCostModel {
 public:
  // max_rows: the most rows per request a target forward verifies (1 + k).
  OnlineCostModel(int max_rows, double draft_ratio, double ema_weight = 0.2, double draft_fixed = 0.5);

  double target_seconds(int num_seqs, int rows) const override;
  double draft_seconds(int num_seqs, int depth) const override;
  double host_seconds(int num_seqs) const override;
  void record_target(int num_seqs, int rows, double seconds) override;
  void record_draft(int num_seqs, int depth, double seconds) override;
  void record_host(int num_seqs, double seconds) override;
  std::optional<double> period_seconds(int num_seqs, int depth) const override;
  void record_period(int num_seqs, int depth, double seconds) override;

  static int bucket_of(int num_seqs);  // 0 for 1, 1 for 2, 2 for 3..4, 3 for 5..8, ...
  static double prior_target(double num_seqs, int rows);
  double prior_draft_shape(int depth) const { return (depth + draft_fixed_) / (1.0 + draft_fixed_); }

 private:
  struct Entry {
    double seconds = 0.0;
    double num_seqs = 0.0;  // the batch sizes it was measured at (EMA), to rescale from
    bool measured = false;
    int samples = 0;
  };
  // The first kSettleSamples samples of an entry: their minimum. After that an EMA in which one
  // sample counts as at most kMaxJump times the estimate. One-off costs (a lazily loaded kernel's
  // first launch, a cold cache, the host thread descheduled) must not stick: a draft cost
  // measured too high turns speculation off, and steps at depth 0 measure no draft step that
  // could correct it.
  static constexpr int kSettleSamples = 3;
  static constexpr double kMaxJump = 3.0;
  void update(Entry& e, int num_seqs, double seconds);
  // The measured (bucket, rows or depth) key of `table` closest to the one asked for, if any.
  static std::optional<std::pair<int, int>> nearest(const std::vector<std::vector<Entry>>& table, int bucket, int col);

  int max_rows_;
  double draft_ratio_;
  double ema_weight_;
  double draft_fixed_;
  std::vector<std::vector<Entry>> target_;  // [bucket][rows]
  std::vector<std::vector<Entry>> draft_;   // [bucket][depth]
  std::vector<std::vector<Entry>> host_;    // [bucket][0]
  struct Period {
    std::vector<double> recent;  // the last kPeriodSamples, a ring from `next`
    size_t next = 0;
    double median = 0.0;
    double num_seqs = 0.0;       // as Entry's
  };
  static constexpr size_t kPeriodSamples = 15;
  std::vector<std::vector<Period>> period_;  // [bucket][depth]
};

}  // namespace specula
