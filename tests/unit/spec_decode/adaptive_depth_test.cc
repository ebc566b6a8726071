// Adaptive depth: the choice of k per step from measured acceptance and a cost model, and the
// online cost model itself.
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <vector>

#include "spec_decode/adaptive_depth.h"
#include "spec_decode/step_cost_model.h"

namespace specula {
namespace {

// A GPU-like cost: a target forward costs 10 ms flat until B * rows reaches 64 rows, then grows
// linearly (compute bound); a draft step costs 1 ms + 0.01 ms per request.
class FakeCost : public StepCostModel {
 public:
  double target_seconds(int num_seqs, int rows) const override {
    return 0.010 * std::max(1.0, num_seqs * rows / 64.0);
  }
  double draft_seconds(int num_seqs, int depth) const override { return depth * (0.001 + 0.00001 * num_seqs); }
};

AdaptiveDepth make(int k, double acceptance, bool adaptive = true) {
  AdaptiveDepthConfig c;
  c.num_speculative_tokens = k;
  c.adaptive = adaptive;
  c.prior_acceptance = acceptance;
  c.probe_interval = 0;  // no exploration: the choice alone
  return AdaptiveDepth(c, std::make_unique<FakeCost>());
}

TEST(AdaptiveDepth, HighAcceptanceAtBatchOneTakesAllK) {
  AdaptiveDepth d = make(5, 0.9);
  EXPECT_EQ(d.choose(1), 5);
  EXPECT_NEAR(d.expected_tokens(5), 1 + 0.9 + 0.81 + 0.729 + 0.6561 + 0.59049, 1e-9);
}

TEST(AdaptiveDepth, LowAcceptanceOrALargeBatchMeansNoSpeculation) {
  EXPECT_EQ(make(5, 0.05).choose(1), 0);
  // Batch 256: every extra row per request costs a whole forward's worth.
  EXPECT_EQ(make(5, 0.9).choose(256), 0);
  // In between, the depth shrinks as the batch grows.
  AdaptiveDepth d = make(5, 0.8);
  const int at1 = d.choose(1), at16 = d.choose(16), at32 = d.choose(32);
  EXPECT_GE(at1, at16);
  EXPECT_GE(at16, at32);
  EXPECT_GT(at1, 0);
}

TEST(AdaptiveDepth, NeverChoosesADepthSlowerThanPlainDecoding) {
  for (double a : {0.0, 0.2, 0.5, 0.8, 1.0}) {
    for (int b : {1, 4, 16, 64, 256, 1024}) {
      AdaptiveDepth d = make(4, a);
      const int k = d.choose(b);
      EXPECT_GE(d.tokens_per_second(b, k), d.tokens_per_second(b, 0)) << "acceptance " << a << " batch " << b;
    }
  }
}

TEST(AdaptiveDepth, LearnsAcceptanceFromVerifications) {
  AdaptiveDepth d = make(3, 0.9);
  EXPECT_EQ(d.choose(1), 3);
  // Every first draft rejected: acceptance of position 1 collapses and speculation stops.
  for (int i = 0; i < 2000; ++i) d.record_verification(3, 0);
  EXPECT_LT(d.acceptance()[0], 0.05);
  EXPECT_EQ(d.choose(1), 0);
  // Then every draft accepted: back to full depth.
  for (int i = 0; i < 2000; ++i) d.record_verification(3, 3);
  EXPECT_GT(d.acceptance()[2], 0.95);
  EXPECT_EQ(d.choose(1), 3);
  // Position 2 and 3 are conditional on reaching them: first accepted, second rejected.
  AdaptiveDepth e = make(3, 0.5);
  for (int i = 0; i < 3000; ++i) e.record_verification(3, 1);
  EXPECT_GT(e.acceptance()[0], 0.95);
  EXPECT_LT(e.acceptance()[1], 0.05);
  EXPECT_NEAR(e.acceptance()[2], 0.05, 0.05);  // never reached: follows position 2
}

TEST(AdaptiveDepth, PinnedWhenNotAdaptive) {
  AdaptiveDepth d = make(4, 0.01, /*adaptive=*/false);
  EXPECT_EQ(d.choose(1), 4);
  EXPECT_EQ(d.choose(1000), 4);
}

TEST(AdaptiveDepth, ProbesOccasionallyWhereSpeculationCouldPay) {
  AdaptiveDepthConfig c;
  c.num_speculative_tokens = 3;
  c.prior_acceptance = 0.02;
  c.probe_interval = 8;
  c.probe_steps = 1;  // one step a probe (ProbesRunSeveralSteps... tests more)
  AdaptiveDepth d(c, std::make_unique<FakeCost>());
  // Depth 1 at step 8 at batch 1; the probe's drafts are all rejected, so speculation stays off
  // and the next probes come after 32, then 128 steps (backoff): steps 8, 40.
  std::vector<int> probed;
  for (int i = 1; i <= 64; ++i) {
    if (d.choose(1) > 0) {
      probed.push_back(i);
      d.record_verification(1, 0);
    }
  }
  EXPECT_EQ(probed, (std::vector<int>{8, 40}));
  int probes = 0;
  for (int i = 0; i < 64; ++i) probes += d.choose(1024) > 0 ? 1 : 0;
  EXPECT_EQ(probes, 0);  // at batch 1024 not even certain acceptance would pay: no probes
  AdaptiveDepthConfig hi = c;
  hi.prior_acceptance = 0.9;
  AdaptiveDepth e(hi, std::make_unique<FakeCost>());
  int plain = 0;
  for (int i = 0; i < 64; ++i) plain += e.choose(1) == 0 ? 1 : 0;
  EXPECT_EQ(plain, 8);  // a plain step every 8th, to keep its cost measured
}

TEST(AdaptiveDepth, AProbeThatFindsHighAcceptanceTurnsSpeculationOn) {
  // The prior says drafts are rarely accepted; the probe's drafts all are. The first
  // observations weigh 1/(n+2), so one probe is enough to start speculating.
  AdaptiveDepthConfig c;
  c.num_speculative_tokens = 3;
  c.prior_acceptance = 0.05;
  c.probe_interval = 8;
  AdaptiveDepth d(c, std::make_unique<FakeCost>());
  int first_probe = 0;
  for (int i = 1; i <= 8 && first_probe == 0; ++i)
    if (d.choose(1) > 0) first_probe = i;
  ASSERT_EQ(first_probe, 8);
  d.record_verification(1, 1);
  EXPECT_GT(d.acceptance()[0], 0.5);
  EXPECT_GT(d.choose(1), 0);
}

// The embedded pair's costs on the H200 (microseconds; adaptive depth trace at f40e5b7): a plain
// step 162, a verification of 2 rows 163 and of 3..6 rows ~255; the fused draft chain 138 for one
// draft and ~25 for each further one. One draft does not pay (2 tokens in 301 us against 1 in
// 162) where five do at the pair's acceptance (~4.1 tokens in 497 us).
class FusedChainCost : public StepCostModel {
 public:
  double target_seconds(int num_seqs, int rows) const override { return 1e-6 * (rows <= 2 ? 162.0 : 255.0); }
  double draft_seconds(int num_seqs, int depth) const override {
    return depth == 0 ? 0.0 : 1e-6 * (138.0 + 25.0 * (depth - 1));
  }
};

// k drafts at most, speculation off from the start (acceptance prior 0.05) and a probe due every
// 8 steps, of probe_steps steps each.
AdaptiveDepthConfig off_with_probes(int k, int probe_steps) {
  AdaptiveDepthConfig c;
  c.num_speculative_tokens = k;
  c.prior_acceptance = 0.05;
  c.probe_interval = 8;
  c.probe_steps = probe_steps;
  return c;
}

TEST(AdaptiveDepth, ProbesAtTheBestDepthAndRecoversFromABadStart) {
  AdaptiveDepthConfig c;
  c.num_speculative_tokens = 5;
  AdaptiveDepth d(c, std::make_unique<FusedChainCost>());
  ASSERT_EQ(d.probe_depth(1), 5);  // certain acceptance pays best at full depth (one draft would not)
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  // Verify `depth` drafts each accepted with probability `a` (given the ones before were).
  auto verify = [&](int depth, double a) {
    int accepted = 0;
    while (accepted < depth && u(rng) < a) ++accepted;
    d.record_verification(depth, accepted);
  };
  // Drafts accepted at 0.5 turn speculation off: 300 verifications, as from a few steps of many
  // requests (at the EMA floor, where one probe's verification alone would move nothing)...
  for (int i = 0; i < 300; ++i) verify(5, 0.5);
  ASSERT_EQ(d.choose(1), 0);
  // ...and the probes bring it back once the drafts are accepted at 0.85 (true of the embedded
  // pair over a run): almost every later step drafts at depth 3 or more.
  int deep = 0;
  for (int i = 0; i < 2000; ++i) {
    const int depth = d.choose(1);
    if (depth > 0) verify(depth, 0.85);
    if (i >= 1000 && depth >= 3) ++deep;
  }
  EXPECT_GT(deep, 900);
}

// A probe from depth 0 drafts in up to probe_steps steps in a row: at concurrency 1 one rejected
// first draft does not decide, and a probe that fails costs its steps, then four times the interval.
TEST(AdaptiveDepth, ProbesRunSeveralStepsSoThatOneRejectionDoesNotDecide) {
  const AdaptiveDepthConfig c = off_with_probes(5, 4);
  AdaptiveDepth d(c, std::make_unique<FusedChainCost>());
  std::vector<int> probed;
  for (int i = 1; i <= 64; ++i) {
    if (const int depth = d.choose(1); depth > 0) {
      probed.push_back(i);
      d.record_verification(depth, 0);  // nothing accepted: every probe runs its 4 steps and fails
    }
  }
  EXPECT_EQ(probed, (std::vector<int>{8, 9, 10, 11, 43, 44, 45, 46}));
  // A fresh start: the probe's first draft is rejected, the next three accept all five.
  AdaptiveDepth e(c, std::make_unique<FusedChainCost>());
  int i = 1;
  while (e.choose(1) == 0) ++i;
  ASSERT_EQ(i, 8);
  e.record_verification(5, 0);
  int speculating = 0;
  for (int step = 0; step < 3; ++step) {
    const int depth = e.choose(1);
    ASSERT_GT(depth, 0) << "the probe's step " << step + 2;
    e.record_verification(depth, depth);
  }
  for (int step = 0; step < 20; ++step) speculating += e.choose(1) > 0 ? 1 : 0;
  EXPECT_EQ(speculating, 18);  // on: all but the plain probes, every 8th step
}

// A probe's verifications move the estimate to about their mean (the estimate before it counting
// as 1 / probe_weight - 1 of them), not to its last few: at temperature 1 a probe of 16
// verifications at 0.25 each left a_1 anywhere from 0.14 to 0.79.
TEST(AdaptiveDepth, AProbesVerificationsWeighAboutTheirMean) {
  AdaptiveDepthConfig c;
  c.num_speculative_tokens = 3;
  c.probe_interval = 8;
  AdaptiveDepth d(c, std::make_unique<FusedChainCost>());
  for (int i = 0; i < 2000; ++i) d.record_verification(3, 0);
  const double before = d.acceptance()[0];
  ASSERT_LT(before, 0.01);
  int step = 1;
  while (d.choose(1) == 0) ++step;
  ASSERT_EQ(step, 8);
  for (int i = 0; i < 16; ++i) d.record_verification(1, i < 8 ? 1 : 0);  // 8 accepted, then 8 rejected
  EXPECT_NEAR(d.acceptance()[0], (3 * before + 8) / 19.0, 1e-9);
}

// EAGLE-3 head costs at 8 requests on the H200 (microseconds, the debug trace at 1141bed): the
// target verifying 1..6 rows a request, the head drafting d tokens.
class EagleAtEightCost : public StepCostModel {
 public:
  double target_seconds(int, int rows) const override {
    static const double kRows[] = {0, 240, 328, 350, 357, 412, 420};
    return 1e-6 * kRows[rows];
  }
  double draft_seconds(int, int depth) const override { return depth == 0 ? 0.0 : 1e-6 * (47.0 + 95.0 * depth); }
};

// Where no depth pays (temperature 1: each draft accepted with probability 0.55), what adaptive
// depth costs over a run of 1400 steps of 8 requests is its probes (4 steps of 4 requests each,
// at intervals doubling from 32) and the fed steps before them. With every probe verification at
// weight 0.25, 3 of these 10 runs took 26-34 drafting steps (25-31 of them probes) and 221-282
// fed steps (the H200 trace: 39 and 289), false verdicts resetting the interval; weighed about
// their mean, 20-24 drafting steps and 159-189 fed.
TEST(AdaptiveDepth, WhereNothingPaysProbesStayRare) {
  for (int seed = 0; seed < 10; ++seed) {
    AdaptiveDepthConfig c;
    c.num_speculative_tokens = 5;
    AdaptiveDepth d(c, std::make_unique<EagleAtEightCost>());
    std::mt19937 rng(static_cast<unsigned>(seed));
    std::uniform_real_distribution<double> u(0.0, 1.0);
    int drafting_steps = 0, fed = 0;
    for (int step = 0; step < 1400; ++step) {
      const int depth = d.choose(8);
      if (depth == 0) {
        fed += d.feeds_proposer(8) ? 1 : 0;
        continue;
      }
      ++drafting_steps;
      for (int r = 0; r < (d.draft_probe() ? 4 : 8); ++r) {
        int accepted = 0;
        while (accepted < depth && u(rng) < 0.55) ++accepted;
        d.record_verification(depth, accepted);
      }
    }
    EXPECT_LE(drafting_steps, 24) << "seed " << seed;
    EXPECT_LE(fed, 190) << "seed " << seed;
  }
}

// MTP-like costs (microseconds): a plain step 153, a verification of 2 rows 170 and of more 188;
// drafting d tokens 124 + 50 (d - 1). At acceptance 0.95 everywhere depth 3 and more pay best.
class ChainedHeadCost : public StepCostModel {
 public:
  double target_seconds(int num_seqs, int rows) const override {
    return 1e-6 * (rows == 1 ? 153.0 : rows == 2 ? 170.0 : 188.0);
  }
  double draft_seconds(int num_seqs, int depth) const override {
    return depth == 0 ? 0.0 : 1e-6 * (124.0 + 50.0 * (depth - 1));
  }
};

// MTP at one request on the H200 (microseconds): a plain step 136, a verification of 2 rows 150
// and 20 more a row after it; drafting d tokens 60 + 50 (d - 1). One draft pays.
class MtpAtOneCost : public StepCostModel {
 public:
  double target_seconds(int, int rows) const override { return 1e-6 * (rows == 1 ? 136.0 : 150.0 + 20.0 * (rows - 2)); }
  double draft_seconds(int, int depth) const override { return depth == 0 ? 0.0 : 1e-6 * (60.0 + 50.0 * (depth - 1)); }
};

// A probe from depth 0 that fails backs its bucket's probes off; speculation that then comes back
// by its estimate alone (later verifications, new prices) probes every probe_interval steps again,
// as after a probe that turned it on. On the H200 adaptive MTP at one request kept the backed-off
// interval at depth 1: deep probes every ~250 steps, ~750 steps at depth 1 with a_2 estimated at
// 0.33-0.52 after a bad stretch of text, where it accepts 0.85.
TEST(AdaptiveDepth, SpeculationBackOnItsEstimateProbesAtTheBaseInterval) {
  AdaptiveDepthConfig c;
  c.num_speculative_tokens = 5;
  AdaptiveDepth d(c, std::make_unique<MtpAtOneCost>());
  for (int i = 0; i < 20; ++i) d.record_verification(5, 0);
  ASSERT_EQ(d.choose(1), 0);
  int step = 0;
  while (!d.draft_probe() && step++ < 100) d.choose(1);
  ASSERT_TRUE(d.draft_probe());
  for (int i = 0; i < c.probe_steps && d.draft_probe(); ++i) {
    d.record_verification(5, 0);
    d.choose(1);
  }
  ASSERT_FALSE(d.draft_probe());
  // The drafts accept at position 1 again, not at 2: depth 1 pays.
  for (int i = 0; i < 300; ++i) d.record_verification(2, 1);
  int probes = 0, speculating = 0;
  for (step = 0; step < 200; ++step) {
    const int depth = d.choose(1);
    probes += d.plain_probe() || d.deep_probe() ? 1 : 0;
    speculating += depth > 0 ? 1 : 0;
    if (depth > 0) d.record_verification(depth, 1);
  }
  EXPECT_GT(speculating, 180);
  EXPECT_GE(probes, 200 / c.probe_interval - 1);
}

// A few verifications that went badly at deep positions (probes into a cold cache) do not keep the
// choice at depth 1 for good: positions seen fewer than explore_observations times count as good
// as the one before them until they have been measured; where they really are poor, the choice
// comes back once they have (to depth 0 here: one draft alone does not gain the 10 % asked).
TEST(AdaptiveDepth, ADeepPositionsBadStartIsMeasuredAgain) {
  for (const double deep_acceptance : {0.95, 0.2}) {
    AdaptiveDepthConfig c;
    c.num_speculative_tokens = 5;
    c.probe_interval = 0;
    AdaptiveDepth d(c, std::make_unique<ChainedHeadCost>());
    for (int i = 0; i < 3; ++i) d.record_verification(5, 1);  // position 2 rejected three times
    ASSERT_LT(d.acceptance()[1], 0.3);
    std::mt19937 rng(11);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    int deep = 0, shallow = 0;
    for (int step = 0; step < 400; ++step) {
      const int depth = d.choose(1);
      int accepted = 0;
      while (accepted < depth && u(rng) < (accepted == 0 ? 0.95 : deep_acceptance)) ++accepted;
      if (depth > 0) d.record_verification(depth, accepted);
      if (step >= 200) {
        deep += depth >= 3 ? 1 : 0;
        shallow += depth <= 1 ? 1 : 0;
      }
    }
    if (deep_acceptance > 0.9)
      EXPECT_GT(deep, 180) << "deep positions accept 0.95";
    else
      EXPECT_GT(shallow, 180) << "deep positions accept 0.2";
  }
}

// While speculating below k, every other probe runs depth k (the others a plain step), so that a
// position that went badly for a while is measured again: specula-tiny-moe's third MTP draft was
// rejected in 18 steps in a row of one request (its text) and accepted at 0.67 over the others.
TEST(AdaptiveDepth, DeepProbesMeasureAgainWhatWentBadForAWhile) {
  for (const bool probes : {false, true}) {
    AdaptiveDepthConfig c;
    c.num_speculative_tokens = 5;
    c.probe_interval = probes ? 8 : 0;
    AdaptiveDepth d(c, std::make_unique<ChainedHeadCost>());
    for (int i = 0; i < 40; ++i) d.record_verification(5, 2);  // the bad request: position 3 always rejected
    ASSERT_EQ(d.choose(1), 2);
    std::mt19937 rng(5);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    int deep = 0, deep_probes = 0;
    for (int step = 0; step < 600; ++step) {
      const int depth = d.choose(1);
      deep_probes += d.deep_probe() ? 1 : 0;
      int accepted = 0;
      while (accepted < depth && u(rng) < 0.95) ++accepted;
      if (depth > 0) d.record_verification(depth, accepted);
      if (step >= 400 && !d.deep_probe()) deep += depth >= 3 ? 1 : 0;
    }
    if (probes) {
      EXPECT_GT(deep, 170) << "the later requests' third drafts are accepted again";
      EXPECT_GE(deep_probes, 1);
    } else {
      EXPECT_EQ(deep, 0) << "without probes the third position is never drafted again";
    }
  }
}

TEST(AdaptiveDepth, FeedsAnEveryStepProposerWhileMeasuringWhetherSpeculationPays) {
  AdaptiveDepth d(off_with_probes(5, 1), std::make_unique<FusedChainCost>());
  // No probe has failed yet: fed every step, so that the first probe meets a warm cache.
  std::vector<bool> fed;
  for (int i = 1; i <= 8; ++i) {
    const int depth = d.choose(1);
    fed.push_back(d.feeds_proposer(1));
    if (depth > 0) {
      EXPECT_EQ(i, 8);
      EXPECT_EQ(depth, 5);
      d.record_verification(5, 0);  // the probe finds nothing accepted
    }
  }
  EXPECT_EQ(fed, std::vector<bool>(8, true));
  // The failed probe makes the interval 32 (probe_backoff 4) and stops the feeding, except for
  // the 8 steps before the next probe.
  fed.clear();
  for (int i = 1; i <= 32; ++i) {
    const int depth = d.choose(1);
    fed.push_back(d.feeds_proposer(1));
    EXPECT_EQ(depth, i == 32 ? 5 : 0);
  }
  std::vector<bool> expected(32, false);
  for (int i = 23; i < 31; ++i) expected[i] = true;
  expected[31] = false;  // the probe step itself: since_probe is back at 0 (it drafts anyway)
  EXPECT_EQ(fed, expected);
}

// A proposer that recovers in fewer steps than the probe interval is fed only that many before
// each probe once one has failed (MTP: 12 of 32).
TEST(AdaptiveDepth, FeedsOnlyTheStepsTheProposerNeedsToRecover) {
  AdaptiveDepthConfig c = off_with_probes(5, 1);
  c.feed_steps = 3;
  AdaptiveDepth d(c, std::make_unique<FusedChainCost>());
  for (int i = 1; i <= 8; ++i) {
    EXPECT_EQ(d.choose(1), i == 8 ? 5 : 0);
    EXPECT_TRUE(d.feeds_proposer(1)) << "before the first failed probe, every step: step " << i;
    if (i == 8) d.record_verification(5, 0);
  }
  std::vector<bool> fed;
  for (int i = 1; i <= 32; ++i) {
    EXPECT_EQ(d.choose(1), i == 32 ? 5 : 0);
    fed.push_back(d.feeds_proposer(1));
  }
  std::vector<bool> expected(32, false);
  for (int i = 28; i < 31; ++i) expected[i] = true;  // the 3 steps before the probe
  EXPECT_EQ(fed, expected);
}

// A measured period prices its depth over the sum of the parts, and scales the parts of the
// speculative depths not measured. The trace that asked for it (eagle3, temperature 1, 8 requests,
// H200): the parts priced a plain step at its target time plus the host's (188 + 69 us) where
// async scheduling ran it in ~216 us, so depth 2 at 0.64 / 0.72 acceptance looked 1.11x faster
// where pinned k = 1 and k = 3 ran 0.81x.
TEST(AdaptiveDepth, AMeasuredPeriodPricesItsDepth) {
  AdaptiveDepthConfig c;
  c.num_speculative_tokens = 3;
  c.prior_acceptance = 0.6;
  c.probe_interval = 0;
  auto owned = std::make_unique<OnlineCostModel>(4, 0.25);
  OnlineCostModel& cost = *owned;
  AdaptiveDepth d(c, std::move(owned));
  const int n = 8;
  for (int r = 1; r <= 4; ++r) cost.record_target(n, r, 0.000190 + 0.000010 * (r - 1));
  for (int k = 1; k <= 3; ++k) cost.record_draft(n, k, 0.000070 * k + 0.000020);
  cost.record_host(n, 0.000070);
  // By its parts depth 0 costs 260 us and depth 2 440 us, for 1.96 tokens: 1.16x.
  EXPECT_NEAR(d.step_seconds(n, 0), 0.000260, 1e-9);
  EXPECT_GT(d.choose(n), 0);
  // Measured: plain steps 200 us apart, depth-2 steps 430 us apart.
  cost.record_period(n, 0, 0.000200);
  cost.record_period(n, 2, 0.000430);
  EXPECT_NEAR(d.step_seconds(n, 0), 0.000200, 1e-9);
  EXPECT_NEAR(d.step_seconds(n, 2), 0.000430, 1e-9);
  // Depths 1 and 3 were not measured: their parts, scaled by depth 2's period against its parts.
  const double parts2 = 0.000210 + 0.000160 + 0.000070, parts1 = 0.000200 + 0.000090 + 0.000070,
               parts3 = 0.000220 + 0.000230 + 0.000070;
  EXPECT_NEAR(d.step_seconds(n, 1), parts1 * 0.000430 / parts2, 1e-9);
  EXPECT_NEAR(d.step_seconds(n, 3), parts3 * 0.000430 / parts2, 1e-9);
  EXPECT_EQ(d.choose(n), 0);
  // Another batch size's bucket has no period: its parts.
  EXPECT_NEAR(d.step_seconds(1, 0), cost.target_seconds(1, 1) + cost.host_seconds(1), 1e-12);
}

// EAGLE-3 at temperature 1, one request, on the H200 (microseconds): a plain step 170 (180 when it
// feeds the head), a step at depth d 265 / 320 / 370 / 420 / 470 (sampled drafts, step by step). At
// the head's acceptance there (about 0.55 a position) no depth pays: depths 1 and 2 are about even.
class EagleAtOneSampledCost : public StepCostModel {
 public:
  double target_seconds(int, int rows) const override { return 1e-6 * (170.0 + 40.0 * (rows - 1)); }
  double draft_seconds(int, int depth) const override { return 1e-6 * 30.0 * depth; }
  std::optional<double> period_seconds(int, int depth) const override {
    static const double kPeriod[] = {170, 265, 320, 370, 420, 470};
    return 1e-6 * kPeriod[depth];
  }
};

struct SimulatedRun {
  double seconds_per_token = 0.0;
  int drafting_steps = 0, fed_steps = 0;
};

// One request for `steps` steps, each draft accepted with probability `acceptance`; a step's wall
// time is its depth's period (a fed plain step's fed_seconds), told to the adaptive depth at the
// next step's start as the engine does.
SimulatedRun simulate_one_request(AdaptiveDepth& d, double acceptance, double fed_seconds, unsigned seed, int steps) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  SimulatedRun run;
  double seconds = 0.0, tokens = 0.0, last = -1.0;
  for (int step = 0; step < steps; ++step) {
    const int depth = d.choose(1);
    if (last > 0.0) d.record_step_seconds(1, last);
    last = *d.cost().period_seconds(1, depth);
    if (depth == 0) {
      if (d.feeds_proposer(1)) {
        ++run.fed_steps;
        last = fed_seconds;
      }
      seconds += last;
      tokens += 1.0;
      continue;
    }
    seconds += last;
    ++run.drafting_steps;
    int accepted = 0;
    while (accepted < depth && u(rng) < acceptance) ++accepted;
    d.record_verification(depth, accepted);
    tokens += 1.0 + accepted;
  }
  run.seconds_per_token = seconds / tokens;
  return run;
}

// Where speculation does not pay, a probe whose few verifications happened to go well starts a
// stretch that loses, and once a stretch has run, the head is fed every step again. Judged by its
// measured tokens a second after 32 steps, such a stretch ends as a failed probe. Over 4000 steps
// of one request these seeds ran 0.3-0.7 % more time a token than plain decoding (15-172 drafting
// and 117-219 fed steps); with no verdict 0.5-2.7 % (17-1136 and 117-786).
TEST(AdaptiveDepth, AStretchIsJudgedByTheTokensASecondItMeasured) {
  double judged_sum = 0.0, unjudged_sum = 0.0;
  for (unsigned seed = 0; seed < 10; ++seed) {
    AdaptiveDepthConfig c;
    c.num_speculative_tokens = 5;
    AdaptiveDepth judged(c, std::make_unique<EagleAtOneSampledCost>());
    c.stretch_steps = 0;
    AdaptiveDepth unjudged(c, std::make_unique<EagleAtOneSampledCost>());
    const SimulatedRun run = simulate_one_request(judged, 0.55, 180e-6, seed, 4000);
    const SimulatedRun before = simulate_one_request(unjudged, 0.55, 180e-6, seed, 4000);
    EXPECT_LE(run.seconds_per_token / 170e-6, 1.01) << "seed " << seed;
    EXPECT_LE(run.seconds_per_token, 1.001 * before.seconds_per_token) << "seed " << seed;
    EXPECT_LE(run.fed_steps, 250) << "seed " << seed;
    judged_sum += run.seconds_per_token;
    unjudged_sum += before.seconds_per_token;
  }
  EXPECT_LT(judged_sum, 0.995 * unjudged_sum);
}

// Where speculation pays (MTP-like costs, 0.9 a position: 1.4x at depth 5), the verdict changes
// nothing: the stretch measures its gain and speculation runs in nearly every step (0.71-0.73x of
// a plain step's time a token, as without the verdict).
TEST(AdaptiveDepth, AStretchThatPaysGoesOn) {
  class MtpAtOneCost : public ChainedHeadCost {
   public:
    std::optional<double> period_seconds(int n, int depth) const override {
      return target_seconds(n, 1 + depth) + draft_seconds(n, depth);
    }
  };
  for (unsigned seed = 0; seed < 10; ++seed) {
    AdaptiveDepthConfig c;
    c.num_speculative_tokens = 5;
    c.prior_acceptance = 0.45;  // off at first: the first probe's stretch is judged
    AdaptiveDepth judged(c, std::make_unique<MtpAtOneCost>());
    c.stretch_steps = 0;
    AdaptiveDepth unjudged(c, std::make_unique<MtpAtOneCost>());
    const SimulatedRun run = simulate_one_request(judged, 0.9, 160e-6, seed, 2000);
    const SimulatedRun before = simulate_one_request(unjudged, 0.9, 160e-6, seed, 2000);
    EXPECT_GE(run.drafting_steps, 1700) << "seed " << seed;
    EXPECT_LE(run.seconds_per_token, 1.01 * before.seconds_per_token) << "seed " << seed;
  }
}

// Drafts from a cache still recovering from steps it was not fed (under load, every request but
// the few a probe fed) leave the estimate as it is, and count for the stretch the probe started:
// what they deliver is what turning speculation on delivered. A probe over fed caches finds
// every draft accepted; when the recovering caches' drafts are then all rejected, the stretch
// loses (depth 0 until the next probe) with the estimate still where the probe left it, and when
// they are all accepted it goes on.
TEST(AdaptiveDepth, RecoveringDraftsCountForTheStretchNotTheEstimate) {
  class CheapDraftsCost : public StepCostModel {
   public:
    double target_seconds(int, int rows) const override { return 1e-6 * (100.0 + 5.0 * (rows - 1)); }
    double draft_seconds(int, int depth) const override { return 1e-6 * 5.0 * depth; }
    std::optional<double> period_seconds(int, int depth) const override { return 1e-6 * (100.0 + 10.0 * depth); }
  };
  for (const bool accepted : {false, true}) {
    AdaptiveDepth d(off_with_probes(5, 4), std::make_unique<CheapDraftsCost>());
    std::vector<double> after_probe;
    int stretch_drafting = 0;
    double last = 0.0;
    for (int step = 0; step < 60; ++step) {
      const int depth = d.choose(1);
      if (step > 0) d.record_step_seconds(1, last);
      last = *d.cost().period_seconds(1, depth);
      if (depth == 0) continue;
      if (d.draft_probe()) {
        d.record_verification(depth, depth);
        after_probe = d.acceptance();
        continue;
      }
      ++stretch_drafting;
      d.record_verification(depth, accepted ? depth : 0, /*recovering=*/true);
      EXPECT_EQ(d.acceptance(), after_probe) << "step " << step;
    }
    ASSERT_FALSE(after_probe.empty());
    if (accepted)
      EXPECT_GE(stretch_drafting, 40);  // of the 52 steps after the first probe (plain and deep probes aside)
    else
      EXPECT_LE(stretch_drafting, 32);
  }
}

// Without a measured plain period there is no verdict: a plain step priced by its parts can be
// cheaper than plain decoding runs (on the H200 MTP at one request priced it at 123 us where it ran
// 135 us a token), and against it stretches that paid 1.27x counted as losing. Here the parts
// price a plain step at 100 us, and every stretch step really takes 400 us for about 3.5 tokens
// (114 us a token, where plain decoding would take 135): judged against the parts it would lose.
TEST(AdaptiveDepth, NoVerdictWithoutAMeasuredPlainPeriod) {
  class PartsOnlyForPlain : public StepCostModel {
   public:
    double target_seconds(int, int rows) const override { return 1e-6 * (rows == 1 ? 100.0 : 150.0); }
    double draft_seconds(int, int depth) const override { return depth == 0 ? 0.0 : 1e-6 * (60.0 + 20.0 * depth); }
    std::optional<double> period_seconds(int, int depth) const override {
      if (depth == 0) return std::nullopt;
      return target_seconds(1, 1 + depth) + draft_seconds(1, depth);
    }
  };
  AdaptiveDepthConfig c;
  c.num_speculative_tokens = 3;
  c.prior_acceptance = 0.2;  // off: the first probe starts a stretch
  c.probe_interval = 8;
  AdaptiveDepth d(c, std::make_unique<PartsOnlyForPlain>());
  int drafting = 0;
  for (int step = 0; step < 200; ++step) {
    const int depth = d.choose(1);
    if (step > 0) d.record_step_seconds(1, depth > 0 ? 400e-6 : 135e-6);
    if (depth == 0) continue;
    ++drafting;
    d.record_verification(depth, std::min(depth, 2 + step % 2));  // 2-3 of 3 accepted
  }
  EXPECT_GT(drafting, 150);
}

// A period is the median of its last samples: a rare long one (the engine's thread descheduled)
// moves it nowhere, a change that lasts moves it within half the window.
TEST(OnlineCostModel, APeriodIsTheMedianOfItsLastSamples) {
  OnlineCostModel m(4, 0.25);
  EXPECT_FALSE(m.period_seconds(1, 2));
  m.record_period(1, 2, 0.0004);
  EXPECT_NEAR(*m.period_seconds(1, 2), 0.0004, 1e-12);
  for (int i = 0; i < 20; ++i) m.record_period(1, 2, i % 10 == 9 ? 0.0030 : 0.0004);
  EXPECT_NEAR(*m.period_seconds(1, 2), 0.0004, 1e-12);
  for (int i = 0; i < 8; ++i) m.record_period(1, 2, 0.0005);
  EXPECT_NEAR(*m.period_seconds(1, 2), 0.0005, 1e-12);
  m.record_period(1, 2, 0.0);  // a clock that did not move
  EXPECT_NEAR(*m.period_seconds(1, 2), 0.0005, 1e-12);
  EXPECT_FALSE(m.period_seconds(1, 1)) << "each depth its own";
  EXPECT_FALSE(m.period_seconds(2, 2)) << "each bucket its own";
}

TEST(OnlineCostModel, TheProposersFixedCostShapesUnmeasuredDepths) {
  OnlineCostModel m(8, 0.25, 0.2, 3.0);  // draft(d) ~ d + 3
  m.record_draft(1, 1, 0.004);
  EXPECT_NEAR(m.draft_seconds(1, 5), 0.004 * 8.0 / 4.0, 1e-12);
  EXPECT_NEAR(m.prior_draft_shape(1), 1.0, 1e-12);
}

TEST(OnlineCostModel, MeasuresAndExtrapolatesWithThePriorShape) {
  OnlineCostModel m(4, 0.25);
  // Nothing measured: the prior, draft at its ratio.
  EXPECT_DOUBLE_EQ(m.target_seconds(1, 1), OnlineCostModel::prior_target(1, 1));
  EXPECT_DOUBLE_EQ(m.draft_seconds(1, 1), 0.25 * OnlineCostModel::prior_target(1, 1));
  EXPECT_DOUBLE_EQ(m.draft_seconds(1, 0), 0.0);
  // One measurement anchors everything to seconds.
  m.record_target(1, 1, 0.010);
  EXPECT_DOUBLE_EQ(m.target_seconds(1, 1), 0.010);
  EXPECT_NEAR(m.target_seconds(1, 4), 0.010 * OnlineCostModel::prior_target(1, 4) / OnlineCostModel::prior_target(1, 1),
              1e-12);
  EXPECT_NEAR(m.draft_seconds(1, 1), 0.25 * 0.010, 1e-12);
  // A measured key wins over extrapolation; repeated measurements are averaged.
  m.record_target(1, 4, 0.030);
  EXPECT_NEAR(m.target_seconds(1, 4), 0.030, 1e-12);
  for (int i = 0; i < 100; ++i) m.record_target(1, 4, 0.020);
  EXPECT_NEAR(m.target_seconds(1, 4), 0.020, 1e-6);
  m.record_draft(1, 1, 0.002);
  EXPECT_NEAR(m.draft_seconds(1, 1), 0.002, 1e-12);
  // Drafting is keyed by depth: a measured depth is what it measured, the others scale from the
  // nearest measured one by d + 0.5, not by d.
  EXPECT_NEAR(m.draft_seconds(1, 3), 0.002 * 3.5 / 1.5, 1e-12);
  m.record_draft(1, 3, 0.004);
  EXPECT_NEAR(m.draft_seconds(1, 3), 0.004, 1e-12);
  EXPECT_NEAR(m.draft_seconds(1, 1), 0.002, 1e-12);
  EXPECT_NEAR(m.draft_seconds(1, 4), 0.004 * 4.5 / 3.5, 1e-12);
  // One slow sample at the start (a kernel's first launch) does not stick: the first samples
  // settle on their minimum, and later outliers move the average by a bounded step.
  OnlineCostModel fresh(4, 0.25);
  fresh.record_draft(1, 1, 0.050);
  fresh.record_draft(1, 1, 0.002);
  fresh.record_draft(1, 1, 0.0021);
  EXPECT_DOUBLE_EQ(fresh.draft_seconds(1, 1), 0.002);
  fresh.record_draft(1, 1, 1.0);
  EXPECT_NEAR(fresh.draft_seconds(1, 1), 0.002 + 0.2 * (3 * 0.002 - 0.002), 1e-12);
  // Other batch sizes scale from the nearest measured bucket.
  EXPECT_GT(m.target_seconds(200, 1), m.target_seconds(1, 1));
  EXPECT_EQ(OnlineCostModel::bucket_of(1), 0);
  EXPECT_EQ(OnlineCostModel::bucket_of(2), 1);
  EXPECT_EQ(OnlineCostModel::bucket_of(3), 2);
  EXPECT_EQ(OnlineCostModel::bucket_of(256), 8);
}

}  // namespace
}  // namespace specula
