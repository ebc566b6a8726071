// Async scheduling (--async-scheduling) against the synchronous engine, through LLMEngine::create
// on the CPU: for draft_model, ngram, mtp and eagle3 at pinned depth (and a target and draft split
// over tensor-parallel ranks; eagle3 and mtp's depth-0 catch-ups at an adaptive depth), greedy and seeded temperature-1 workloads give the same tokens,
// finish reasons and speculative counts (drafts, draft tokens, accepted per position) with the
// feature on and off. The workloads mix penalties, stop strings,
// n > 1, prefix-cache hits, chunked prefill, max_tokens that end inside a draft and a KV cache
// small enough to preempt. vLLM's first async x speculation attempt silently lost acceptance
// (seed 003): equal counts are what would catch that.
#include <gtest/gtest.h>

#include "model/config.h"
#include "spec_decode/adaptive_speculator.h"
#include "spec_decode/proposer_registry.h"
#include "spec_decode/speculative_config.h"
#include "spec_decode/step_cost_model.h"
#include "unit/app/async_stress.h"
#include "unit/app/async_workload.h"
#include "unit/app/scheduled_speculator.h"

namespace specula {
namespace {

using namespace specula::testing;

TEST(AsyncScheduling, WithoutSpeculation) {
  for (bool sampled : {false, true})
    expect_same(tiny_config(""), Workload{16, 16, sampled}, tiny_prompts(), /*expect_drafts=*/false);
}

TEST(AsyncScheduling, DraftModelAtConcurrency1And16) {
  for (bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "temperature 1" : "greedy");
    expect_same(tiny_config(draft_spec(3)), Workload{3, 1, sampled, 0, !sampled, !sampled}, tiny_prompts());
    expect_same(tiny_config(draft_spec(3)), Workload{16, 16, sampled, 0, !sampled}, tiny_prompts());
  }
}

TEST(AsyncScheduling, DraftModelAt64) {
  expect_same(tiny_config(draft_spec(4)), Workload{64, 64, false}, tiny_prompts());
  expect_same(tiny_config(draft_spec(4)), Workload{64, 64, true, 0, false}, tiny_prompts());
}

TEST(AsyncScheduling, NgramAtConcurrency1And16And64) {
  for (bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "temperature 1" : "greedy");
    expect_same(tiny_config(ngram_spec(4)), Workload{3, 1, sampled}, tiny_prompts());
    expect_same(tiny_config(ngram_spec(4)), Workload{16, 16, sampled}, tiny_prompts());
  }
  expect_same(tiny_config(ngram_spec(3)), Workload{64, 64, true}, tiny_prompts());
}

TEST(AsyncScheduling, MtpAtConcurrency1And16) {
  ASSERT_TRUE(testing::have_moe()) << "committed specula-tiny-moe or its reference missing";
  for (bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "temperature 1" : "greedy");
    EngineConfig ec = testing::moe_engine_config(testing::mtp_spec(2));
    ec.max_num_batched_tokens = 384;  // see tiny_config
    // Greedy drafts are launched ahead of the verification (spec_decode/README.md).
    expect_same(ec, Workload{3, 1, sampled, 0, !sampled, !sampled}, moe_prompts());
    expect_same(ec, Workload{16, 16, sampled, 0, !sampled}, moe_prompts());
  }
}

// EAGLE-3 drafts from the target's features of the step before: the step in flight must hand the
// head the rows it verified, not a placeholder's; greedy drafts launch ahead of the
// verification from its rows on the device (spec_decode/README.md).
TEST(AsyncScheduling, Eagle3AtConcurrency1And16) {
  for (bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "temperature 1" : "greedy");
    expect_same(tiny_config(eagle3_spec(3)), Workload{3, 1, sampled, 0, !sampled, !sampled}, tiny_prompts());
    expect_same(tiny_config(eagle3_spec(3)), Workload{16, 16, sampled, 0, !sampled}, tiny_prompts());
  }
}

// The adaptive depth at fixed prices and without a clock: speculation does not pay at the prior
// acceptance (0.7) but would were every draft accepted, so depth-0 steps feed the proposer before
// each probe (AdaptiveDepth::feeds_proposer). Under async scheduling such a step's catch-up is
// launched ahead of its sampled tokens (engine/README.md): the head's or MTP layer's cache must
// be the synchronous engine's, or the probes' sampled drafts and so the tokens would differ.
class FeedingCost : public StepCostModel {
 public:
  double target_seconds(int, int rows) const override { return 1e-3 * (1.0 + 0.2 * (rows - 1)); }
  double draft_seconds(int, int depth) const override { return 0.4e-3 * depth; }
};

