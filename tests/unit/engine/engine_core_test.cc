// The engine end to end (scheduler, model runner, sampler, output processor) over the fake model,
// whose logits depend on the whole context it reads back from the paged KV cache.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "engine/engine_core.h"
#include "sampling/sampler.h"
#include "engine_fakes.h"

namespace specula {
namespace {

using testing::FakeModel;
using testing::FakeTokenizer;

struct Choice {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::kNone;
};
struct Result {
  std::vector<Choice> choices;
  std::optional<std::string> error;
  std::optional<std::vector<std::optional<PositionLogprobs>>> prompt_logprobs;
  std::vector<PositionLogprobs> logprobs;  // choice 0
  int num_cached_tokens = 0;
  bool finished = false;
  std::optional<RequestTimes> times;  // on the final output
};

EngineCoreConfig core_config(int num_blocks = 256, int budget = 64, int max_seqs = 16) {
  EngineCoreConfig c;
  c.max_model_len = 256;
  c.max_num_seqs = max_seqs;
  c.max_num_batched_tokens = budget;
  c.block_size = 4;
  c.num_blocks = num_blocks;
  c.vocab_size = FakeTokenizer::kVocab;
  c.eos_token_ids = {FakeTokenizer::kEos};
  c.seed = 77;
  return c;
}

class TestEngine {
 public:
  explicit TestEngine(EngineCoreConfig c, float eos_bias = -100.0f)
      : backend_(make_cpu_backend(1)), model(*backend_, FakeTokenizer::kVocab, eos_bias),
        sampler_(make_cpu_sampler(*backend_)) {
    ModelRunnerConfig rc;
    rc.max_num_seqs = c.max_num_seqs;
    rc.max_num_batched_tokens = c.max_num_batched_tokens;
    rc.max_model_len = c.max_model_len;
    rc.block_size = c.block_size;
    rc.num_blocks = c.num_blocks;
    rc.num_speculative_tokens = c.num_speculative_tokens;
    runner = std::make_unique<ModelRunner>(model, *backend_, *sampler_, rc);
    core = std::make_unique<EngineCore>(c, *runner, tok);
  }

  void add(const std::string& id, std::vector<int32_t> prompt, SamplingParams p) {
    streams_[id] = std::make_shared<RequestStream>();
    core->add_request(NewRequest{id, std::move(prompt), p}, streams_[id]);
  }
  // Drains every stream into results; `between_steps` runs after each step (a proposer, aborts).
  void run(const std::function<void()>& between_steps = nullptr) {
    for (int guard = 0; core->step(); ++guard) {
      ASSERT_LT(guard, 100000);
      collect();
      if (between_steps) between_steps();
    }
    collect();
  }
  void collect() {
    for (auto& [id, stream] : streams_) {
      RequestOutput o;
      while (stream->pop(&o, std::chrono::milliseconds(0))) {
        Result& r = results[id];
        if (o.error) r.error = o.error;
        if (o.prompt_logprobs) r.prompt_logprobs = o.prompt_logprobs;
        r.num_cached_tokens = o.num_cached_tokens;
        r.finished = r.finished || o.finished;
        if (o.times) {
          EXPECT_TRUE(o.finished) << id << ": phase times before the final output";
          r.times = o.times;
        }
        for (ChoiceDelta& d : o.choices) {
          if (r.choices.size() <= static_cast<size_t>(d.index)) r.choices.resize(d.index + 1);
          Choice& c = r.choices[d.index];
          c.tokens.insert(c.tokens.end(), d.token_ids.begin(), d.token_ids.end());
          c.text += d.text;
          if (d.finish_reason != FinishReason::kNone) c.finish = d.finish_reason;
          if (d.index == 0) r.logprobs.insert(r.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
        }
      }
    }
  }
  void expect_all_blocks_free() const {
    const KVCacheManager& kv = core->scheduler().kv_cache();
    EXPECT_EQ(kv.num_free_blocks(), kv.num_blocks());
    EXPECT_EQ(kv.num_tables(), 0u);
    kv.check_invariants();
  }

 private:
  std::unique_ptr<Backend> backend_;

 public:
  FakeModel model;
  FakeTokenizer tok;

 private:
  std::unique_ptr<Sampler> sampler_;

 public:
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<EngineCore> core;
  std::map<std::string, Result> results;

 private:
  std::map<std::string, std::shared_ptr<RequestStream>> streams_;
};

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  return p;
}

std::vector<int32_t> prompt_of(int len, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back((i * 7 + salt * 13) % 60);
  return p;
}

TEST(EngineCore, GreedyTogetherEqualsAloneEqualsReference) {
  // 12 requests: varied lengths, some sharing prefixes, under a small budget (chunked prefill mixed
  // with decodes) and a small KV cache (preemption + recompute + prefix hits).
  std::vector<std::pair<std::vector<int32_t>, int>> reqs;
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> p = prompt_of(5 + (i * 11) % 37, i % 4);  // i % 4: shared prefixes
    reqs.push_back({p, 8 + (i * 5) % 20});
  }
  TestEngine together(core_config(/*num_blocks=*/40, /*budget=*/24, /*max_seqs=*/6));
  for (size_t i = 0; i < reqs.size(); ++i) together.add("r" + std::to_string(i), reqs[i].first, greedy(reqs[i].second));
  together.run();
  EXPECT_GT(together.core->scheduler().stats().num_preemptions, 0);
  EXPECT_GT(together.core->scheduler().kv_cache().prefix_cache_stats().hits, 0);
  together.expect_all_blocks_free();

  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::string id = "r" + std::to_string(i);
    TestEngine alone(core_config());
    alone.add(id, reqs[i].first, greedy(reqs[i].second));
    alone.run();
    const std::vector<int32_t> ref = together.model.reference_greedy(reqs[i].first, reqs[i].second);
    ASSERT_TRUE(together.results[id].finished) << id;
    EXPECT_EQ(together.results[id].choices[0].tokens, ref) << id;
    EXPECT_EQ(alone.results[id].choices[0].tokens, ref) << id;
    EXPECT_EQ(together.results[id].choices[0].finish, FinishReason::kLength);
    // Streamed text == the whole continuation detokenized at once.
    IncrementalDetokenizer whole(together.tok, true);
    std::string text;
    for (int32_t t : ref) text += whole.add(t);
    text += whole.flush();
    EXPECT_EQ(together.results[id].choices[0].text, text);
  }
}

