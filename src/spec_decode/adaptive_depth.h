// How many drafts to propose this step (0..k), so that speculation pays for itself.
//
// For batch size B and depth d the expected tokens per request per step are
//     E(d) = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_d
// where a_i is the measured acceptance of draft i given drafts 1..i-1 were accepted (an
// exponential moving average per position, seeded with a prior), and a step costs its measured
// period at depth d where one was measured (step_cost_model.h), else the sum of its parts
//     T(d) = target(B, 1 + d) + draft(B, d) + host(B)
// from the MEASURED cost model, scaled for d > 0 by what the nearest measured speculative depth's
// period was against its parts (the parts overlap in ways the sum does not see). The depth maximises E(d) / T(d), the tokens
// per second of every request (so both throughput and TPOT), and a depth d > 0 is only taken when
// it beats plain decoding (d = 0) by `min_gain`: under heavy load, where verifying d extra rows is
// no longer nearly free, or when acceptance is low, the answer is 0 and the step is a plain decode.
//
// Exploration: a choice only measures what it runs. Every `probe_interval` steps one step runs a
// depth that was not chosen lately (when speculation is on, by turns 0 and k: a plain step's cost
// and the acceptance of the positions past the chosen depth; when it is off, the depth that
// would pay best were every draft accepted) so acceptance and costs stay fresh, but only where
// the probe could pay (none when even certain acceptance could not beat plain decoding at this
// batch size). A probe from depth 0 verifies drafts at every position it asks about, and its
// verifications weigh at least `probe_weight`: they are the fresh evidence after a stretch that
// verified nothing.
//
// A probe's few verifications can be lucky. So the stretch of speculation a probe from depth 0
// starts is judged by what it measured, not by the estimate: after `stretch_steps` steps (or when
// it ends sooner), its tokens per request per second of wall time (record_step_seconds) against a
// plain step's measured period (no verdict without one, or with fewer than 4 timed steps). A
// stretch below `keep_gain` of it is a failed probe: depth 0 in that batch bucket until the next
// probe, whose interval grows (probe_backoff), the proposer fed only before it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "spec_decode/step_cost_model.h"

namespace specula {

struct AdaptiveDepthConfig {
  int num_speculative_tokens = 1;              // k
  bool adaptive = true;           // false: always k
  double prior_acceptance = 0.7;  // a_i before any draft at position i was verified
  // Weight of one verified draft position: 1 / (n + 2) for the n-th (the prior counts as one
  // observation, so the first probes move the estimate at once), then this EMA floor.
  double acceptance_weight = 0.01;
  // Speculate only for at least 10 % more tokens per second. The model's step times are EMAs of
  // wall times that move by 5-10 % from run to run on the H100, and what it does not model
  // (the draft mirroring new prompts, per-step bookkeeping) all counts against speculation
  // (3 % was too little: docs/PERFORMANCE.md).
  double min_gain = 1.10;
  // Steps between probes (a plain step while speculating, a depth-1 step while not), per batch
  // bucket. A probe from depth 0 that does not turn speculation on multiplies that bucket's
  // interval by probe_backoff up to max_probe_interval: under load a probe costs a verification
  // and the draft's catch-up of every request, which every 32 steps cost 3-7 % of throughput on
  // the H100; and an every-step proposer's probe costs its fed steps too (feed_steps), each about
  // 1.6 plain steps at one request (H200, EAGLE-3 at temperature 1: 284 fed and 46 probe steps
  // of 5,248, 5 % of the run, at 2x to 1024).
  int probe_interval = 32;
  int probe_backoff = 4;
  int max_probe_interval = 4096;
  // Once a probe has failed, the depth-0 steps that feed an every-step proposer before the next
  // probe (feeds_proposer): as many as it needs to draft as well as if fed all along
  // (Proposer::steps_to_recover), at most probe_interval.
  int feed_steps = 32;
  // The least weight of the first verification of a probe from depth 0 at each position; the
  // n-th after it weighs at least 1 / (1 / probe_weight + n), so that a probe's verifications
  // move the estimate to about their mean. At the EMA floor a probe every 32..4096 steps could
  // never move an estimate learned from a bad start: on the H200 the embedded pair's first request
  // left a_1 at 0.65 (0.85 over the run) and adaptive k = 5 at depth 0 for the rest of the run,
  // where pinned k = 5 is 1.5x faster. At 0.25 for every verification, a probe of 4 steps of 4
  // requests kept only its last few: eagle3 at temperature 1, 8 requests (H200) saw a_1 anywhere
  // from 0.14 to 0.79 after its probes, and turned speculation on after some.
  double probe_weight = 0.25;
  // A probe from depth 0 drafts in up to this many steps in a row (fewer once one has turned
  // speculation on): at concurrency 1 a step verifies one request's drafts, and a probe whose
  // first draft happened to be rejected turned speculation off for a doubled interval; on the
  // H200 one of three MTP runs at concurrency 1 stayed at depth 0.01 where pinned k = 3 was 1.16x.
  int probe_steps = 4;
  // A position verified fewer times than this counts as accepting at least as well as the one
  // before it (optimism while uncertain): a depth whose few verifications went badly (probes into
  // a cold cache) is otherwise never chosen again, so never measured again. On the H200 MTP at
  // concurrency 1 ran depth 1 in 1329 of 1470 steps with a_2 at 0.64 after a handful of
  // verifications, where pinned k = 3 accepted 3.35 tokens a step and ran 1.16x faster.
  int explore_observations = 16;
  // The stretch a probe from depth 0 started is judged after this many steps (0: never judged).
  // At the EMA floor a stretch's own verifications take hundreds of steps to undo a lucky probe:
  // on the H200, EAGLE-3 at temperature 1 and one request ran 0.92-0.99x of no speculation at a
  // mean depth of 0.06-0.45, where no depth gains more than 4 %.
  int stretch_steps = 32;
  // A judged stretch must have measured at least this share of a plain step's tokens per second.
  double keep_gain = 1.0;
};

class AdaptiveDepth {
 public:
  AdaptiveDepth(const AdaptiveDepthConfig& config, std::unique_ptr<StepCostModel> cost);

