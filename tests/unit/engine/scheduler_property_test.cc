// Drives the scheduler with random arrivals, aborts, draft tokens and shared prefixes over a small
// block pool (so that preemption happens all the time), checking after every step that every
// block is accounted for, and at the end that every block went back to the pool and every request
// finished exactly once.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "engine/scheduler.h"
#include "request_helpers.h"

namespace specula {
namespace {

struct Tally {
  std::map<std::string, int> finished;  // times each request was reported finished
};

void check_step(const Scheduler& s, const SchedulerOutput& so) {
  const SchedulerConfig& c = s.config();
  s.kv_cache().check_invariants();
  ASSERT_LE(so.total_num_scheduled_tokens, c.max_num_batched_tokens);
  ASSERT_LE(static_cast<int>(so.scheduled.size()), c.max_num_seqs);
  ASSERT_LE(s.num_running(), c.max_num_seqs);
  std::set<std::string> seen;
  int total = 0;
  for (const auto& sr : so.scheduled) {
    ASSERT_TRUE(seen.insert(sr.req_id).second) << sr.req_id << " scheduled twice";
    ASSERT_GT(sr.num_scheduled_tokens, 0);
    total += sr.num_scheduled_tokens;
    const Request* r = s.find(sr.req_id);
    ASSERT_NE(r, nullptr);
    ASSERT_EQ(r->status, RequestStatus::kRunning);
    // Blocks cover every scheduled position.
    const int bs = c.block_size;
    ASSERT_GE(static_cast<int>(s.kv_cache().block_ids(sr.req_id).size()) * bs, r->num_computed_tokens);
    ASSERT_LE(r->num_computed_tokens, c.max_model_len);
  }
  ASSERT_EQ(total, so.total_num_scheduled_tokens);
  for (const auto& id : so.preempted_req_ids) {
    ASSERT_EQ(seen.count(id), 0u) << id << " preempted and scheduled in one step";
    ASSERT_FALSE(s.kv_cache().has_blocks(id));
  }
}

void run_property(uint64_t seed, int steps, bool prefix_caching, int num_speculative_tokens) {
  std::mt19937_64 rng(seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };

  SchedulerConfig c;
  c.block_size = 4;
  c.num_blocks = 24;  // ~96 tokens for up to 6 sequences of up to 48: constant pressure
  c.max_num_batched_tokens = 24;
  c.max_num_seqs = 6;
  c.max_model_len = 48;
  c.enable_prefix_caching = prefix_caching;
  c.num_speculative_tokens = num_speculative_tokens;
  Scheduler s(c);

  // A few shared prefixes so that prompts hit the prefix cache.
  std::vector<std::vector<int32_t>> prefixes;
  for (int i = 0; i < 4; ++i) prefixes.push_back(testing::iota_tokens(uni(4, 20), 1000 * (i + 1)));

  Tally tally;
  std::set<std::string> added, live;
  int next_id = 0;
  auto record = [&](const std::string& id) {
    tally.finished[id] += 1;
    live.erase(id);
  };

  for (int step = 0; step < steps; ++step) {
    // Arrivals.
    const int arrivals = step < steps - 200 ? uni(0, 2) * (uni(0, 3) == 0) : 0;  // quiet at the end
    for (int a = 0; a < arrivals; ++a) {
      std::vector<int32_t> prompt = uni(0, 2) ? prefixes[uni(0, 3)] : std::vector<int32_t>{};
      const int extra = uni(1, 12);
      for (int i = 0; i < extra; ++i) prompt.push_back(uni(0, 50));
      if (static_cast<int>(prompt.size()) > c.max_model_len - 2) prompt.resize(c.max_model_len - 2);
      const int max_tokens = uni(1, c.max_model_len - static_cast<int>(prompt.size()));
      std::string id = "r" + std::to_string(next_id++);
      auto r = testing::make_request(id, prompt, max_tokens);
      if (uni(0, 1)) r->eos_token_id = 3;
      s.add_request(std::move(r));
      added.insert(id);
      live.insert(id);
    }
    // Aborts (of live, finished and unknown ids alike).
    if (!live.empty() && uni(0, 9) == 0) {
      auto it = live.begin();
      std::advance(it, uni(0, static_cast<int>(live.size()) - 1));
      for (const auto& id : s.finish_requests({*it, "never-added"}, RequestStatus::kFinishedAborted)) record(id);
      s.kv_cache().check_invariants();
    }

    SchedulerOutput so = s.schedule();
    check_step(s, so);
    if (::testing::Test::HasFatalFailure()) return;

    // The fake runner: a request whose chunk reaches its end samples; drafts are accepted for a
    // random prefix.
    ModelRunnerOutput out;
    for (const auto& sr : so.scheduled) {
      const Request* r = s.find(sr.req_id);
      std::vector<int32_t> sampled;
      const int drafts = static_cast<int>(sr.spec_token_ids.size());
      if (r->num_computed_tokens >= r->num_tokens() + drafts) {
        const int accepted = drafts ? uni(0, drafts) : 0;
        for (int j = 0; j < accepted; ++j) sampled.push_back(sr.spec_token_ids[j]);
        sampled.push_back(uni(0, 60));
      } else {
        ASSERT_EQ(drafts, 0) << "drafts scheduled for a request still in prefill";
      }
      out.sampled_token_ids.push_back(sampled);
    }
    for (const EngineCoreOutput& o : s.update(so, out))
      if (is_finished(o.status)) record(o.req_id);
    s.kv_cache().check_invariants();

    // Drafts for some running requests; sometimes a stop-string-style finish from outside.
    for (const auto& id : std::vector<std::string>(live.begin(), live.end())) {
      const Request* r = s.find(id);
      if (!r) continue;
      if (num_speculative_tokens > 0 && r->status == RequestStatus::kRunning && r->num_output_tokens() > 0 && uni(0, 1)) {
        std::vector<int32_t> d;
        for (int j = uni(1, num_speculative_tokens); j > 0; --j) d.push_back(uni(0, 60));
        s.set_draft_tokens(id, d);
      }
      if (r->num_output_tokens() > 0 && uni(0, 200) == 0)
        for (const auto& e : s.finish_requests({id}, RequestStatus::kFinishedStopped)) record(e);
    }
  }
  // Drain.
  for (int guard = 0; s.has_unfinished_requests(); ++guard) {
    ASSERT_LT(guard, 10000) << "requests never finish";
    SchedulerOutput so = s.schedule();
    check_step(s, so);
    ModelRunnerOutput out;
    for (const auto& sr : so.scheduled) {
      const Request* r = s.find(sr.req_id);
      std::vector<int32_t> sampled;
      if (r->num_computed_tokens >= r->num_tokens() + static_cast<int>(sr.spec_token_ids.size()))
        sampled.push_back(uni(0, 60));
      out.sampled_token_ids.push_back(sampled);
    }
    for (const EngineCoreOutput& o : s.update(so, out))
      if (is_finished(o.status)) record(o.req_id);
  }

  EXPECT_EQ(s.kv_cache().num_free_blocks(), c.num_blocks) << "blocks leaked";
  EXPECT_EQ(s.kv_cache().num_tables(), 0u);
  EXPECT_TRUE(live.empty());
  EXPECT_EQ(tally.finished.size(), added.size()) << "requests lost";
  for (const auto& [id, times] : tally.finished) EXPECT_EQ(times, 1) << id << " finished " << times << " times";
  EXPECT_GT(s.stats().num_preemptions, 0) << "the test never preempted: make the pool smaller";
  if (prefix_caching) EXPECT_GT(s.kv_cache().prefix_cache_stats().hits, 0);
  if (num_speculative_tokens) EXPECT_GT(s.stats().spec_num_drafts, 0);
}

TEST(SchedulerProperty, BlocksAndRequestsAreConservedWithPrefixCaching) {
  for (uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE(seed);
    run_property(seed, 4000, true, 0);
  }
}

TEST(SchedulerProperty, BlocksAndRequestsAreConservedWithoutPrefixCaching) { run_property(7, 4000, false, 0); }

TEST(SchedulerProperty, BlocksAndRequestsAreConservedWithDraftTokens) {
  for (uint64_t seed : {11, 12}) {
    SCOPED_TRACE(seed);
    run_property(seed, 4000, true, 3);
  }
}

}  // namespace
}  // namespace specula
