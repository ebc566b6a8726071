#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>

#include "engine/scheduler.h"
#include "request_helpers.h"
#include "structured_output/compiled_grammar.h"
#include "structured_output/grammar_matcher.h"

namespace specula {
namespace {

using testing::iota_tokens;
using testing::make_request;

SchedulerConfig small_config(int budget, int max_seqs = 8, int num_blocks = 64, int block_size = 4) {
  SchedulerConfig c;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_seqs;
  c.max_model_len = 256;
  c.block_size = block_size;
  c.num_blocks = num_blocks;
  return c;
}

std::map<std::string, int> tokens_by_id(const SchedulerOutput& so) {
  std::map<std::string, int> m;
  for (const auto& s : so.scheduled) m[s.req_id] = s.num_scheduled_tokens;
  return m;
}

// A stand-in for the model runner: every request whose chunk reaches its last token samples one
// token (token = 7 unless `next` says otherwise).
ModelRunnerOutput run(const Scheduler& sched, const SchedulerOutput& so,
                      const std::function<int32_t(const Request&)>& next = nullptr) {
  ModelRunnerOutput out;
  for (const auto& s : so.scheduled) {
    const Request* r = sched.find(s.req_id);
    std::vector<int32_t> sampled;
    if (r && r->num_computed_tokens >= r->num_tokens()) sampled.push_back(next ? next(*r) : 7);
    out.sampled_token_ids.push_back(sampled);
  }
  return out;
}

TEST(Scheduler, SplitsLongPromptsAcrossStepsWithinTheBudget) {
  Scheduler s(small_config(8));
  s.add_request(make_request("a", iota_tokens(20)));
  auto so = s.schedule();
  EXPECT_EQ(tokens_by_id(so), (std::map<std::string, int>{{"a", 8}}));
  EXPECT_EQ(so.total_num_scheduled_tokens, 8);
  ASSERT_EQ(so.new_requests.size(), 1u);
  EXPECT_EQ(so.new_requests[0].block_ids.size(), 2u);  // 8 tokens, blocks of 4
  EXPECT_TRUE(s.update(so, run(s, so)).empty());        // a prefill chunk reports nothing

  s.add_request(make_request("b", iota_tokens(3, 100)));
  so = s.schedule();
  EXPECT_EQ(tokens_by_id(so), (std::map<std::string, int>{{"a", 8}}));  // budget used up: b waits
  EXPECT_EQ(so.scheduled[0].num_computed_tokens, 8);
  EXPECT_EQ(so.scheduled[0].new_block_ids.size(), 2u);
  s.update(so, run(s, so));

  so = s.schedule();  // a's last chunk (4) and b's whole prompt (3) in one step
  EXPECT_EQ(tokens_by_id(so), (std::map<std::string, int>{{"a", 4}, {"b", 3}}));
  auto outs = s.update(so, run(s, so));
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_EQ(outs[0].new_token_ids, std::vector<int32_t>{7});

  so = s.schedule();  // two decodes
  EXPECT_EQ(tokens_by_id(so), (std::map<std::string, int>{{"a", 1}, {"b", 1}}));
}

TEST(Scheduler, MixesChunkedPrefillWithDecodes) {
  Scheduler s(small_config(8));
  s.add_request(make_request("a", iota_tokens(4)));
  auto so = s.schedule();
  s.update(so, run(s, so));
  s.add_request(make_request("c", iota_tokens(30, 100)));
  // Each step: a decodes one token, c's prompt takes the remaining 7.
  for (int step = 0; step < 4; ++step) {
    so = s.schedule();
    EXPECT_EQ(so.scheduled[0].req_id, "a");
    EXPECT_EQ(so.scheduled[0].num_scheduled_tokens, 1);
    ASSERT_EQ(so.scheduled.size(), 2u);
    EXPECT_EQ(so.scheduled[1].req_id, "c");
    EXPECT_EQ(so.scheduled[1].num_scheduled_tokens, std::min(7, 30 - 7 * step));
    EXPECT_EQ(so.scheduled[1].num_computed_tokens, 7 * step);
    s.update(so, run(s, so));
  }
  so = s.schedule();
  EXPECT_EQ(tokens_by_id(so), (std::map<std::string, int>{{"a", 1}, {"c", 2}}));
}

TEST(Scheduler, RespectsMaxNumSeqs) {
  Scheduler s(small_config(64, /*max_seqs=*/2));
  s.add_request(make_request("a", iota_tokens(3), 2));
  s.add_request(make_request("b", iota_tokens(3, 10), 5));
  s.add_request(make_request("c", iota_tokens(3, 20), 5));
  auto so = s.schedule();
  EXPECT_EQ(tokens_by_id(so), (std::map<std::string, int>{{"a", 3}, {"b", 3}}));
  EXPECT_EQ(s.num_waiting(), 1);
  s.update(so, run(s, so));
  so = s.schedule();
  EXPECT_EQ(so.scheduled.size(), 2u);
  auto outs = s.update(so, run(s, so));  // a reaches max_tokens = 2
  EXPECT_EQ(outs[0].status, RequestStatus::kFinishedLength);
  so = s.schedule();
  EXPECT_EQ(tokens_by_id(so), (std::map<std::string, int>{{"b", 1}, {"c", 3}}));
  EXPECT_EQ(so.finished_req_ids, std::vector<std::string>{"a"});
}

TEST(Scheduler, FirstComeFirstServedWithoutOvertaking) {
  // 6 blocks of 4 tokens. a holds 4 blocks; b needs 3 and must wait; c (1 block) arrives later
  // and must not overtake b.
  Scheduler s(small_config(64, 8, /*num_blocks=*/6));
  s.add_request(make_request("a", iota_tokens(15), 1));
  auto so = s.schedule();
  s.add_request(make_request("b", iota_tokens(12, 100)));
  s.add_request(make_request("c", iota_tokens(2, 200)));
  s.update(so, run(s, so));  // a finishes (max_tokens 1) -> its blocks free up next step
  // Before a finished, b could not fit:
  Scheduler t(small_config(64, 8, 6));
  t.add_request(make_request("a", iota_tokens(15), 4));
  so = t.schedule();
  t.add_request(make_request("b", iota_tokens(12, 100)));
  t.add_request(make_request("c", iota_tokens(2, 200)));
  t.update(so, run(t, so));
  so = t.schedule();
  EXPECT_EQ(tokens_by_id(so), (std::map<std::string, int>{{"a", 1}}));  // c does not jump the queue
  EXPECT_EQ(t.num_waiting(), 2);
  // In s, a is gone, so b then c are admitted in order.
  so = s.schedule();
  ASSERT_EQ(so.scheduled.size(), 2u);
  EXPECT_EQ(so.scheduled[0].req_id, "b");
  EXPECT_EQ(so.scheduled[1].req_id, "c");
}

TEST(Scheduler, PreemptsTheLastAdmittedAndRecomputesIt) {
  // 4 blocks of 4 tokens; two requests of 7 prompt tokens take 2 blocks each. Decoding past 8
  // tokens needs a third block each: b (admitted last) is preempted so a can continue.
  Scheduler s(small_config(64, 8, /*num_blocks=*/4));
  s.add_request(make_request("a", iota_tokens(7), 6));
  s.add_request(make_request("b", iota_tokens(7, 100), 6));
  auto so = s.schedule();
  s.update(so, run(s, so));  // both: 8 tokens, 7 computed
  so = s.schedule();         // position 7 fits in block 2 for both
  EXPECT_EQ(so.scheduled.size(), 2u);
  s.update(so, run(s, so));  // 9 tokens, 8 computed: the next token needs a new block each
  so = s.schedule();
  EXPECT_EQ(so.preempted_req_ids, std::vector<std::string>{"b"});
  EXPECT_EQ(tokens_by_id(so), (std::map<std::string, int>{{"a", 1}}));
  EXPECT_EQ(s.stats().num_preemptions, 1);
  const Request* b = s.find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->status, RequestStatus::kPreempted);
  EXPECT_EQ(b->num_computed_tokens, 0);
  EXPECT_EQ(b->output_token_ids.size(), 2u);  // its output survives preemption
  EXPECT_FALSE(s.kv_cache().has_blocks("b"));
  EXPECT_EQ(s.num_waiting(), 1);
  s.update(so, run(s, so));