// vLLM's request phase times ride on each final output, in order; every step's scheduled tokens
// land in one bucket of vllm:iteration_tokens_total.
TEST(EngineCore, PhaseTimesAndIterationTokensAreReported) {
  TestEngine e(core_config(/*num_blocks=*/40, /*budget=*/24, /*max_seqs=*/6));
  int prompt_tokens = 0, output_tokens = 0;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p = prompt_of(5 + i * 9, i);
    prompt_tokens += static_cast<int>(p.size());
    output_tokens += 6 + i;
    e.add("r" + std::to_string(i), p, greedy(6 + i));
  }
  e.run();
  for (int i = 0; i < 6; ++i) {
    const Result& r = e.results.at("r" + std::to_string(i));
    ASSERT_TRUE(r.times.has_value()) << i;
    EXPECT_GT(r.times->arrival, 0.0);
    EXPECT_LE(r.times->arrival, r.times->scheduled);
    EXPECT_LE(r.times->scheduled, r.times->first_token);
    EXPECT_LE(r.times->first_token, r.times->last_token);
  }
  const EngineMetrics m = e.core->metrics();
  ASSERT_EQ(m.iteration_tokens_buckets.size(), std::size(kIterationTokenBuckets) + 1);
  int64_t steps = 0;
  for (int64_t c : m.iteration_tokens_buckets) steps += c;
  EXPECT_GT(steps, 0);
  // Budget 24: no step lands past the 32 bucket; every token was scheduled once (the last sampled
  // token is never fed back), unless a preemption recomputed some.
  for (size_t b = 4; b < m.iteration_tokens_buckets.size(); ++b) EXPECT_EQ(m.iteration_tokens_buckets[b], 0) << b;
  if (e.core->scheduler().stats().num_preemptions == 0)
    EXPECT_EQ(m.iteration_tokens_sum, prompt_tokens + output_tokens - 6);
  else
    EXPECT_GT(m.iteration_tokens_sum, prompt_tokens + output_tokens - 6);
}

TEST(EngineCore, LogitBiasSteersGreedyAndSampledOutput) {
  TestEngine e(core_config());
  SamplingParams g = greedy(6);
  g.logit_bias = {{7, 1000.0f}};
  SamplingParams s;
  s.temperature = 1.0f;
  s.seed = 11;
  s.max_tokens = 6;
  s.logit_bias = {{9, 1000.0f}};
  e.add("g", prompt_of(10, 1), g);
  e.add("s", prompt_of(10, 2), s);
  e.run();
  EXPECT_EQ(e.results.at("g").choices[0].tokens, std::vector<int32_t>(6, 7));
  EXPECT_EQ(e.results.at("s").choices[0].tokens, std::vector<int32_t>(6, 9));
}