SpeculatorFactory feeding_speculator(const std::string& spec_json, const fs::path& target) {
  return [=](const SpeculatorContext& engine) -> std::unique_ptr<Speculator> {
    SpeculativeConfig spec = parse_speculative_config(spec_json);
    resolve_speculative_config(spec, load_model_config(target), target.string());
    AdaptiveSpeculatorConfig config;
    config.num_speculative_tokens = spec.num_speculative_tokens;
    config.adaptive = true;
    return std::make_unique<AdaptiveSpeculator>(create_proposer(ProposerContext{spec, engine}), config,
                                                std::make_unique<FeedingCost>(), [] { return 0.0; });
  };
}

TEST(AsyncScheduling, DepthZeroCatchUpsLaunchedAhead) {
  // Temperature 1: greedy verifications would launch their drafts ahead too, choosing the depth
  // before the step's verifications are recorded (an adaptive depth may then differ from sync).
  const Workload w{4, 1, /*sampled=*/true, 0, /*unpredictable_stops=*/false, /*expect_launched_ahead=*/true};
  expect_same(tiny_config(eagle3_spec(3, true)), w, tiny_prompts(), true, feeding_speculator(eagle3_spec(3, true), tiny()));
  ASSERT_TRUE(have_moe()) << "committed specula-tiny-moe or its reference missing";
  EngineConfig ec = moe_engine_config(mtp_spec(3, true));
  ec.max_num_batched_tokens = 384;  // see tiny_config
  expect_same(ec, w, moe_prompts(), true, feeding_speculator(mtp_spec(3, true), moe_dir()));
}

// A depth that changes every step, launched ahead where it can (scheduled_speculator.h).
TEST(AsyncScheduling, DepthsThatChangeEveryStepLaunchedAhead) {
  // Greedy, one request at a time, no stops: each request's steps are the same in both engines.
  const Workload w{12, 1, /*sampled=*/false, 0, /*unpredictable_stops=*/false, /*expect_launched_ahead=*/true};
  expect_same(tiny_config(eagle3_spec(5)), w, tiny_prompts(), true, scheduled_speculator(eagle3_spec(5), tiny()));
  expect_same(tiny_config(draft_spec(5)), w, tiny_prompts(), true, scheduled_speculator(draft_spec(5), tiny()));
  ASSERT_TRUE(have_moe()) << "committed specula-tiny-moe or its reference missing";
  EngineConfig ec = moe_engine_config(mtp_spec(5));
  ec.max_num_batched_tokens = 384;  // see tiny_config
  expect_same(ec, w, moe_prompts(), true, scheduled_speculator(mtp_spec(5), moe_dir()));
}

// The target and its draft model split over 2 ranks (threads on the CPU), async against sync.
TEST(AsyncScheduling, TensorParallelTargetAndDraft) {
  EngineConfig ec = tiny_config(split_draft_spec(3, 2));
  ec.tensor_parallel_size = 2;
  ec.cpu_threads = 1;
  expect_same(ec, Workload{16, 16, false}, tiny_prompts());
}

// Waves of requests on one engine, each queued after the last finished (as `bench latency` runs
// its batches): with drafts, requests end at different steps, and one ended while the others
// waited on the step in flight left an output that scheduled nothing. The finished ids it carried
// never reached the runner, so the draft model kept their state until a later wave found all its
// max_num_seqs slots taken (on the H200: "proposer tracks more than max_num_seqs (8) requests").
TEST(AsyncScheduling, WavesOfRequestsEachAfterTheLastFinished) {
  const std::vector<std::vector<int32_t>> prompts = tiny_prompts();
  EngineConfig ec = tiny_config(draft_spec(3));
  ec.async_scheduling = true;
  ec.max_num_seqs = 4;
  ec.max_model_len = 256;
  auto engine = create_engine(ec);
  engine->start();
  const Workload w{4, 4, false, 0, false};
  for (int wave = 0; wave < 8; ++wave) {
    SCOPED_TRACE("wave " + std::to_string(wave));
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < w.num_requests; ++i) {
      SamplingParams p = params_for(i, w);
      p.n = 1;
      p.max_tokens = 6 + 3 * i + wave % 3;
      streams.push_back(engine->add_request(
          NewRequest{"w" + std::to_string(wave) + "r" + std::to_string(i), prompt_for(i + wave, prompts), p}));
    }
    for (auto& stream : streams) {
      std::map<int, ChoiceResult> choices;
      collect(*stream, choices);
      ASSERT_EQ(choices.size(), 1u);
      EXPECT_EQ(choices[0].finish, FinishReason::kLength);
    }
  }
  EXPECT_EQ(settled_metrics(*engine).kv_cache_usage, 0.0);
  engine->shutdown();
}

