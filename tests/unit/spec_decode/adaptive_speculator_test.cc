// AdaptiveSpeculator: which proposer calls teach the cost model a draft step's cost, and load shedding.
// Proposer calls are timed on a fake clock that the fake proposer advances: the durations the cost
// model sees are exact, whatever the machine's load.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <unordered_set>

#include "engine/scheduler_output.h"
#include "spec_decode/adaptive_speculator.h"

namespace specula {
namespace {

// A proposer whose first call for a request is slow (it runs the prompt through the draft: 30 ms)
// and whose later calls are fast (0.1 ms); it drafts `depth` copies of token 7. `now` is the clock
// the speculator times it with (speculator_for).
class CatchUpProposer : public Proposer {
 public:
  std::string_view method() const override { return "fake"; }
  double relative_step_cost() const override { return 0.2; }
  void propose(const ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) override {
    ++calls;
    now += 0.0001;
    drafts.assign(batch.requests.size(), {});
    fed.clear();
    for (const ProposerRequest& r : batch.requests)
      if (!r.shed) fed.push_back(std::string(r.req_id));
    for (size_t i = 0; i < batch.requests.size(); ++i) {
      const ProposerRequest& r = batch.requests[i];
      if (seen_.insert(std::string(r.req_id)).second)
        now += 0.030;  // the prompt's catch-up
      if (r.sampled) drafts[i].assign(static_cast<size_t>(std::min(batch.depth, r.max_drafts)), 7);
    }
  }
  void drop_request(std::string_view id) override { seen_.erase(std::string(id)); }
  int calls = 0;
  double now = 0.0;              // seconds
  std::vector<std::string> fed;  // the requests of the last call that were not shed