TEST(EngineCore, SeededSamplingIsReproducibleWhateverElseRuns) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.9f;
  p.seed = 4242;
  p.max_tokens = 24;
  const std::vector<int32_t> prompt = prompt_of(9, 1);
  TestEngine alone(core_config());
  alone.add("x", prompt, p);
  alone.run();

  TestEngine busy(core_config(/*num_blocks=*/30, /*budget=*/10, /*max_seqs=*/4));
  for (int i = 0; i < 6; ++i) {
    SamplingParams other;
    other.temperature = 0.8f;
    other.max_tokens = 20;
    other.presence_penalty = 0.5f;
    busy.add("o" + std::to_string(i), prompt_of(20 + i, i), other);
    if (i == 2) busy.add("x", prompt, p);
  }
  busy.run();
  ASSERT_EQ(alone.results["x"].choices[0].tokens.size(), 24u);
  EXPECT_EQ(busy.results["x"].choices[0].tokens, alone.results["x"].choices[0].tokens);
  // Not greedy: the sample differs from the greedy continuation.
  EXPECT_NE(alone.results["x"].choices[0].tokens, alone.model.reference_greedy(prompt, 24));
}

TEST(EngineCore, NChoicesHaveTheirOwnStreams) {
  SamplingParams p;
  p.n = 3;
  p.seed = 5;
  p.max_tokens = 12;
  TestEngine e(core_config());
  e.add("r", prompt_of(21, 2), p);
  e.run();
  const Result& r = e.results["r"];
  ASSERT_TRUE(r.finished);
  ASSERT_EQ(r.choices.size(), 3u);
  EXPECT_NE(r.choices[0].tokens, r.choices[1].tokens);
  EXPECT_NE(r.choices[1].tokens, r.choices[2].tokens);
  for (const Choice& c : r.choices) EXPECT_EQ(c.tokens.size(), 12u);
  // The siblings share the prompt: two of the three lookups hit its full blocks.
  EXPECT_EQ(e.core->scheduler().kv_cache().prefix_cache_stats().hits, 2 * 20);
  e.expect_all_blocks_free();

  TestEngine again(core_config());
  again.add("r", prompt_of(21, 2), p);
  again.run();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(again.results["r"].choices[i].tokens, r.choices[i].tokens);
}

// A test proposer: after every step, drafts for each running request taken from the reference
// greedy continuation, with every `wrong_every`-th draft deliberately wrong.
void propose(TestEngine& e, const std::map<std::string, std::vector<int32_t>>& prompts, int k, int wrong_every,
             int* counter) {
  Scheduler& s = e.core->scheduler();
  for (const auto& [id, prompt] : prompts) {
    const Request* r = s.find(id);
    if (!r || r->status != RequestStatus::kRunning || r->num_output_tokens() == 0) continue;
    std::vector<int32_t> drafts = e.model.reference_greedy(r->all_token_ids, k);
    for (int32_t& d : drafts)
      if (++*counter % wrong_every == 0) d = (d + 1) % 60;
    s.set_draft_tokens(id, drafts);
  }
}

TEST(EngineCore, VerifyingDraftsNeverChangesTheOutput) {
  for (bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "seeded sampling" : "greedy");
    SamplingParams p = greedy(30);
    if (sampled) {
      p.temperature = 1.0f;
      p.seed = 9;
    }
    std::map<std::string, std::vector<int32_t>> prompts;
    for (int i = 0; i < 5; ++i) prompts["r" + std::to_string(i)] = prompt_of(6 + 9 * i, i);

    TestEngine plain(core_config(64, 32, 8));
    for (auto& [id, prompt] : prompts) plain.add(id, prompt, p);
    plain.run();

    EngineCoreConfig c = core_config(64, 32, 8);
    c.num_speculative_tokens = 3;
    TestEngine spec(c);
    for (auto& [id, prompt] : prompts) spec.add(id, prompt, p);
    int counter = 0;
    spec.run([&] { propose(spec, prompts, 3, 4, &counter); });
    const SchedulerStats& st = spec.core->scheduler().stats();
    EXPECT_GT(st.spec_num_draft_tokens, 0);
    if (!sampled) {
      EXPECT_GT(st.spec_num_accepted_tokens, 0);
      EXPECT_LT(st.spec_num_accepted_tokens, st.spec_num_draft_tokens);
    }
    for (auto& [id, prompt] : prompts) {
      EXPECT_EQ(spec.results[id].choices[0].tokens, plain.results[id].choices[0].tokens) << id;
      EXPECT_EQ(spec.results[id].choices[0].tokens.size(), 30u);
    }
    spec.expect_all_blocks_free();
  }
}

