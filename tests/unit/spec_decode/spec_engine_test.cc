// Speculative decoding through the engine (scheduler, model runner, rejection sampler, proposer)
// over the fake model, whose logits depend on the whole context it reads back from the paged KV
// cache. The draft is a ContextModel with its own paged cache, so a wrong draft block table, slot
// or catch-up changes its drafts or trips its own consistency check.
#include <gtest/gtest.h>

#include <map>

#include "engine/engine_core.h"
#include "sampling/sampler.h"
#include "sampling/sampling_math.h"
#include "unit/engine/engine_fakes.h"
#include "spec_decode/draft_model_proposer.h"
#include "spec_decode/ngram_proposer.h"
#include "engine/spec_decoding_log.h"
#include "spec_decode/adaptive_speculator.h"
#include "unit/spec_decode/spec_fakes.h"

namespace specula {
namespace {

using testing::ContextModel;
using testing::FakeModel;
using testing::FakeTokenizer;

enum class Method { kNone, kDraft, kNgram };

struct SpecOptions {
  Method method = Method::kNone;
  int k = 3;
  bool adaptive = false;
  double draft_noise = 0.0;  // 0: the draft is the target itself
  int draft_max_model_len = 0;
  std::function<int(int)> pad_batch;
  bool chain_drafts = true;
  bool async_scheduling = false;
};

struct Choice {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  StopReason stop;
  std::vector<PositionLogprobs> logprobs;
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

class SpecEngine {
 public:
  SpecEngine(EngineCoreConfig c, const SpecOptions& o)
      : backend_(make_cpu_backend(1)), model(*backend_), sampler_(make_cpu_sampler(*backend_)) {
    if (o.method != Method::kNone) c.num_speculative_tokens = o.k;
    c.async_scheduling = o.async_scheduling;
    ModelRunnerConfig rc;
    rc.max_num_seqs = c.max_num_seqs;
    rc.max_num_batched_tokens = c.max_num_batched_tokens;
    rc.max_model_len = c.max_model_len;
    rc.block_size = c.block_size;
    rc.num_blocks = c.num_blocks;
    rc.num_speculative_tokens = c.num_speculative_tokens;
    runner = std::make_unique<ModelRunner>(model, *backend_, *sampler_, rc);
    std::unique_ptr<Proposer> proposer;
    if (o.method == Method::kDraft) {
      auto draft = std::make_unique<ContextModel>(
          FakeTokenizer::kVocab, o.draft_noise > 0 ? testing::noisy_logits(model, o.draft_noise)
                                                   : ContextModel::LogitsFn([this](const std::vector<int32_t>& ctx) {
                                                       return model.logits_for(ctx);
                                                     }));
      draft_model = draft.get();
      DraftModelProposerConfig dc;
      dc.num_speculative_tokens = o.k;
      dc.max_num_seqs = c.max_num_seqs;
      dc.max_num_batched_tokens = c.max_num_batched_tokens;
      dc.max_model_len = c.max_model_len;
      dc.draft_max_model_len = o.draft_max_model_len > 0 ? o.draft_max_model_len : c.max_model_len;
      dc.pad_batch = o.pad_batch;
      dc.chain_drafts = o.chain_drafts;
      auto p = std::make_unique<DraftModelProposer>(std::move(draft), *backend_, make_cpu_draft_sampler(*backend_), dc);
      p->allocate_kv_cache(c.num_blocks, c.block_size);
      draft_proposer = p.get();
      proposer = std::move(p);
    } else if (o.method == Method::kNgram) {
      proposer = std::make_unique<NgramProposer>(1, 3);
    }
    if (proposer) {
      speculator = std::make_unique<AdaptiveSpeculator>(std::move(proposer), AdaptiveSpeculatorConfig{o.k, o.adaptive});
      runner->set_speculator(speculator.get());
      c.spec_adaptive = o.adaptive;
    }
    core = std::make_unique<EngineCore>(c, *runner, tok);
  }