  // a runs to max_tokens = 6 while b waits; then b resumes: recomputes prompt + output.
  while (s.find("a")) {
    so = s.schedule();
    s.update(so, run(s, so));
  }
  so = s.schedule();
  ASSERT_EQ(so.new_requests.size(), 1u);
  EXPECT_EQ(so.new_requests[0].req_id, "b");
  EXPECT_EQ(so.new_requests[0].output_token_ids, (std::vector<int32_t>{7, 7}));
  // 9 tokens known. b's blocks were freed tail first, so a's new block evicted b's second block;
  // the prefix cache still serves its first block.
  EXPECT_EQ(so.scheduled[0].num_computed_tokens, 4);
  EXPECT_EQ(so.scheduled[0].num_scheduled_tokens, 5);
  s.kv_cache().check_invariants();
}

TEST(Scheduler, PreemptedRequestGoesBackToTheFrontOfTheQueue) {
  Scheduler s(small_config(64, 8, 4));
  s.add_request(make_request("a", iota_tokens(7), 20));
  s.add_request(make_request("b", iota_tokens(7, 100), 20));
  auto so = s.schedule();
  s.update(so, run(s, so));
  s.add_request(make_request("late", iota_tokens(2, 300), 2));
  so = s.schedule();
  s.update(so, run(s, so));
  so = s.schedule();  // b preempted
  ASSERT_EQ(so.preempted_req_ids, std::vector<std::string>{"b"});
  EXPECT_EQ(s.num_waiting(), 2);
  s.update(so, run(s, so));
  // Free everything from a: b (front) is admitted before "late".
  s.finish_requests({"a"}, RequestStatus::kFinishedAborted);
  so = s.schedule();
  ASSERT_GE(so.scheduled.size(), 1u);
  EXPECT_EQ(so.scheduled[0].req_id, "b");
}

TEST(Scheduler, StopConditions) {
  Scheduler s(small_config(64));
  auto eos = make_request("eos", iota_tokens(3), 10);
  eos->eos_token_id = 50;
  s.add_request(std::move(eos));
  auto stop = make_request("stop", iota_tokens(3, 10), 10);
  stop->stop_token_ids = {60};
  s.add_request(std::move(stop));
  SamplingParams p;
  p.min_tokens = 3;
  auto min = make_request("min", iota_tokens(3, 20), 10, p);
  min->eos_token_id = 50;
  s.add_request(std::move(min));
  auto len = make_request("len", iota_tokens(3, 30), 2);
  s.add_request(std::move(len));

  std::map<std::string, EngineCoreOutput> done;
  for (int step = 0; step < 6 && s.has_unfinished_requests(); ++step) {
    auto so = s.schedule();
    auto outs = s.update(so, run(s, so, [](const Request& r) -> int32_t {
      if (r.request_id == "eos" && r.num_output_tokens() == 1) return 50;
      if (r.request_id == "stop" && r.num_output_tokens() == 2) return 60;
      if (r.request_id == "min") return 50;  // eos every time; only counts from the 3rd token
      return 7;
    }));
    for (auto& o : outs)
      if (is_finished(o.status)) done[o.req_id] = o;
  }
  ASSERT_EQ(done.size(), 4u);
  EXPECT_EQ(done["eos"].status, RequestStatus::kFinishedStopped);
  EXPECT_TRUE(std::holds_alternative<std::monostate>(done["eos"].stop_reason));
  EXPECT_EQ(done["stop"].status, RequestStatus::kFinishedStopped);
  EXPECT_EQ(std::get<int32_t>(done["stop"].stop_reason), 60);
  EXPECT_EQ(done["min"].status, RequestStatus::kFinishedStopped);
  EXPECT_EQ(done["len"].status, RequestStatus::kFinishedLength);
  EXPECT_EQ(s.kv_cache().num_free_blocks(), 64);
}

TEST(Scheduler, StopsAtMaxModelLen) {
  SchedulerConfig c = small_config(64);
  c.max_model_len = 10;
  Scheduler s(c);
  s.add_request(make_request("r", iota_tokens(8), 100));
  int produced = 0;
  RequestStatus last = RequestStatus::kRunning;
  while (s.has_unfinished_requests()) {
    auto so = s.schedule();
    for (auto& o : s.update(so, run(s, so))) {
      produced += static_cast<int>(o.new_token_ids.size());
      last = o.status;
    }
  }
  EXPECT_EQ(produced, 2);
  EXPECT_EQ(last, RequestStatus::kFinishedLength);
}

TEST(Scheduler, VerifiesDraftTokensAndRollsBackRejectedOnes) {
  SchedulerConfig c = small_config(64);
  c.num_speculative_tokens = 3;
  Scheduler s(c);
  s.add_request(make_request("r", iota_tokens(5), 50));
  auto so = s.schedule();
  s.update(so, run(s, so));  // 6 tokens, 5 computed
  s.set_draft_tokens("r", {11, 12, 13});
  so = s.schedule();
  ASSERT_EQ(so.scheduled.size(), 1u);
  EXPECT_EQ(so.scheduled[0].num_scheduled_tokens, 4);  // the last sampled token + 3 drafts
  EXPECT_EQ(so.scheduled[0].spec_token_ids, (std::vector<int32_t>{11, 12, 13}));
  EXPECT_EQ(s.find("r")->num_computed_tokens, 9);
  // The first draft accepted, the second rejected: accepted 11, then the target's own token 20.
  ModelRunnerOutput out;
  out.sampled_token_ids = {{11, 20}};
  auto outs = s.update(so, out);
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].new_token_ids, (std::vector<int32_t>{11, 20}));
  const Request* r = s.find("r");
  EXPECT_EQ(r->num_tokens(), 8);
  EXPECT_EQ(r->num_computed_tokens, 7);  // 9 - 2 rejected drafts; token 20 is next to compute
  EXPECT_EQ(s.stats().spec_num_draft_tokens, 3);
  EXPECT_EQ(s.stats().spec_num_accepted_tokens, 1);
  so = s.schedule();  // no drafts: a plain decode of one token
  EXPECT_EQ(so.scheduled[0].num_scheduled_tokens, 1);
  EXPECT_TRUE(so.scheduled[0].spec_token_ids.empty());
}