 private:
  std::unordered_set<std::string> seen_;
};

// A speculator that times `p` on p's own clock.
AdaptiveSpeculator speculator_for(std::unique_ptr<CatchUpProposer> p, const AdaptiveSpeculatorConfig& config) {
  CatchUpProposer* raw = p.get();
  return AdaptiveSpeculator(std::move(p), config, nullptr, [raw] { return raw->now; });
}

// Speculation off for want of acceptance: drafts were never accepted, at a target step of 1 ms
// for n requests and a draft step of `draft_seconds`.
void never_accepted(AdaptiveSpeculator& spec, int n, double draft_seconds) {
  for (int r = 1; r <= 4; ++r) spec.record_target_step(n, r, 0.001);
  spec.depth().cost().record_draft(n, 1, draft_seconds);
  for (int i = 0; i < 5000; ++i) spec.record_verification("r", 3, 0);
}

// Drafts never accepted and a draft step as costly as the target: speculation cannot pay for n
// requests, not even in a probe.
void cannot_pay(AdaptiveSpeculator& spec, int n) {
  for (int r = 1; r <= 4; ++r) spec.record_target_step(n, r, 0.001 * r);
  spec.depth().cost().record_draft(n, 1, 0.001);
  for (int i = 0; i < 5000; ++i) spec.record_verification("r", 3, 0);
}

std::vector<std::string> request_ids(int n) {
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) ids.push_back("r" + std::to_string(i));
  return ids;
}

// A ProposerRequest holds a view of its id: the ids the tests use live as long as the binary.
std::string_view interned(const std::string& id) {
  static std::set<std::string, std::less<>> ids;
  return *ids.insert(id).first;
}

// Decoding requests; verified: each verified drafts this step (it drafted in the previous one).
ProposeBatch decode_batch(const std::vector<std::string>& ids, bool verified = false) {
  ProposeBatch b;
  for (const std::string& id : ids) {
    ProposerRequest r;
    r.req_id = interned(id);
    r.sampled = true;
    r.verified_drafts = verified;
    r.max_drafts = 3;
    b.requests.push_back(r);
  }
  return b;
}

TEST(AdaptiveSpeculator, OnlySteadyStepsTeachTheDraftCost) {
  auto proposer = std::make_unique<CatchUpProposer>();
  CatchUpProposer* p = proposer.get();
  AdaptiveSpeculator spec = speculator_for(std::move(proposer), AdaptiveSpeculatorConfig{3, true});
  // A target decode step of 1 ms measured, as the runner records it.
  for (int r = 1; r <= 4; ++r) spec.record_target_step(1, r, 0.001 * (1.0 + 0.05 * (r - 1)));
  const std::vector<std::string> ids = {"a"};
  std::vector<std::vector<int32_t>> drafts;
  ProposeBatch b = decode_batch(ids);
  const int first = spec.propose(b, drafts);
  ASSERT_GT(first, 0);  // priors: drafting pays
  ASSERT_EQ(drafts[0].size(), static_cast<size_t>(first));
  // The first call ran the 30 ms catch-up of the prompt: not a draft step's cost. Had it been
  // recorded (10 ms per draft against a 1 ms target step) the depth would drop to 0 for good.
  for (int step = 0; step < 20; ++step) {
    b = decode_batch(ids, /*verified=*/true);
    for (int i = 0; i < 3; ++i) spec.record_verification("r", 3, 3);
    EXPECT_GT(spec.propose(b, drafts), 0) << "step " << step;
  }
  EXPECT_LT(spec.depth().cost().draft_seconds(1, 3), 0.015);
  EXPECT_EQ(p->calls, 21);
}

// A proposer whose named requests draft from a cache still recovering from shed steps.
class RecoveringProposer : public CatchUpProposer {
 public:
  bool recovering(std::string_view req_id) const override { return stale.count(std::string(req_id)) > 0; }
  std::set<std::string> stale;
};

// Verifications of requests drafting from a recovering cache leave the acceptance estimate alone
// (they measure the stale cache, not the proposer); the others move it as before.
TEST(AdaptiveSpeculator, DraftsFromARecoveringCacheDoNotMoveTheEstimate) {
  auto owned = std::make_unique<RecoveringProposer>();
  RecoveringProposer* p = owned.get();
  p->stale = {"cold"};
  AdaptiveSpeculatorConfig config;
  config.num_speculative_tokens = 3;
  AdaptiveSpeculator spec(std::move(owned), config, nullptr, [p] { return p->now; });
  const std::vector<double> before = spec.depth().acceptance();
  for (int i = 0; i < 50; ++i) spec.record_verification("cold", 3, 0);
  EXPECT_EQ(spec.depth().acceptance(), before);
  for (int i = 0; i < 50; ++i) spec.record_verification("warm", 3, 0);
  EXPECT_LT(spec.depth().acceptance()[0], before[0] / 2);
}

// A proposer that leaves its drafts on the device (async scheduling): propose() launches in 0.1 ms
// and gives placeholders; collecting them waits `wait` seconds more.
class DeviceDraftsProposer : public CatchUpProposer {
 public:
  bool leaves_drafts_on_device() const override { return true; }
  bool can_propose_ahead(const ProposeBatch& batch) const override { return batch.ahead.has_value(); }
  void settle_ahead(std::span<const int> accepted) override { settled.assign(accepted.begin(), accepted.end()); }
  void propose(const ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) override {
    CatchUpProposer::propose(batch, drafts);
    values = drafts;
    for (std::vector<int32_t>& d : drafts) std::fill(d.begin(), d.end(), kPlaceholderToken);
    on_device.first.assign(drafts.size(), 0);
    pending = batch.may_leave_drafts_on_device;
    if (!pending) drafts = values;
  }
  const DraftsOnDevice* drafts_on_device() const override { return pending ? &on_device : nullptr; }
  std::vector<std::vector<int32_t>> finish_drafts() override {
    if (!pending) return {};
    pending = false;
    now += wait;
    return values;
  }
  double wait = 0.0;
  bool pending = false;
  std::vector<int> settled;
  DraftsOnDevice on_device;
  std::vector<std::vector<int32_t>> values;
};

// Records what the cost model is taught about drafting.
class DraftCostRecorder : public StepCostModel {
 public:
  double target_seconds(int, int rows) const override { return 0.001 * (1.0 + 0.05 * (rows - 1)); }
  double draft_seconds(int, int depth) const override { return 0.0001 * depth; }
  void record_draft(int num_seqs, int depth, double seconds) override { drafts.push_back({num_seqs, depth, seconds}); }
  struct Draft {
    int num_seqs, depth;
    double seconds;
  };
  std::vector<Draft> drafts;
};

// Drafts left on the device cost what their launch took plus what collecting them waited for (draft
// work the device did while the host staged the next step cost that step nothing), learned once
// they are collected, not at the launch.
// A pinned k = 3 speculator over a DeviceDraftsProposer, timed on its clock, teaching a recorder.
struct DeviceDraftsSpeculator {
  DeviceDraftsSpeculator()
      : p(new DeviceDraftsProposer), recorded(new DraftCostRecorder),
        spec(std::unique_ptr<Proposer>(p), AdaptiveSpeculatorConfig{3, false}, std::unique_ptr<StepCostModel>(recorded),
             [this] { return p->now; }) {}
  DeviceDraftsProposer* p;
  DraftCostRecorder* recorded;
  AdaptiveSpeculator spec;
};

TEST(AdaptiveSpeculator, DraftsLeftOnTheDeviceCostTheirLaunchAndTheWait) {
  DeviceDraftsSpeculator s;
  DeviceDraftsProposer* p = s.p;
  DraftCostRecorder* recorded = s.recorded;
  AdaptiveSpeculator& spec = s.spec;
  EXPECT_TRUE(spec.leaves_drafts_on_device());
  std::vector<std::vector<int32_t>> drafts;
  ProposeBatch first = decode_batch({"a", "b"});
  first.may_leave_drafts_on_device = true;
  spec.propose(first, drafts);
  spec.finish_drafts();  // their first call: the prompts' catch-up, not learned
  ASSERT_TRUE(recorded->drafts.empty());
  ProposeBatch b = decode_batch({"a", "b"}, /*verified=*/true);
  b.may_leave_drafts_on_device = true;
  spec.propose(b, drafts);
  ASSERT_NE(spec.drafts_on_device(), nullptr);
  EXPECT_EQ(drafts, (std::vector<std::vector<int32_t>>{{kPlaceholderToken, kPlaceholderToken, kPlaceholderToken},
                                                      {kPlaceholderToken, kPlaceholderToken, kPlaceholderToken}}));
  EXPECT_TRUE(recorded->drafts.empty()) << "learned before the drafts were collected";
  p->wait = 0.00025;
  EXPECT_EQ(spec.finish_drafts(), (std::vector<std::vector<int32_t>>{{7, 7, 7}, {7, 7, 7}}));
  EXPECT_EQ(spec.drafts_on_device(), nullptr);
  ASSERT_EQ(recorded->drafts.size(), 1u);
  EXPECT_EQ(recorded->drafts[0].num_seqs, 2);
  EXPECT_EQ(recorded->drafts[0].depth, 3);
  EXPECT_NEAR(recorded->drafts[0].seconds, 0.0001 + 0.00025, 1e-12);
  // Synchronously (the drafts on the host at once) the launch is the whole cost.
  b = decode_batch({"a", "b"}, /*verified=*/true);
  spec.propose(b, drafts);
  EXPECT_EQ(drafts[0], (std::vector<int32_t>{7, 7, 7}));
  ASSERT_EQ(recorded->drafts.size(), 2u);
  EXPECT_NEAR(recorded->drafts[1].seconds, 0.0001, 1e-12);
}

// Drafts launched ahead of the verification's results (async scheduling's launch-ahead) run on
// the device from the verification's end: they cost from settle_ahead() to their collection,
// not their launch, which overlapped the verification. A proposer that cannot launch ahead
// leaves the depth chosen for the propose() that follows.
TEST(AdaptiveSpeculator, DraftsLaunchedAheadCostFromTheVerificationsEnd) {
  DeviceDraftsSpeculator s;
  DeviceDraftsProposer* p = s.p;
  DraftCostRecorder* recorded = s.recorded;
  AdaptiveSpeculator& spec = s.spec;
  std::vector<std::vector<int32_t>> drafts;
  ProposeBatch b = decode_batch({"a", "b"}, /*verified=*/true);
  b.may_leave_drafts_on_device = true;
  EXPECT_EQ(spec.propose_ahead(b, drafts), -1);  // no ProposeBatch::ahead: nothing launched
  b.ahead = ProposeBatch::LaunchAhead{Tensor(), Tensor(), 3};
  EXPECT_EQ(spec.propose_ahead(b, drafts), 3);
  ASSERT_NE(spec.drafts_on_device(), nullptr);
  p->now += 0.0002;  // the verification's wait
  const std::vector<int> accepted = {2, 0};
  spec.settle_ahead(accepted);
  EXPECT_EQ(p->settled, accepted);
  p->now += 0.00005;  // the host's next step
  p->wait = 0.0001;
  spec.finish_drafts();
  ASSERT_EQ(recorded->drafts.size(), 1u);
  EXPECT_NEAR(recorded->drafts[0].seconds, 0.00005 + 0.0001, 1e-12);
}

// A steady step (every request verified drafts) whose proposer still caught up more than 1 + k
// positions a request (a prompt, a depth-0 stretch) does not teach the draft cost either.
class LongCatchUpProposer : public CatchUpProposer {
 public:
  int64_t last_catch_up_tokens() const override { return catch_up; }
  int64_t catch_up = 0;
};

TEST(AdaptiveSpeculator, StepsWithLongCatchUpsDoNotTeachTheDraftCost) {
  auto proposer = std::make_unique<LongCatchUpProposer>();
  LongCatchUpProposer* p = proposer.get();
  AdaptiveSpeculator spec = speculator_for(std::move(proposer), AdaptiveSpeculatorConfig{3, true});
  for (int r = 1; r <= 4; ++r) spec.record_target_step(2, r, 0.001);
  const double prior = spec.depth().cost().draft_seconds(2, 3);
  std::vector<std::vector<int32_t>> drafts;
  ProposeBatch first = decode_batch({"a", "b"});
  spec.propose(first, drafts);  // their first calls (slow, not steady)
  p->catch_up = 2 * 4 + 1;      // one more than the steady 1 + k per request
  ProposeBatch b = decode_batch({"a", "b"}, /*verified=*/true);
  ASSERT_GT(spec.propose(b, drafts), 0);
  EXPECT_DOUBLE_EQ(spec.depth().cost().draft_seconds(2, 3), prior) << "a long catch-up was learned";
  p->catch_up = 2 * 4;
  b = decode_batch({"a", "b"}, /*verified=*/true);
  ASSERT_GT(spec.propose(b, drafts), 0);
  EXPECT_NE(spec.depth().cost().draft_seconds(2, 3), prior) << "a steady step was not learned";
}

TEST(AdaptiveSpeculator, LearnsTheHostsShareOfAStepBetweenDecodeSteps) {
  auto proposer = std::make_unique<CatchUpProposer>();
  CatchUpProposer* p = proposer.get();
  AdaptiveSpeculator spec = speculator_for(std::move(proposer), AdaptiveSpeculatorConfig{3, true});
  std::vector<std::vector<int32_t>> drafts;
  EXPECT_DOUBLE_EQ(spec.depth().cost().host_seconds(1), 0.0);
  // Each step: 1 ms of target forward and 0.2 ms of host work besides the proposer's own time.
  for (int step = 0; step < 10; ++step) {
    ProposeBatch b = decode_batch({"a"}, /*verified=*/step > 0);
    b.target_seconds = 0.001;
    spec.propose(b, drafts);
    p->now += 0.0012;
  }
  EXPECT_NEAR(spec.depth().cost().host_seconds(1), 0.0002, 1e-9);
  // A step with a prompt chunk (a request arriving after the engine sat idle) is not host work.
  ProposeBatch prompt = decode_batch({"a", "b"});
  prompt.requests[1].sampled = false;
  spec.propose(prompt, drafts);
  p->now += 5.0;
  for (int step = 0; step < 2; ++step) {
    ProposeBatch b = decode_batch({"a", "b"}, /*verified=*/true);
    b.target_seconds = 0.001;
    spec.propose(b, drafts);
    p->now += 0.0012;
  }
  EXPECT_NEAR(spec.depth().cost().host_seconds(2), 0.0002, 1e-9);
}

TEST(AdaptiveSpeculator, DepthZeroDecodeStepsDoNotCallTheProposer) {
  auto proposer = std::make_unique<CatchUpProposer>();
  CatchUpProposer* p = proposer.get();
  AdaptiveSpeculator spec = speculator_for(std::move(proposer), AdaptiveSpeculatorConfig{3, true});
  cannot_pay(spec, 64);
  std::vector<std::vector<int32_t>> drafts;
  ProposeBatch b = decode_batch(request_ids(64));
  EXPECT_EQ(spec.propose(b, drafts), 0);
  EXPECT_EQ(p->calls, 0);
  ASSERT_EQ(drafts.size(), 64u);
  for (const auto& d : drafts) EXPECT_TRUE(d.empty());
}

// The runner asks before the forward of a step that verifies nothing (skip_step): where speculation
// cannot pay it skips the step (no propose(), so its tokens may stay on the device), and the step
// after it is no host measurement, since nothing timed the step between.
TEST(AdaptiveSpeculator, DepthZeroStepsAreSkippedBeforeSampling) {
  auto proposer = std::make_unique<CatchUpProposer>();
  CatchUpProposer* p = proposer.get();
  AdaptiveSpeculator spec = speculator_for(std::move(proposer), AdaptiveSpeculatorConfig{3, true});
  cannot_pay(spec, 64);
  const double host_before = spec.depth().cost().host_seconds(64);
  for (int step = 0; step < 100; ++step) {
    EXPECT_TRUE(spec.skip_step(64, false)) << "step " << step;
    p->now += 0.001;  // the skipped step: its 1 ms target forward (cannot_pay)
  }
  EXPECT_EQ(p->calls, 0);
  std::vector<std::vector<int32_t>> drafts;
  ProposeBatch b = decode_batch(request_ids(64));
  EXPECT_EQ(spec.propose(b, drafts), 0);  // not skipped (the runner asked nothing): chooses itself
  EXPECT_EQ(spec.depth().cost().host_seconds(64), host_before);
}

// A step's period at its depth: the time from one step's entry to the next's, learned only where
// three steps in a row ran the same way over the same requests (the steady period): idle steps
// (skip_step) for depth 0, propose() at the chosen depth for the others; never from a step with
// prompt chunks, a probe or a change of batch.
TEST(AdaptiveSpeculator, LearnsEachDepthsPeriodFromStepsInARow) {
  auto proposer = std::make_unique<CatchUpProposer>();
  CatchUpProposer* p = proposer.get();
  AdaptiveSpeculator spec = speculator_for(std::move(proposer), AdaptiveSpeculatorConfig{3, true});
  StepCostModel& cost = spec.depth().cost();
  cannot_pay(spec, 4);
  const auto idle_steps = [&](int n, double seconds, bool with_prompts) {
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(spec.skip_step(4, with_prompts));
      p->now += seconds;
    }
  };
  idle_steps(2, 0.002, false);
  EXPECT_FALSE(cost.period_seconds(4, 0)) << "two steps are one period, but not yet a steady one";
  idle_steps(1, 0.002, false);
  ASSERT_TRUE(cost.period_seconds(4, 0));
  EXPECT_NEAR(*cost.period_seconds(4, 0), 0.002, 1e-12);
  // Steps with prompt chunks, and the two after them, teach nothing.
  idle_steps(4, 0.010, true);
  idle_steps(2, 0.010, false);
  EXPECT_NEAR(*cost.period_seconds(4, 0), 0.002, 1e-12);
  EXPECT_FALSE(cost.period_seconds(1, 0)) << "a bucket of its own";
}