  void add(const std::string& id, std::vector<int32_t> prompt, SamplingParams p) {
    streams_[id] = std::make_shared<RequestStream>();
    core->add_request(NewRequest{id, std::move(prompt), p}, streams_[id]);
  }
  void run() {
    for (int guard = 0; core->step(); ++guard) ASSERT_LT(guard, 100000);
    for (auto& [id, stream] : streams_) {
      RequestOutput o;
      while (stream->pop(&o, std::chrono::milliseconds(0))) {
        ASSERT_FALSE(o.error.has_value()) << *o.error;
        for (ChoiceDelta& d : o.choices) {
          auto& choices = results[id];
          if (choices.size() <= static_cast<size_t>(d.index)) choices.resize(d.index + 1);
          Choice& ch = choices[d.index];
          ch.tokens.insert(ch.tokens.end(), d.token_ids.begin(), d.token_ids.end());
          ch.text += d.text;
          ch.logprobs.insert(ch.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
          if (d.finish_reason != FinishReason::kNone) {
            ch.finish = d.finish_reason;
            ch.stop = d.stop_reason;
          }
        }
      }
    }
  }
  const std::vector<int32_t>& tokens(const std::string& id, int choice = 0) { return results[id].at(choice).tokens; }
  const SchedulerStats& stats() const { return core->scheduler().stats(); }
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
  std::unique_ptr<Speculator> speculator;
  DraftModelProposer* draft_proposer = nullptr;
  ContextModel* draft_model = nullptr;
  std::unique_ptr<EngineCore> core;
  std::map<std::string, std::vector<Choice>> results;

 private:
  std::map<std::string, std::shared_ptr<RequestStream>> streams_;
};

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  return p;
}

SamplingParams seeded(int max_tokens, uint64_t seed) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = seed;
  p.max_tokens = max_tokens;
  return p;
}

std::vector<int32_t> prompt_of(int len, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back((i * 7 + salt * 13) % 60);
  return p;
}

// 12 requests of varied lengths, some sharing prefixes, under a small token budget (chunked
// prefill mixed with decodes and verifications) and a small KV cache (preemption, prefix hits).
std::vector<std::pair<std::vector<int32_t>, int>> mixed_requests() {
  std::vector<std::pair<std::vector<int32_t>, int>> reqs;
  for (int i = 0; i < 12; ++i) reqs.push_back({prompt_of(5 + (i * 11) % 37, i % 4), 8 + (i * 5) % 20});
  return reqs;
}

void expect_greedy_identical(const SpecOptions& o, int num_blocks, int budget, int max_seqs) {
  const auto reqs = mixed_requests();
  SpecEngine e(core_config(num_blocks, budget, max_seqs), o);
  for (size_t i = 0; i < reqs.size(); ++i) e.add("r" + std::to_string(i), reqs[i].first, greedy(reqs[i].second));
  e.run();
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::string id = "r" + std::to_string(i);
    EXPECT_EQ(e.tokens(id), e.model.reference_greedy(reqs[i].first, reqs[i].second)) << id;
    EXPECT_EQ(e.results[id][0].finish, FinishReason::kLength) << id;
  }
  EXPECT_GT(e.stats().spec_num_draft_tokens, 0);
  EXPECT_GT(e.stats().num_preemptions, 0);
  EXPECT_GT(e.core->scheduler().kv_cache().prefix_cache_stats().hits, 0);
  if (o.method == Method::kDraft) {
    EXPECT_GT(e.stats().spec_num_accepted_tokens, 0);
    if (o.draft_noise > 0) EXPECT_LT(e.stats().spec_num_accepted_tokens, e.stats().spec_num_draft_tokens);
  }
  e.expect_all_blocks_free();
}

TEST(SpecEngine, GreedyDraftModelIsTokenForTokenThePlainOutput) {
  for (int k : {1, 3, 5}) {
    SCOPED_TRACE("k=" + std::to_string(k));
    SpecOptions o;
    o.method = Method::kDraft;
    o.k = k;
    o.draft_noise = 0.3;
    expect_greedy_identical(o, /*num_blocks=*/32, /*budget=*/24, /*max_seqs=*/6);
  }
}

TEST(SpecEngine, GreedyNgramIsTokenForTokenThePlainOutput) {
  SpecOptions o;
  o.method = Method::kNgram;
  o.k = 4;
  expect_greedy_identical(o, 32, 24, 6);
}

// An ngram match near the end of the text is followed by fewer than k tokens, so the last
// positions may never be drafted; the metrics still list every position up to k (vLLM's shape),
// so that a log or /metrics reader sees k positions, the undrafted ones at 0.
TEST(SpecEngine, MetricsListEveryPositionUpToKWhenFewerWereDrafted) {
  SpecOptions o;
  o.method = Method::kNgram;
  o.k = 8;
  const auto reqs = mixed_requests();
  SpecEngine e(core_config(32, 24, 6), o);
  for (size_t i = 0; i < reqs.size(); ++i) e.add("r" + std::to_string(i), reqs[i].first, greedy(reqs[i].second));
  e.run();
  const EngineMetrics m = e.core->metrics();
  ASSERT_GT(m.spec_num_drafts, 0);
  EXPECT_LT(m.spec_num_draft_tokens, static_cast<int64_t>(o.k) * m.spec_num_drafts);  // some drafts were short
  EXPECT_EQ(m.spec_accepted_per_pos.size(), 8u);
  EXPECT_EQ(m.spec_num_speculative_tokens, 8);
}

TEST(SpecEngine, PaddedDraftStepsAndAdaptiveDepthChangeNothing) {
  SpecOptions o;
  o.method = Method::kDraft;
  o.draft_noise = 0.3;
  o.pad_batch = [](int n) { return std::min(6, (n + 3) / 4 * 4); };  // capture sizes 4, 6
  expect_greedy_identical(o, 32, 24, 6);
  o.adaptive = true;
  o.pad_batch = nullptr;
  const auto reqs = mixed_requests();
  SpecEngine e(core_config(32, 24, 6), o);
  for (size_t i = 0; i < reqs.size(); ++i) e.add("r" + std::to_string(i), reqs[i].first, greedy(reqs[i].second));
  e.run();
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(e.tokens("r" + std::to_string(i)), e.model.reference_greedy(reqs[i].first, reqs[i].second));
  EXPECT_GT(e.core->metrics().spec_depth_steps, 0);
  e.expect_all_blocks_free();
}

// A draft that disagrees with the target now and then (noise 0.3), k drafts, draft steps padded to
// the capture sizes 4 and 6.
SpecOptions noisy_padded_draft(int k) {
  SpecOptions o;
  o.method = Method::kDraft;
  o.k = k;
  o.draft_noise = 0.3;
  o.pad_batch = [](int n) { return std::min(6, (n + 3) / 4 * 4); };
  return o;
}

void add_greedy(SpecEngine& e, const std::vector<std::pair<std::vector<int32_t>, int>>& reqs) {
  for (size_t i = 0; i < reqs.size(); ++i) e.add("r" + std::to_string(i), reqs[i].first, greedy(reqs[i].second));
}

// The same drafts verified and accepted, position by position.
void expect_same_drafting(const SchedulerStats& a, const SchedulerStats& b) {
  EXPECT_GT(a.spec_num_draft_tokens, 0);
  EXPECT_EQ(a.spec_num_drafts, b.spec_num_drafts);
  EXPECT_EQ(a.spec_num_draft_tokens, b.spec_num_draft_tokens);
  EXPECT_EQ(a.spec_num_accepted_tokens, b.spec_num_accepted_tokens);
  EXPECT_EQ(a.spec_accepted_per_pos, b.spec_accepted_per_pos);
}

// The greedy chain (drafts argmax'd into the next draft step's input without visiting the host)
// drafts exactly what the draft sampler drafts step by step: same tokens, same drafts and
// acceptance per position, through chunked prefill, preemption, prefix hits, padded steps and
// requests whose drafts stop early (max_tokens). Rows the argmax would not serve (a penalty, a
// sampled row) keep every step of their batch on the draft sampler.
// The mixed requests (`params` gives request i's settings) through the noisy padded draft at k,
// with its drafts chained and step by step: the same tokens, the same drafting per position.
// chains(e) is how many chains of the kind under test the engine ran.
void expect_chain_drafts_what_the_sampler_drafts(int k, bool async,
                                                 const std::function<SamplingParams(size_t i, int max_tokens)>& params,
                                                 const std::function<int64_t(const SpecEngine&)>& chains) {
  const auto reqs = mixed_requests();
  std::vector<SchedulerStats> stats;
  std::vector<std::vector<std::vector<int32_t>>> outputs;
  for (bool chain : {true, false}) {
    SpecOptions o = noisy_padded_draft(k);
    o.chain_drafts = chain;
    o.async_scheduling = async;
    SpecEngine e(core_config(32, 24, 6), o);
    for (size_t i = 0; i < reqs.size(); ++i) e.add("r" + std::to_string(i), reqs[i].first, params(i, reqs[i].second));
    e.run();
    if (chain) {
      EXPECT_GT(chains(e), 10);
    } else {
      EXPECT_EQ(chains(e), 0);
    }
    stats.push_back(e.stats());
    outputs.emplace_back();
    for (size_t i = 0; i < reqs.size(); ++i) outputs.back().push_back(e.tokens("r" + std::to_string(i)));
    e.expect_all_blocks_free();
  }
  EXPECT_EQ(outputs[0], outputs[1]);
  expect_same_drafting(stats[0], stats[1]);
  EXPECT_LT(stats[0].spec_num_accepted_tokens, stats[0].spec_num_draft_tokens);  // the draft is noisy
}

TEST(SpecEngine, GreedyChainDraftsWhatTheDraftSamplerDrafts) {
  for (int k : {1, 3, 5}) {
    SCOPED_TRACE("k=" + std::to_string(k));
    expect_chain_drafts_what_the_sampler_drafts(
        k, false, [](size_t, int max_tokens) { return greedy(max_tokens); },
        [](const SpecEngine& e) { return e.draft_proposer->num_greedy_chains(); });
  }
  for (bool penalised : {true, false}) {
    SpecOptions o;
    o.method = Method::kDraft;
    o.draft_noise = 0.3;
    SpecEngine e(core_config(), o);
    // b outlives a (at most 24 steps), so no step drafts for a alone.
    SamplingParams p = penalised ? greedy(200) : seeded(200, 5);
    p.ignore_eos = true;
    if (penalised) p.repetition_penalty = 1.3f;
    e.add("a", prompt_of(9, 1), greedy(24));
    e.add("b", prompt_of(13, 2), p);
    e.run();
    EXPECT_GT(e.stats().spec_num_draft_tokens, 0);
    EXPECT_EQ(e.draft_proposer->num_greedy_chains(), 0) << (penalised ? "penalised" : "sampled");
    if (penalised) EXPECT_EQ(e.draft_proposer->num_sampled_chains(), 0);
    EXPECT_EQ(e.tokens("a"), e.model.reference_greedy(prompt_of(9, 1), 24));
  }
}

// Sampled drafts chained on the device (each draft drawn there from the request's (seed,
// position) draw, q kept in the store) draft exactly what the draft sampler draws step by step:
// the same tokens, the same drafts and acceptance per position, synchronous and async, through
// chunked prefill, preemption, prefix hits, padded steps, mixed greedy / sampled batches and
// max_tokens inside a draft. A penalised request keeps its batches on the step-by-step path.
TEST(SpecEngine, SampledChainDrawsWhatTheDraftSamplerDraws) {
  for (int k : {1, 3, 5}) {
    for (bool async : {false, true}) {
      SCOPED_TRACE("k=" + std::to_string(k) + (async ? " async" : ""));
      expect_chain_drafts_what_the_sampler_drafts(
          k, async,
          [](size_t i, int max_tokens) {
            SamplingParams p = i % 3 == 0 ? greedy(max_tokens) : seeded(max_tokens, 100 + i);
            if (i % 4 == 1) p.top_p = 0.9f;
            return p;
          },
          [](const SpecEngine& e) { return e.draft_proposer->num_sampled_chains(); });
    }
  }
  SpecOptions o = noisy_padded_draft(3);
  SpecEngine e(core_config(), o);
  SamplingParams p = seeded(40, 7);
  p.frequency_penalty = 0.5f;
  e.add("a", prompt_of(9, 1), seeded(40, 8));
  e.add("b", prompt_of(13, 2), p);
  e.run();
  EXPECT_GT(e.stats().spec_num_draft_tokens, 0);
  EXPECT_EQ(e.draft_proposer->num_sampled_chains(), 0) << "a penalised row's drafts depend on the drafts before them";
}

// Async scheduling: a greedy chain's drafts stay on the device until the next step is launched
// (fed into its inputs there, their values collected after), most launched ahead of the host's
// reading of the verification (README.md's launch-ahead), and change nothing: the reference
// tokens, and the same drafts and acceptance per position as the same async run drafting through
// the draft sampler (which leaves nothing on the device), through chunked prefill, preemption,
// prefix hits, padded steps and max_tokens inside a draft. (Against the synchronous engine the
// counts may differ here: async scheduling admits a request a step later when a seat frees on
// length, which with this small cache moves preemptions.) A batch the chain does not take (a
// penalised row) keeps its drafts on the host.
TEST(SpecEngine, DraftsLeftOnTheDeviceUnderAsyncSchedulingChangeNothing) {
  const auto reqs = mixed_requests();
  for (int k : {1, 3, 5}) {
    SCOPED_TRACE("k=" + std::to_string(k));
    std::vector<SchedulerStats> stats;
    for (bool chain : {true, false}) {
      SpecOptions o = noisy_padded_draft(k);
      o.async_scheduling = true;
      o.chain_drafts = chain;
      SpecEngine e(core_config(32, 24, 6), o);
      add_greedy(e, reqs);
      e.run();
      if (chain) {
        EXPECT_GT(e.runner->num_steps_with_drafts_on_device(), 10);
        // Most of them launched ahead of their verification's results (the drafts made from its
        // rows on the device): a wrong shift changes the drafts, hence the counts compared below.
        EXPECT_GT(e.runner->num_steps_launched_ahead(), 2);
      } else {
        EXPECT_EQ(e.runner->num_steps_with_drafts_on_device(), 0);
        EXPECT_EQ(e.runner->num_steps_launched_ahead(), 0);
      }
      stats.push_back(e.stats());
      for (size_t i = 0; i < reqs.size(); ++i)
        EXPECT_EQ(e.tokens("r" + std::to_string(i)), e.model.reference_greedy(reqs[i].first, reqs[i].second)) << i;
      e.expect_all_blocks_free();
    }
    EXPECT_GT(stats[0].num_preemptions, 0);
    EXPECT_EQ(stats[0].num_preemptions, stats[1].num_preemptions);
    expect_same_drafting(stats[0], stats[1]);
  }
  SpecOptions o;
  o.method = Method::kDraft;
  o.draft_noise = 0.3;
  o.async_scheduling = true;
  SpecEngine e(core_config(), o);
  SamplingParams p = greedy(200);
  p.ignore_eos = true;
  p.repetition_penalty = 1.3f;
  e.add("a", prompt_of(9, 1), greedy(24));
  e.add("b", prompt_of(13, 2), p);
  e.run();
  EXPECT_GT(e.stats().spec_num_draft_tokens, 0);
  EXPECT_EQ(e.runner->num_steps_with_drafts_on_device(), 0);
  EXPECT_EQ(e.tokens("a"), e.model.reference_greedy(prompt_of(9, 1), 24));
}

// The launch-ahead (README.md): in steady decoding nearly every step's drafts are launched from
// its verification's rows on the device before the host reads them, staged as if nothing were
// accepted and moved by what was. The tokens are the reference's and the drafts and acceptance
// per position are those of the synchronous engine and of the async one drafting through the
// sampler, at every k, with requests ending on max_tokens (those steps fall back: their next
// drafts depend on what they accept) and the draft's max_model_len close (its check too).
TEST(SpecEngine, DraftsLaunchedAheadOfTheVerificationChangeNothing) {
  std::vector<std::pair<std::vector<int32_t>, int>> reqs;
  for (int i = 0; i < 5; ++i) reqs.push_back({prompt_of(6 + 3 * i, i % 4), 60 + 7 * i});
  for (int k : {1, 2, 4}) {
    for (int draft_len : {0, 70}) {
      SCOPED_TRACE("k=" + std::to_string(k) + " draft_max_model_len=" + std::to_string(draft_len));
      std::vector<SchedulerStats> stats;
      for (int mode = 0; mode < 3; ++mode) {  // ahead, async through the sampler, synchronous
        SpecOptions o;
        o.method = Method::kDraft;
        o.k = k;
        o.draft_noise = 0.3;
        o.draft_max_model_len = draft_len;
        o.async_scheduling = mode < 2;
        o.chain_drafts = mode == 0;
        SpecEngine e(core_config(), o);
        add_greedy(e, reqs);
        e.run();
        if (mode == 0) {
          // Not launched ahead: a request's first drafting step, and steps near the end of one.
          const int64_t ahead = e.runner->num_steps_launched_ahead();
          const int64_t on_device = e.runner->num_steps_with_drafts_on_device();
          EXPECT_GT(3 * ahead, (draft_len == 0 ? 2 : 1) * on_device) << ahead << " of " << on_device;
        } else {
          EXPECT_EQ(e.runner->num_steps_launched_ahead(), 0);
        }
        for (size_t i = 0; i < reqs.size(); ++i)
          EXPECT_EQ(e.tokens("r" + std::to_string(i)), e.model.reference_greedy(reqs[i].first, reqs[i].second)) << i;
        stats.push_back(e.stats());
        e.expect_all_blocks_free();
      }
      EXPECT_GT(stats[0].spec_num_accepted_tokens, 0);
      expect_same_drafting(stats[0], stats[1]);
      expect_same_drafting(stats[0], stats[2]);
    }
  }
}

TEST(SpecEngine, DraftEqualToTargetAcceptsEveryDraft) {
  for (bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "sampled" : "greedy");
    SpecOptions o;
    o.method = Method::kDraft;
    o.k = 4;
    const auto reqs = mixed_requests();
    // Chunked prefill, preemption (the draft recomputes a resumed request) and prefix hits (the
    // draft recomputes what the target's cache served).
    SpecEngine e(core_config(32, 24, 6), o);
    for (size_t i = 0; i < reqs.size(); ++i)
      e.add("r" + std::to_string(i), reqs[i].first, sampled ? seeded(reqs[i].second, i) : greedy(reqs[i].second));
    e.run();
    EXPECT_GT(e.stats().spec_num_draft_tokens, 50);
    EXPECT_EQ(e.stats().spec_num_accepted_tokens, e.stats().spec_num_draft_tokens);
    EXPECT_GT(e.stats().num_preemptions, 0);
    e.expect_all_blocks_free();
  }
}