// Random arrivals, lengths, sampling and client aborts with a step always in flight
// (async_stress.h), without speculation and with every method.
TEST(AsyncScheduling, StressRandomArrivalsAndAborts) {
  for (const StressConfig& c : stress_configs("cpu")) {
    SCOPED_TRACE(c.name);
    const StressWorkload w{120, 12, 0.25, 7};
    expect_stress_invariants(run_stress(c.engine, w, c.prompts), w);
  }
}

TEST(AsyncScheduling, PreemptionWithASmallCache) {
  // 16 blocks of 16 tokens for 8 sequences of ~50-110 + ~40 tokens: requests are preempted and
  // recomputed. The step in flight holds its blocks until its values land, so the two modes may
  // preempt at different steps, and a preempted request's drafts are dropped. Where drafts are
  // deterministic (greedy, or n-gram lookups) the tokens are a function of seed and position and
  // may not differ; sampled drafts (a draft model at temperature 1) may legitimately take other
  // tokens when other drafts are dropped, as in the synchronous engine under other load.
  struct Case {
    std::string spec;
    bool sampled;
  };
  for (const Case& c : {Case{draft_spec(3), false}, Case{ngram_spec(3), false}, Case{ngram_spec(3), true},
                        Case{"", true}}) {
    SCOPED_TRACE(c.spec + (c.sampled ? " temperature 1" : " greedy"));
    Workload w{12, 8, c.sampled, 16};
    const Outcome sync = run(tiny_config(c.spec), false, w, tiny_prompts());
    const Outcome async = run(tiny_config(c.spec), true, w, tiny_prompts());
    EXPECT_GT(sync.metrics.num_preemptions, 0);
    EXPECT_GT(async.metrics.num_preemptions, 0);
    for (const auto& [id, choices] : sync.requests)
      for (const auto& [index, r] : choices)
        EXPECT_TRUE(r == async.requests.at(id).at(index)) << id << " choice " << index;
    // (generation_tokens_total may differ: it counts a step's tokens past a stop string, and
    // which drafts a step verified depends on when preemption dropped them.)
  }
}

TEST(AsyncScheduling, AbortMidStreamSendsNothingAfterwards) {
  const std::vector<std::vector<int32_t>> prompts = tiny_prompts();
  EngineConfig ec = tiny_config(draft_spec(3));
  Workload w{6, 6, false};
  const Outcome reference = run(ec, false, w, prompts);

  ec.async_scheduling = true;
  ec.max_num_seqs = 6;
  ec.max_model_len = 256;
  auto engine = create_engine(ec);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < w.num_requests; ++i) {
    SamplingParams p = params_for(i, w);
    if (i == 0) {
      p.max_tokens = 150;
      p.ignore_eos = true;
    }
    streams.push_back(engine->add_request(NewRequest{"r" + std::to_string(i), prompt_for(i, prompts), p}));
  }
  engine->start();
  // r0 is aborted after its first few tokens, while a step that holds it is in flight.
  std::vector<int32_t> got;
  RequestOutput o;
  bool finished = false;
  while (!finished && streams[0]->pop(&o, std::chrono::seconds(120))) {
    for (const ChoiceDelta& d : o.choices) {
      got.insert(got.end(), d.token_ids.begin(), d.token_ids.end());
      if (d.finish_reason != FinishReason::kNone) EXPECT_EQ(d.finish_reason, FinishReason::kAbort);
    }
    finished = o.finished;
    if (!finished && got.size() >= 4) engine->abort("r0");
  }
  EXPECT_TRUE(finished);
  EXPECT_FALSE(streams[0]->pop(&o, std::chrono::milliseconds(10))) << "output after the final one";
  const std::vector<int32_t>& full = reference.requests.at("r0").at(0).tokens;
  ASSERT_LE(std::min(got.size(), full.size()), full.size());
  for (size_t j = 0; j < std::min(got.size(), full.size()); ++j) EXPECT_EQ(got[j], full[j]) << "token " << j;
  for (int i = 1; i < w.num_requests; ++i) {
    std::map<int, ChoiceResult> choices;
    collect(*streams[static_cast<size_t>(i)], choices);
    EXPECT_EQ(choices, reference.requests.at("r" + std::to_string(i))) << "r" << i;
  }
  const EngineMetrics m = settled_metrics(*engine);
  EXPECT_EQ(m.kv_cache_usage, 0.0);
  engine->shutdown();
}

}  // namespace
}  // namespace specula