// Structured outputs: drafts after the first one the grammar forbids are cut; the forbidden one
// is verified (always rejected there, its position drawn from the residual: lossless for sampled
// drafts), and the runner gets the grammar to mask the step's rows.
TEST(Scheduler, VerifiesTheFirstDraftTheGrammarForbidsAndCutsTheRest) {
  // {"a": digits} over a small byte vocabulary; token 22 is the end token.
  GrammarBuilder b;
  Sequence object = b.literal("{\"a\":");
  object.push_back(b.plus({b.bytes(ByteSet::range('0', '9'))}));
  const Sequence close = b.literal("}");
  object.insert(object.end(), close.begin(), close.end());
  std::vector<std::optional<std::string>> vocab;
  for (const char* t : {"{", "}", "\"", "a", ":", "0", "1", "9", "12", "{\"", "x"}) vocab.emplace_back(t);
  vocab.emplace_back("");  // 11: the end token
  auto grammar = std::make_shared<CompiledGrammar>(b.build(b.add("root", {object})), std::make_shared<TokenVocabulary>(vocab));

  SchedulerConfig c = small_config(64);
  c.num_speculative_tokens = 4;
  Scheduler s(c);
  auto req = make_request("r", iota_tokens(5), 50);
  req->grammar = std::make_unique<GrammarMatcher>(grammar, std::vector<int32_t>{11});
  s.add_request(std::move(req));
  auto so = s.schedule();
  EXPECT_NE(so.scheduled[0].grammar, nullptr);
  s.update(so, run(s, so, [](const Request&) { return 9; }));  // {"
  s.set_draft_tokens("r", {3, 10, 4, 5});                      // a x : 0 -- x is forbidden
  so = s.schedule();
  ASSERT_EQ(so.scheduled.size(), 1u);
  EXPECT_EQ(so.scheduled[0].spec_token_ids, (std::vector<int32_t>{3, 10}));
  EXPECT_EQ(so.scheduled[0].num_grammar_cut_drafts, 2);
  EXPECT_EQ(so.scheduled[0].num_scheduled_tokens, 3);
  EXPECT_EQ(so.scheduled[0].grammar, s.find("r")->grammar.get());
  EXPECT_EQ(s.find("r")->grammar->num_accepted(), 1);  // the masks are the runner's to compute
}