// Greedy draft-model speculation replayed without the engine: per step the draft proposes up to
// k tokens autoregressively from the true context and the target accepts them while they equal
// its argmax. Returns {drafted, accepted}.
std::pair<int64_t, int64_t> simulate(const FakeModel& target, const ContextModel::LogitsFn& draft,
                                     std::vector<int32_t> ctx, int max_tokens, int k) {
  auto argmax_of = [](const std::vector<float>& l) {
    return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  };
  int64_t drafted = 0, accepted = 0;
  int out = 0;
  ctx.push_back(argmax_of(target.logits_for(ctx)));  // the prefill step's token
  ++out;
  while (out < max_tokens) {
    const int n = std::min(k, max_tokens - out - 1);
    std::vector<int32_t> d, c = ctx;
    for (int j = 0; j < n; ++j) {
      d.push_back(argmax_of(draft(c)));
      c.push_back(d.back());
    }
    drafted += n;
    int j = 0;
    for (; j < n && d[j] == argmax_of(target.logits_for(ctx)); ++j) ctx.push_back(d[j]);
    accepted += j;
    ctx.push_back(argmax_of(target.logits_for(ctx)));
    out += j + 1;
  }
  return {drafted, accepted};
}

TEST(SpecEngine, DraftCacheRollsBackAfterRejections) {
  // Exactly the acceptance of an independent replay: the draft K/V written for rejected drafts
  // must never be read as context (else drafts, hence acceptance, would differ).
  for (double noise : {0.2, 0.5}) {
    SpecOptions o;
    o.method = Method::kDraft;
    o.k = 3;
    o.draft_noise = noise;
    SpecEngine e(core_config(), o);
    const std::vector<int32_t> prompt = prompt_of(11, 2);
    e.add("r", prompt, greedy(60));
    e.run();
    const auto [drafted, accepted] = simulate(e.model, testing::noisy_logits(e.model, noise), prompt, 60, 3);
    EXPECT_EQ(e.stats().spec_num_draft_tokens, drafted) << noise;
    EXPECT_EQ(e.stats().spec_num_accepted_tokens, accepted) << noise;
    EXPECT_GT(accepted, 0);
    EXPECT_LT(accepted, drafted);
    EXPECT_EQ(e.tokens("r"), e.model.reference_greedy(prompt, 60));
  }
}