TEST(AdaptiveSpeculator, LearnsASpeculativeDepthsPeriodFromProposeToPropose) {
  auto proposer = std::make_unique<CatchUpProposer>();
  CatchUpProposer* p = proposer.get();
  AdaptiveSpeculator spec = speculator_for(std::move(proposer), AdaptiveSpeculatorConfig{3, true});
  StepCostModel& cost = spec.depth().cost();
  // Speculation that pays (the priors) for one request, each step 3 ms besides the proposer's own
  // 0.1 ms (its first call's 30 ms prompt catch-up is in the first period, which is not steady).
  std::vector<std::vector<int32_t>> drafts;
  int depth = -1;
  for (int step = 0; step < 4; ++step) {
    ProposeBatch b = decode_batch({"a"}, /*verified=*/step > 0);
    const int d = spec.propose(b, drafts);
    ASSERT_GT(d, 0);
    if (depth >= 0) ASSERT_EQ(d, depth) << "the same depth each step";
    depth = d;
    p->now += 0.003;
  }
  ASSERT_TRUE(cost.period_seconds(1, depth));
  EXPECT_NEAR(*cost.period_seconds(1, depth), 0.0031, 1e-9);
  EXPECT_FALSE(cost.period_seconds(1, 0));
}

// Only steps that decode at the depth teach its period. A request's first step samples at the end
// of its prompt, after the engine waited for the request: with the steps before it, that wait
// became depth 4's period at one request on the H200 (31.5 ms, where its steps took ~0.37), and
// the depth fell to ~1 for the rest of the run. A request's last steps, where max_tokens leaves no
// drafts, are plain steps whatever the depth.
TEST(AdaptiveSpeculator, NoPeriodFromPromptStepsOrStepsWithoutDrafts) {
  std::vector<std::vector<int32_t>> drafts;
  {
    auto proposer = std::make_unique<CatchUpProposer>();
    CatchUpProposer* p = proposer.get();
    AdaptiveSpeculator spec = speculator_for(std::move(proposer), AdaptiveSpeculatorConfig{3, true});
    StepCostModel& cost = spec.depth().cost();
    ProposeBatch first = decode_batch({"a"});
    const int depth = spec.propose(first, drafts);
    ASSERT_GT(depth, 0);
    p->now += 0.003;
    ProposeBatch second = decode_batch({"a"}, true);
    ASSERT_EQ(spec.propose(second, drafts), depth);
    p->now += 0.003 + 0.030;  // its last step, then the wait for the next request
    ProposeBatch prompt = decode_batch({"b"});
    prompt.requests[0].num_prompt_tokens = 128;  // its prompt's step, which samples its first token
    prompt.requests[0].num_rows = 128;
    ASSERT_EQ(spec.propose(prompt, drafts), depth);
    EXPECT_FALSE(cost.period_seconds(1, depth)) << *cost.period_seconds(1, depth);
    p->now += 0.003;
    for (int step = 0; step < 3; ++step) {
      ProposeBatch b = decode_batch({"b"}, step > 0);
      b.requests[0].first_position = 128 + step;
      b.requests[0].num_prompt_tokens = 128;
      ASSERT_EQ(spec.propose(b, drafts), depth);
      p->now += 0.003;
    }
    ASSERT_TRUE(cost.period_seconds(1, depth));
    EXPECT_NEAR(*cost.period_seconds(1, depth), 0.0031, 1e-9);
  }
  auto proposer = std::make_unique<CatchUpProposer>();
  CatchUpProposer* p = proposer.get();
  AdaptiveSpeculator spec = speculator_for(std::move(proposer), AdaptiveSpeculatorConfig{3, true});
  int depth = -1;
  for (int step = 0; step < 4; ++step) {
    ProposeBatch b = decode_batch({"a"}, step > 0);
    b.requests[0].max_drafts = 0;
    depth = spec.propose(b, drafts);
    ASSERT_GT(depth, 0);
    p->now += 0.001;
  }
  EXPECT_FALSE(spec.depth().cost().period_seconds(1, depth));
}