TEST(EngineCore, EosStopsUnlessIgnoredAndMinTokensMasksIt) {
  // eos gets a big bias: it is the greedy choice after any context.
  TestEngine e(core_config(), /*eos_bias=*/+100.0f);
  e.add("stops", prompt_of(5, 0), greedy(10));
  SamplingParams ignore = greedy(10);
  ignore.ignore_eos = true;
  e.add("ignores", prompt_of(5, 1), ignore);
  SamplingParams min = greedy(10);
  min.min_tokens = 4;
  e.add("min", prompt_of(5, 2), min);
  e.run();
  const Choice& stops = e.results["stops"].choices[0];
  EXPECT_EQ(stops.tokens, std::vector<int32_t>{FakeTokenizer::kEos});
  EXPECT_EQ(stops.finish, FinishReason::kStop);
  EXPECT_EQ(stops.text, "");
  EXPECT_EQ(e.results["ignores"].choices[0].tokens.size(), 10u);
  EXPECT_EQ(e.results["ignores"].choices[0].finish, FinishReason::kLength);
  const Choice& m = e.results["min"].choices[0];
  ASSERT_EQ(m.tokens.size(), 5u);  // 4 masked, then eos
  for (int i = 0; i < 4; ++i) EXPECT_NE(m.tokens[i], FakeTokenizer::kEos);
  EXPECT_EQ(m.tokens[4], FakeTokenizer::kEos);
  e.expect_all_blocks_free();
}

TEST(EngineCore, StopStringFinishesTheSequenceInTheScheduler) {
  TestEngine e(core_config());
  const std::vector<int32_t> prompt = prompt_of(7, 3);
  const std::vector<int32_t> ref = e.model.reference_greedy(prompt, 20);
  const std::string ref_text = e.tok.decode(ref);
  // Stop on the text of the 5th..6th generated tokens.
  const std::string stop = e.tok.decode({ref[4], ref[5]});
  SamplingParams p = greedy(20);
  p.stop = {stop};
  e.add("r", prompt, p);
  e.run();
  const Choice& c = e.results["r"].choices[0];
  EXPECT_EQ(c.finish, FinishReason::kStop);
  EXPECT_EQ(c.text, ref_text.substr(0, ref_text.find(stop)));
  EXPECT_LE(c.tokens.size(), 6u);
  e.expect_all_blocks_free();
}

TEST(EngineCore, PromptLogprobsMatchTheModel) {
  TestEngine e(core_config(256, /*budget=*/8));  // chunked: prompt logprobs arrive in pieces
  const std::vector<int32_t> prompt = prompt_of(19, 1);
  SamplingParams p = greedy(3);
  p.prompt_logprobs = 2;
  p.logprobs = 1;
  e.add("r", prompt, p);
  e.run();
  const Result& r = e.results["r"];
  ASSERT_TRUE(r.prompt_logprobs.has_value());
  ASSERT_EQ(r.prompt_logprobs->size(), prompt.size());
  EXPECT_FALSE((*r.prompt_logprobs)[0].has_value());
  for (size_t i = 1; i < prompt.size(); ++i) {
    std::vector<float> l = e.model.logits_for(std::vector<int32_t>(prompt.begin(), prompt.begin() + i));
    double m = *std::max_element(l.begin(), l.end()), s = 0;
    for (float x : l) s += std::exp(x - m);
    const double expected = l[prompt[i]] - m - std::log(s);
    ASSERT_TRUE((*r.prompt_logprobs)[i].has_value()) << i;
    EXPECT_EQ((*r.prompt_logprobs)[i]->chosen.token_id, prompt[i]);
    EXPECT_NEAR((*r.prompt_logprobs)[i]->chosen.logprob, expected, 1e-4) << i;
    EXPECT_EQ((*r.prompt_logprobs)[i]->top.size(), 2u);
  }
  ASSERT_EQ(r.logprobs.size(), 3u);
  EXPECT_EQ(r.logprobs[0].chosen.rank, 1);  // greedy picks the most likely token
}