TEST(SpecEngine, SeededSamplingIsReproducibleWhateverElseRuns) {
  // A seeded request's draws depend only on (seed, position). With deterministic drafts (ngram)
  // the tokens are the very tokens of a run without speculation, whatever the batch, budget
  // pressure and preemption. With a sampled draft model they depend on which positions were
  // drafted (not on the rest of the batch): the same with the depth pinned and room for the drafts.
  for (Method m : {Method::kDraft, Method::kNgram}) {
    SpecOptions o;
    o.method = m;
    o.draft_noise = 0.3;
    const std::vector<int32_t> prompt = prompt_of(9, 1);
    SamplingParams p = seeded(24, 4242);
    p.top_p = 0.9f;
    SpecEngine alone(core_config(), o);
    alone.add("x", prompt, p);
    alone.run();
    SpecEngine busy(m == Method::kNgram ? core_config(30, 10, 4) : core_config(256, 64, 8), o);
    for (int i = 0; i < 6; ++i) {
      SamplingParams other = seeded(20, 100 + i);
      other.temperature = 0.8f;
      other.presence_penalty = 0.5f;
      busy.add("o" + std::to_string(i), prompt_of(20 + i, i), other);
      if (i == 2) busy.add("x", prompt, p);
    }
    busy.run();
    ASSERT_EQ(alone.tokens("x").size(), 24u);
    EXPECT_EQ(busy.tokens("x"), alone.tokens("x"));
    if (m == Method::kNgram) {
      SpecEngine plain(core_config(), SpecOptions{});
      plain.add("x", prompt, p);
      plain.run();
      EXPECT_EQ(alone.tokens("x"), plain.tokens("x"));
    }
    busy.expect_all_blocks_free();
  }
}