// The stretch of speculation a probe from depth 0 starts is judged by its steps' wall times: not
// by the wait for the next request between two of them (at one request on the H200, ~45 ms where
// 30 steps took 11: such stretches were judged lost, and MTP ran at depth 0-1 for the rest of the
// run), nor by the next request's prompt step (here its 30 ms catch-up).
TEST(AdaptiveSpeculator, AStretchIsNotChargedTheWaitForTheNextRequest) {
  auto proposer = std::make_unique<CatchUpProposer>();
  CatchUpProposer* p = proposer.get();
  AdaptiveSpeculator spec = speculator_for(std::move(proposer), AdaptiveSpeculatorConfig{3, true});
  never_accepted(spec, 1, 0.0002);
  std::vector<std::vector<int32_t>> drafts;
  int depth = 0, position = 128;
  std::string id = "a";
  // One step of request `id`: a plain step takes 1 ms, a speculative one 1.2 ms, and every draft
  // is accepted (verified at once: the next step's choice sees it).
  const auto step = [&](bool prompt) {
    if (depth == 0 && !prompt && spec.skip_step(1, false)) {
      p->now += 0.001;
      ++position;
      return;
    }
    ProposeBatch b = decode_batch({id}, depth > 0);
    b.requests[0].num_prompt_tokens = 128;
    b.requests[0].first_position = prompt ? 0 : position;
    b.requests[0].num_rows = prompt ? 128 : 1 + depth;
    b.target_seconds = 0.001;
    depth = spec.propose(b, drafts);
    p->now += depth > 0 ? 0.0012 : 0.001;
    if (depth > 0) spec.record_verification("r", depth, depth);
    position = prompt ? 128 : position + 1 + depth;
  };
  step(true);
  int steps = 0;
  while (depth == 0 && steps++ < 1000) step(false);
  ASSERT_GT(depth, 0) << "a probe from depth 0";
  for (int i = 0; i < 40; ++i) {
    if (i == 10) {  // request a ends; the engine waits for b, whose prompt runs
      p->now += 0.200;
      id = "b";
      step(true);
    }
    step(false);
  }
  EXPECT_GT(depth, 0) << "the stretch was charged the wait";
}