TEST(Scheduler, AsyncSchedulingPlansTheNextStepOnPlaceholders) {
  SchedulerConfig c = small_config(64);
  c.num_speculative_tokens = 3;
  Scheduler s(c);
  s.add_request(make_request("r", iota_tokens(5), 50));
  auto s1 = s.schedule();
  s.apply_counts(s1, StepCounts{{1}, {{kPlaceholderToken, kPlaceholderToken}}, 2});  // 1 token, 2 drafts
  EXPECT_EQ(s.find("r")->num_output_placeholders, 1);
  // Step 2 is planned before step 1's token is known: the placeholder and the two drafts.
  auto s2 = s.schedule();
  ASSERT_EQ(s2.scheduled.size(), 1u);
  EXPECT_EQ(s2.scheduled[0].num_computed_tokens, 5);
  EXPECT_EQ(s2.scheduled[0].num_scheduled_tokens, 3);
  EXPECT_EQ(s2.scheduled[0].spec_token_ids, (std::vector<int32_t>{kPlaceholderToken, kPlaceholderToken}));
  // Step 2 accepts one draft (2 tokens): the rejected draft's slot is rolled back at once.
  s.apply_counts(s2, StepCounts{{2}, {{}}, 0});
  EXPECT_EQ(s.find("r")->num_computed_tokens, 7);
  EXPECT_EQ(s.find("r")->num_output_placeholders, 3);
  // Step 1's value lands: one placeholder becomes token 40; counted once, not rolled back again.
  ModelRunnerOutput o1;
  o1.sampled_token_ids = {{40}};
  auto outs = s.update(s1, o1);
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].new_token_ids, (std::vector<int32_t>{40}));
  EXPECT_EQ(s.find("r")->num_output_placeholders, 2);
  EXPECT_EQ(s.find("r")->num_computed_tokens, 7);
  EXPECT_EQ(s.stats().spec_num_drafts, 0);
  ModelRunnerOutput o2;
  o2.sampled_token_ids = {{41, 42}};
  s.update(s2, o2);
  const Request* r = s.find("r");
  EXPECT_EQ(r->num_tokens(), 8);
  EXPECT_EQ(r->num_output_placeholders, 0);
  EXPECT_EQ(s.stats().spec_num_draft_tokens, 2);
  EXPECT_EQ(s.stats().spec_num_accepted_tokens, 1);
}