TEST(SpecEngine, NChoicesWithSpeculation) {
  SpecOptions o;
  o.method = Method::kDraft;
  o.draft_noise = 0.3;
  const std::vector<int32_t> prompt = prompt_of(21, 2);
  SpecEngine g(core_config(), o);
  SamplingParams gp = greedy(12);
  gp.n = 3;
  g.add("g", prompt, gp);
  SamplingParams sp = seeded(12, 5);
  sp.n = 3;
  g.add("s", prompt, sp);
  g.run();
  ASSERT_EQ(g.results["g"].size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(g.tokens("g", i), g.model.reference_greedy(prompt, 12));
  ASSERT_EQ(g.results["s"].size(), 3u);
  EXPECT_NE(g.tokens("s", 0), g.tokens("s", 1));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(g.tokens("s", i).size(), 12u);
  EXPECT_GT(g.stats().spec_num_accepted_tokens, 0);
  g.expect_all_blocks_free();
  // The same sampled request alone: the same three choices.
  SpecEngine again(core_config(), o);
  again.add("s", prompt, sp);
  again.run();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(again.tokens("s", i), g.tokens("s", i));
}

TEST(SpecEngine, StopsInsideAnAcceptedRunAreExactlyAsWithoutSpeculation) {
  // The draft is the target: every step accepts k = 4 drafts, so stops land inside accepted runs.
  SpecOptions o;
  o.method = Method::kDraft;
  o.k = 4;
  const std::vector<int32_t> prompt = prompt_of(7, 3);
  SpecEngine probe(core_config(), SpecOptions{});
  const std::vector<int32_t> ref = probe.model.reference_greedy(prompt, 30);
  const std::string ref_text = probe.tok.decode(ref);

  std::map<std::string, SamplingParams> cases;
  cases["max_tokens"] = greedy(7);
  SamplingParams stop_str = greedy(30);
  stop_str.stop = {probe.tok.decode({ref[8], ref[9]})};
  cases["stop_string"] = stop_str;
  SamplingParams stop_str_incl = stop_str;
  stop_str_incl.include_stop_str_in_output = true;
  cases["stop_string_included"] = stop_str_incl;
  SamplingParams stop_tok = greedy(30);
  stop_tok.stop_token_ids = {ref[10]};
  cases["stop_token"] = stop_tok;
  SamplingParams min_tok = greedy(30);
  min_tok.stop_token_ids = {ref[2]};
  min_tok.min_tokens = 6;
  cases["min_tokens"] = min_tok;

  SpecEngine spec(core_config(), o), plain(core_config(), SpecOptions{});
  for (auto& [id, p] : cases) {
    spec.add(id, prompt, p);
    plain.add(id, prompt, p);
  }
  spec.run();
  plain.run();
  for (auto& [id, p] : cases) {
    const Choice& a = spec.results[id][0];
    const Choice& b = plain.results[id][0];
    EXPECT_EQ(a.tokens, b.tokens) << id;
    EXPECT_EQ(a.text, b.text) << id;
    EXPECT_EQ(a.finish, b.finish) << id;
    EXPECT_EQ(a.stop, b.stop) << id;
  }
  EXPECT_EQ(spec.results["max_tokens"][0].tokens, std::vector<int32_t>(ref.begin(), ref.begin() + 7));
  EXPECT_EQ(spec.results["stop_string"][0].text, ref_text.substr(0, ref_text.find(stop_str.stop[0])));
  EXPECT_EQ(spec.stats().spec_num_accepted_tokens, spec.stats().spec_num_draft_tokens);
  spec.expect_all_blocks_free();
}

TEST(SpecEngine, LogprobsOfAcceptedTokensAreReported) {
  for (bool sampled : {false, true}) {
    SpecOptions o;
    o.method = Method::kDraft;
    o.draft_noise = 0.3;
    SamplingParams p = sampled ? seeded(20, 3) : greedy(20);
    p.logprobs = 2;
    const std::vector<int32_t> prompt = prompt_of(13, 4);
    SpecEngine spec(core_config(), o);
    spec.add("r", prompt, p);
    spec.run();
    EXPECT_GT(spec.stats().spec_num_accepted_tokens, 0);
    const Choice& c = spec.results["r"][0];
    ASSERT_EQ(c.logprobs.size(), c.tokens.size());
    // Each token's logprob is the target's raw log_softmax at its position.
    std::vector<int32_t> ctx = prompt;
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      const std::vector<float> l = spec.model.logits_for(ctx);
      const PositionLogprobs ref = compute_logprobs(l, c.tokens[i], 2);
      EXPECT_EQ(c.logprobs[i].chosen.token_id, c.tokens[i]);
      EXPECT_NEAR(c.logprobs[i].chosen.logprob, ref.chosen.logprob, 1e-5) << i;
      EXPECT_EQ(c.logprobs[i].chosen.rank, ref.chosen.rank);
      ASSERT_EQ(c.logprobs[i].top.size(), 2u);
      EXPECT_EQ(c.logprobs[i].top[0].token_id, ref.top[0].token_id);
      ctx.push_back(c.tokens[i]);
    }
  }
}