// Where the choice is not idle (a probe, a proposer to feed, speculation on) skip_step says no, and
// the propose() that follows keeps its choice instead of choosing again (a second choice would
// advance the probe clock twice a step).
TEST(AdaptiveSpeculator, AStepNotSkippedKeepsTheDepthChosenBeforeSampling) {
  auto proposer = std::make_unique<CatchUpProposer>();
  CatchUpProposer* p = proposer.get();
  AdaptiveSpeculator spec = speculator_for(std::move(proposer), AdaptiveSpeculatorConfig{3, true});
  never_accepted(spec, 4, 0.0001);  // off for want of acceptance, but one draft could pay: probes
  std::vector<std::vector<int32_t>> drafts;
  int skipped = 0, probes = 0;
  for (int step = 1; step <= 64; ++step) {
    if (spec.skip_step(4, false)) {
      ++skipped;
      p->now += 0.001;  // its 1 ms target forward (never_accepted)
      continue;
    }
    ProposeBatch b = decode_batch(request_ids(4));
    const int depth = spec.propose(b, drafts);
    EXPECT_GT(depth, 0) << "step " << step;  // a probe: the only reason not to skip here
    ++probes;
  }
  // One probe in 64 steps (its interval is 32, doubled after it fails), of probe_steps steps in a
  // row (no verification here ends it early).
  const int probe_steps = AdaptiveDepthConfig{}.probe_steps;
  EXPECT_EQ(probes, probe_steps);
  EXPECT_EQ(skipped, 64 - probe_steps);
  EXPECT_EQ(p->calls, probes);
}