  // One request's verification: num_drafts proposed, the first num_accepted accepted. Drafts
  // from a cache still recovering from steps it was not fed (Proposer::recovering) say what a
  // stale cache gives, not what the proposer gives: they leave the estimate as it is, and count
  // only for the verdict on the running stretch, which judges what speculation delivered.
  void record_verification(int num_drafts, int num_accepted, bool recovering = false);
  // The wall time of the previous decode step over num_seqs requests (from its start to the
  // start of the step after it): what a stretch of speculation is judged by.
  void record_step_seconds(int num_seqs, double seconds);
  // The depth for a step over num_seqs requests (advances the probe clock).
  int choose(int num_seqs);
  // The depth in force without choosing anew (a step with no decoding request, whose prompt
  // chunks the draft mirrors only while speculation is on): the best for num_seqs requests, no
  // probe.
  int current(int num_seqs) const;

  // The depth of a probe from depth 0: the one that would pay best were every draft accepted, or
  // 0 where none would beat plain decoding.
  int probe_depth(int num_seqs) const;
  // Should a proposer whose cache only its every step can build (MTP, EAGLE) see this depth-0
  // step? A probe measures nothing with a stale cache (on the H100 the embedded EAGLE-3 head and
  // specula-tiny-moe's MTP layer accepted 0 of 25 and 0 of 40 probe drafts after unfed
  // stretches), so: where a probe could pay, while no probe has failed since speculation was last
  // on (a probe with a warm cache that fails is the verdict: acceptance is low, stop paying for the
  // cache), and, after that, for the last `feed_steps` steps before each probe.
  bool feeds_proposer(int num_seqs) const;

  // E(depth) with the acceptance the choice uses: a_i, or for a position verified fewer than
  // explore_observations times, at least the a used for the position before it.
  double expected_tokens(int depth) const;
  // Expected tokens per second of one request at this depth (the objective).
  double tokens_per_second(int num_seqs, int depth) const;
  // T(depth) as the choice prices it (the header): a measured period, else the parts.
  double step_seconds(int num_seqs, int depth) const;
  // a_1..a_k (conditional acceptance per position).
  std::vector<double> acceptance() const;
  const AdaptiveDepthConfig& config() const { return config_; }
  // The last choice was 0 only to re-measure a plain step while speculation pays: proposers that
  // must see every step (MTP) should still be given it.
  bool plain_probe() const { return plain_probe_; }
  // The last choice was > 0 only to probe whether speculation pays again (from depth 0).
  bool draft_probe() const { return probe_bucket_ >= 0; }
  // The last choice was k only to re-measure the positions past the depth speculation runs at.
  bool deep_probe() const { return deep_probe_from_ >= 0; }
  StepCostModel& cost() { return *cost_; }

 private:
  int best_depth(int num_seqs) const;
  // best_depth, or 0 where a stretch lost since the bucket's last probe.
  int allowed_depth(int num_seqs) const;
  int backed_off(int every) const;  // a failed probe's next interval
  // The verdict on the running stretch: did it measure keep_gain of a plain step's rate?
  bool stretch_paid() const;
  void judge_stretch(size_t bucket);

  AdaptiveDepthConfig config_;
  std::unique_ptr<StepCostModel> cost_;
  std::vector<double> accept_;     // conditional acceptance per position
  std::vector<int64_t> observed_;  // verified drafts per position
  std::vector<int> probe_every_;      // per batch bucket (OnlineCostModel::bucket_of)
  std::vector<int> since_probe_;      // steps since that bucket's last probe
  int probe_bucket_ = -1;             // the previous step probed from depth 0 in this bucket
  int probe_num_seqs_ = 0;
  int probe_steps_left_ = 0;          // of that probe, after the previous step
  std::vector<int> probe_observed_;   // verifications of the running probe, per position
  // A probe at depth k while speculating at a shallower depth (by turns with plain probes): the
  // next verifications at positions from this index on weigh as a probe's. Without it a position
  // that went badly for a while (the first request's text: specula-tiny-moe's third MTP draft was
  // rejected 18 times in a row in one request, accepted at 0.67 over the others) was never drafted
  // again once the choice fell below it, so never measured again.
  int deep_probe_from_ = -1;
  std::vector<int> probes_while_on_;  // per batch bucket: which kind of probe is next
  // The stretch of speculation the last successful probe from depth 0 started, until judged.
  struct Stretch {
    int bucket = -1;  // -1: none running
    int num_seqs = 0;
    int every_before = 0;  // its bucket's probe interval before the probe
    int steps = 0, plain_steps = 0;  // chosen in it, and of them at depth 0
    int verifications = 0;
    double tokens = 0.0;  // 1 + accepted, summed over its verifications
    int timed_steps = 0;
    double seconds = 0.0;  // their wall time
  };
  Stretch stretch_;
  std::vector<char> vetoed_;  // per batch bucket
  bool plain_probe_ = false;
};

}  // namespace specula