TEST(Scheduler, AsyncSchedulingDiscardsTheStepAfterALateStop) {
  Scheduler s(small_config(64));
  SamplingParams p;
  s.add_request(make_request("r", iota_tokens(5), 3, p));
  auto s1 = s.schedule();
  s.apply_counts(s1, StepCounts{{1}, {{}}, -1});
  auto s2 = s.schedule();  // planned before step 1's token is known
  ASSERT_EQ(s2.scheduled.size(), 1u);
  s.apply_counts(s2, StepCounts{{1}, {{}}, -1});
  // Step 1's token ends the request (a stop string, found by the output processor).
  ModelRunnerOutput o;
  o.sampled_token_ids = {{9}};
  EXPECT_EQ(s.update(s1, o).size(), 1u);
  EXPECT_EQ(s.finish_requests({"r"}, RequestStatus::kFinishedStopped), (std::vector<std::string>{"r"}));
  EXPECT_EQ(s.kv_cache().usage(), 0.0);
  // Step 2's token for it is discarded; the runner hears of the finish with the next step.
  EXPECT_TRUE(s.update(s2, o).empty());
  EXPECT_EQ(s.stats().generation_tokens, 1);
  s.add_request(make_request("q", iota_tokens(4, 50), 3, p));
  EXPECT_EQ(s.schedule().finished_req_ids, (std::vector<std::string>{"r"}));
}