// A proposer that must see every step (MTP): a depth-0 step still reaches it where one draft could
// pay (it is off for want of acceptance, which a stale cache would keep low), for the requests a
// probe would draft for (all of a small batch, the first 4 under load); where no draft can pay it
// is shed as any other.
class EveryStepProposer : public CatchUpProposer {
 public:
  bool needs_every_step() const override { return true; }
};

TEST(AdaptiveSpeculator, AnEveryStepProposerIsFedTheProbesRequestsAtDepthZero) {
  for (int n : {1, 4, 5, 64}) {
    for (bool draft_can_pay : {true, false}) {
      SCOPED_TRACE(std::to_string(n) + (draft_can_pay ? " requests, drafts could pay" : " requests, drafts cannot pay"));
      auto proposer = std::make_unique<EveryStepProposer>();
      EveryStepProposer* p = proposer.get();
      AdaptiveSpeculator spec = speculator_for(std::move(proposer), AdaptiveSpeculatorConfig{3, true});
      never_accepted(spec, n, draft_can_pay ? 0.0001 : 0.002);
      const std::vector<std::string> ids = request_ids(n);
      std::vector<std::vector<int32_t>> drafts;
      ProposeBatch b = decode_batch(ids);
      EXPECT_EQ(spec.propose(b, drafts), 0);
      EXPECT_EQ(p->calls, draft_can_pay ? 1 : 0);
      if (draft_can_pay) {
        ASSERT_EQ(p->fed.size(), static_cast<size_t>(std::min(n, AdaptiveSpeculator::kProbeRequests)));
        for (size_t i = 0; i < p->fed.size(); ++i) EXPECT_EQ(p->fed[i], ids[i]);  // the first ones
      }
      for (const auto& d : drafts) EXPECT_TRUE(d.empty());
    }
  }
}