TEST(EngineCore, AStepThatThrowsFailsItsRequestsAndTheEngineCarriesOn) {
  TestEngine e(core_config());
  e.model.fail_on_forward = [](int n) { return n == 3; };
  e.add("a", prompt_of(5, 0), greedy(10));
  e.add("b", prompt_of(6, 1), greedy(10));
  int steps = 0;
  e.run([&] {
    if (++steps == 3) e.add("c", prompt_of(7, 2), greedy(5));  // right after the failed step
  });
  ASSERT_TRUE(e.results["a"].error.has_value());
  EXPECT_NE(e.results["a"].error->find("injected failure"), std::string::npos);
  EXPECT_TRUE(e.results["b"].error.has_value());
  EXPECT_FALSE(e.results["c"].error.has_value());
  ASSERT_EQ(e.results["c"].choices.size(), 1u);
  EXPECT_EQ(e.results["c"].choices[0].tokens, e.model.reference_greedy(prompt_of(7, 2), 5));
  e.expect_all_blocks_free();
  // The runner dropped the failed requests' state (told by the next step's finished ids).
  EXPECT_FALSE(e.runner->has_request_state("a"));
  EXPECT_FALSE(e.runner->has_request_state("b"));
}

// Under async scheduling a step's outputs are processed while the next step runs; an error there
// (a bug in the loop, which the threaded engine answers by failing every request) must leave the
// next step in flight, so that the step after it collects its own output, not that one's.
TEST(EngineCore, AnErrorProcessingAStepLeavesTheNextInFlight) {
  EngineCoreConfig c = core_config();
  c.async_scheduling = true;
  TestEngine e(c);
  int decoded = 0;
  e.tok.on_token_bytes = [&](int32_t) {
    if (++decoded == 4) throw Error("injected detokenizer failure");
  };
  e.add("a", prompt_of(5, 0), greedy(10));
  int errors = 0;
  for (int guard = 0; guard < 1000; ++guard) {
    try {
      if (!e.core->step()) break;
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("injected"), std::string::npos);
      ++errors;
      e.core->fail_all("engine error");  // as the threaded engine does
      e.add("b", prompt_of(7, 2), greedy(6));
    }
    e.collect();
  }
  e.collect();
  EXPECT_EQ(errors, 1);
  EXPECT_TRUE(e.results["a"].error.has_value());
  ASSERT_FALSE(e.results["b"].error.has_value()) << *e.results["b"].error;
  ASSERT_EQ(e.results["b"].choices.size(), 1u);
  EXPECT_EQ(e.results["b"].choices[0].tokens, e.model.reference_greedy(prompt_of(7, 2), 6));
  e.expect_all_blocks_free();
}

TEST(EngineCore, AbortFreesBlocksAndEndsTheStream) {
  TestEngine e(core_config());
  e.add("a", prompt_of(9, 0), greedy(100));
  e.add("b", prompt_of(9, 1), greedy(6));
  int steps = 0;
  e.run([&] {
    if (++steps == 3) e.core->abort("a");
  });
  EXPECT_TRUE(e.results["a"].finished);
  EXPECT_EQ(e.results["a"].choices[0].finish, FinishReason::kAbort);
  EXPECT_EQ(e.results["b"].choices[0].tokens.size(), 6u);
  e.expect_all_blocks_free();
}

TEST(EngineCore, ValidatesRequests) {
  TestEngine e(core_config());
  auto stream = std::make_shared<RequestStream>();
  SamplingParams p = greedy(200);
  try {
    e.core->add_request(NewRequest{"long", prompt_of(100, 0), p}, stream);
    FAIL() << "expected an error";
  } catch (const Error& err) {
    const std::string msg = err.what();
    EXPECT_NE(msg.find("256"), std::string::npos) << msg;
    EXPECT_NE(msg.find("300"), std::string::npos) << msg;
  }
  EXPECT_THROW(e.core->add_request(NewRequest{"empty", {}, greedy(1)}, stream), Error);
  SamplingParams bad;
  bad.top_p = 1.5f;
  try {
    e.core->add_request(NewRequest{"bad", {1}, bad}, stream);
    FAIL();
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("top_p"), std::string::npos);
  }
  EXPECT_THROW(e.core->add_request(NewRequest{"oov", {1, 999}, greedy(1)}, stream), Error);
  EXPECT_FALSE(e.core->has_unfinished_requests());
}

TEST(EngineCore, DefaultMaxTokensRunsToMaxModelLen) {
  EngineCoreConfig c = core_config();
  c.max_model_len = 40;
  TestEngine e(c);
  SamplingParams p;
  p.temperature = 0.0f;
  e.add("r", prompt_of(30, 0), p);
  e.run();
  EXPECT_EQ(e.results["r"].choices[0].tokens.size(), 10u);
  EXPECT_EQ(e.results["r"].choices[0].finish, FinishReason::kLength);
}

}  // namespace
}  // namespace specula