TEST(Scheduler, AsyncSchedulingDoesNotScheduleAStepPastMaxTokens) {
  Scheduler s(small_config(64));
  s.add_request(make_request("r", iota_tokens(5), 2));
  auto s1 = s.schedule();
  s.apply_counts(s1, StepCounts{{1}, {{}}, -1});
  auto s2 = s.schedule();
  s.apply_counts(s2, StepCounts{{1}, {{}}, -1});
  // Two tokens on their way = max_tokens: no third step, whatever their values.
  EXPECT_TRUE(s.schedule().empty());
}

// Under async scheduling a request can finish while every other running request waits on the
// step in flight, so the next schedule() has nothing to run; the runner never sees that output,
// and the finished id must reach it with the next one, or its state (and a proposer's, which
// counts against max_num_seqs) outlives the request.
TEST(Scheduler, AnOutputThatSchedulesNothingKeepsTheFinishedIdsForTheNext) {
  Scheduler s(small_config(64));
  SamplingParams p;
  s.add_request(make_request("a", iota_tokens(5), 8, p));
  s.add_request(make_request("b", iota_tokens(5, 50), 1, p));
  auto s1 = s.schedule();
  s.apply_counts(s1, StepCounts{{1, 1}, {{}, {}}, -1});
  // b's one token is on its way, which ends it: only a is scheduled.
  auto s2 = s.schedule();
  ASSERT_EQ(tokens_by_id(s2), (std::map<std::string, int>{{"a", 1}}));
  s.apply_counts(s2, StepCounts{{1}, {{}}, -1});
  // Step 1's values: a stops on a stop string, b ends on length.
  ModelRunnerOutput o;
  o.sampled_token_ids = {{9}, {9}};
  EXPECT_EQ(s.update(s1, o).size(), 2u);
  EXPECT_EQ(s.finish_requests({"a"}, RequestStatus::kFinishedStopped), (std::vector<std::string>{"a"}));
  EXPECT_TRUE(s.schedule().empty());  // nothing left to run while step 2 is in flight
  s.add_request(make_request("c", iota_tokens(4, 90), 3, p));
  auto s3 = s.schedule();
  ASSERT_FALSE(s3.empty());
  std::vector<std::string> finished = s3.finished_req_ids;
  std::sort(finished.begin(), finished.end());
  EXPECT_EQ(finished, (std::vector<std::string>{"a", "b"}));
}

TEST(Scheduler, AbortFreesBlocksAndTellsTheRunner) {
  Scheduler s(small_config(64));
  s.add_request(make_request("a", iota_tokens(9)));
  s.add_request(make_request("w", iota_tokens(9, 50)));
  auto so = s.schedule();
  s.update(so, run(s, so));
  EXPECT_EQ(s.finish_requests({"a", "nope"}, RequestStatus::kFinishedAborted), std::vector<std::string>{"a"});
  EXPECT_EQ(s.find("a"), nullptr);
  EXPECT_FALSE(s.kv_cache().has_blocks("a"));
  so = s.schedule();
  EXPECT_EQ(so.finished_req_ids, std::vector<std::string>{"a"});
  s.kv_cache().check_invariants();
}

TEST(Scheduler, SiblingsShareTheirPromptThroughThePrefixCache) {
  Scheduler s(small_config(64));
  s.add_request(make_request("p#0", iota_tokens(17)));
  s.add_request(make_request("p#1", iota_tokens(17)));
  auto so = s.schedule();
  // The second sibling hits the 4 full blocks the first registers in the same step.
  EXPECT_EQ(tokens_by_id(so), (std::map<std::string, int>{{"p#0", 17}, {"p#1", 1}}));
  EXPECT_EQ(s.find("p#1")->num_cached_tokens, 16);
  EXPECT_EQ(s.kv_cache().prefix_cache_stats().hits, 16);
}

}  // namespace
}  // namespace specula