// Under load the stretch before a probe feeds the requests the probe then drafts for, so that
// their caches are warm when it measures acceptance.
TEST(AdaptiveSpeculator, UnderLoadTheProbeDraftsForTheRequestsThatWereFed) {
  auto proposer = std::make_unique<EveryStepProposer>();
  EveryStepProposer* p = proposer.get();
  AdaptiveSpeculator spec = speculator_for(std::move(proposer), AdaptiveSpeculatorConfig{3, true});
  never_accepted(spec, 64, 0.0001);
  const std::vector<std::string> ids = request_ids(64);
  ProposeBatch b = decode_batch(ids);
  b.requests[1].max_drafts = 0;  // at its max_tokens: neither fed nor drafting
  const std::vector<std::string> probed = {"r0", "r2", "r3", "r4"};
  std::vector<std::vector<int32_t>> drafts;
  int probes = 0;
  for (int step = 1; step <= 32; ++step) {
    ProposeBatch s = b;
    const int drafted = spec.propose(s, drafts);
    EXPECT_EQ(p->fed, probed) << "step " << step;
    if (drafted == 0) continue;
    ++probes;
    std::vector<std::string> drafting;
    for (size_t i = 0; i < drafts.size(); ++i)
      if (!drafts[i].empty()) drafting.push_back(ids[i]);
    EXPECT_EQ(drafting, probed);
  }
  EXPECT_EQ(probes, 1);
}