TEST(SpecEngine, MetricsCountDraftsPerPositionAndTheLogLine) {
  SpecOptions o;
  o.method = Method::kDraft;
  o.k = 3;
  SpecEngine e(core_config(), o);
  // 13 tokens: the prefill's token, then 3 verifications of 3 accepted drafts + 1 token each.
  e.add("r", prompt_of(10, 1), greedy(13));
  SpecDecodingLog log;
  log.begin(e.core->metrics());
  e.run();
  const EngineMetrics m = e.core->metrics();
  EXPECT_EQ(m.spec_num_drafts, 3);
  EXPECT_EQ(m.spec_num_draft_tokens, 9);
  EXPECT_EQ(m.spec_num_accepted_tokens, 9);
  EXPECT_EQ(m.spec_accepted_per_pos, (std::vector<int64_t>{3, 3, 3}));
  EXPECT_EQ(m.spec_num_speculative_tokens, 3);
  EXPECT_EQ(m.generation_tokens_total, 13);
  EXPECT_EQ(m.spec_depth_steps, 4);  // every step chose a depth, the last one's drafts unused
  EXPECT_EQ(m.spec_depth_sum, 12);
  EXPECT_EQ(*log.interval_line(1.0, m),
            "SpecDecoding metrics: Mean acceptance length: 4.00, Accepted throughput: 9.00 tokens/s, Drafted "
            "throughput: 9.00 tokens/s, Accepted: 9 tokens, Drafted: 9 tokens, Per-position acceptance rate: 1.000, "
            "1.000, 1.000, Avg Draft acceptance rate: 100.0%, Mean speculative depth: 3.00 (k=3)");
  // Per drafting step: one catch-up forward that drafts the first token, then one per other
  // draft; nothing in the last step (the request could not use drafts any more).
  EXPECT_EQ(e.draft_proposer->num_forwards(), 3 * 3);
}