TEST(AdaptiveSpeculator, APlainProbeWhileSpeculatingStillReachesTheProposer) {
  // Speculation pays (every draft accepted, drafts cheap): every 32nd step is a plain step that
  // re-measures the target, and a proposer that must see every step (MTP) is still called then.
  auto proposer = std::make_unique<CatchUpProposer>();
  CatchUpProposer* p = proposer.get();
  AdaptiveSpeculator spec = speculator_for(std::move(proposer), AdaptiveSpeculatorConfig{3, true});
  for (int r = 1; r <= 4; ++r) spec.record_target_step(1, r, 0.001);
  spec.depth().cost().record_draft(1, 1, 0.0001);
  std::vector<std::vector<int32_t>> drafts;
  int plain_steps = 0;
  for (int step = 0; step < 64; ++step) {
    for (int i = 0; i < 3; ++i) spec.record_verification("r", 3, 3);
    ProposeBatch b = decode_batch({"a"});
    if (spec.propose(b, drafts) == 0) {
      ++plain_steps;
      EXPECT_TRUE(drafts[0].empty());
    }
  }
  EXPECT_EQ(plain_steps, 2);
  EXPECT_EQ(p->calls, 64);
}

TEST(AdaptiveSpeculator, AProbeFromDepthZeroDraftsForAFewRequestsOnly) {
  // 64 requests whose drafts were never accepted: speculation is off, and the probe every 32
  // steps (drafts would pay were they accepted) drafts for 4 of them, not for all 64.
  auto proposer = std::make_unique<CatchUpProposer>();
  AdaptiveSpeculator spec = speculator_for(std::move(proposer), AdaptiveSpeculatorConfig{3, true});
  never_accepted(spec, 64, 0.0001);
  const std::vector<std::string> ids = request_ids(64);
  std::vector<std::vector<int32_t>> drafts;
  int probes = 0;
  for (int step = 1; step <= 32; ++step) {
    ProposeBatch b = decode_batch(ids);
    if (spec.propose(b, drafts) == 0) continue;
    ++probes;
    int drafting = 0;
    for (const auto& d : drafts) drafting += d.empty() ? 0 : 1;
    EXPECT_EQ(drafting, 4);
  }
  EXPECT_EQ(probes, 1);
}

}  // namespace
}  // namespace specula