TEST(SpecEngine, PromptChunksGoThroughTheDraftAsThroughTheTarget) {
  SpecOptions o;
  o.method = Method::kDraft;
  SpecEngine e(core_config(256, /*budget=*/8), o);
  const std::vector<int32_t> prompt = prompt_of(37, 5);
  e.add("r", prompt, greedy(10));
  // Five prefill chunks of 8 tokens (the last samples the first token): after each, the draft has
  // computed exactly the positions the target has.
  for (int chunk = 0; chunk < 4; ++chunk) {
    ASSERT_TRUE(e.core->step());
    EXPECT_EQ(e.draft_proposer->num_computed("r"), 8 * (chunk + 1)) << chunk;
    EXPECT_EQ(e.core->scheduler().find("r")->num_computed_tokens, 8 * (chunk + 1));
  }
  const int forwards = e.draft_model->num_forwards;
  EXPECT_EQ(forwards, 4);  // one catch-up forward per chunk, none bigger
  e.run();
  EXPECT_EQ(e.tokens("r"), e.model.reference_greedy(prompt, 10));
}

TEST(SpecEngine, DraftStopsAtItsMaxModelLen) {
  SpecOptions o;
  o.method = Method::kDraft;
  o.draft_max_model_len = 24;
  const std::vector<int32_t> prompt = prompt_of(12, 1);
  SpecEngine e(core_config(), o);
  e.add("r", prompt, greedy(40));
  e.run();
  EXPECT_EQ(e.tokens("r"), e.model.reference_greedy(prompt, 40));
  // Drafts only while the draft's inputs stay below position 24.
  EXPECT_GT(e.stats().spec_num_draft_tokens, 0);
  EXPECT_LE(e.stats().spec_num_draft_tokens, 24 - 12);
  e.expect_all_blocks_free();
}

}  // namespace
}  // namespace specula
