// MTP speculation through LLMEngine::create on specula-tiny-moe (CPU): greedy output is token for
// token the output without speculation (and transformers' continuation) for k = 1, 2, 3 under
// chunked prefill, prefix-cache hits, preemption and n > 1; the measured acceptance on the model's
// own greedy continuations is near models/README.md's 86.6 %; sampling at temperature 1 follows
// the target's distribution; configuration errors say why.
#include <gtest/gtest.h>

#include <map>

#include "engine_chi_square.h"
#include "mtp_test_util.h"
#include "tokenizer/tokenizer.h"

namespace specula {
namespace {

using testing::have_moe;
using testing::moe_engine_config;
using testing::mtp_spec;

struct Workload {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
};

// The two reference prompts, each twice (prefix-cache hits on identical prompts), and a third
// that shares prompt 0's first 32 tokens (two whole blocks) and then goes elsewhere: its hit ends
// where the cached MTP entry of position 31 read a different next token than its own.
Workload workload(int max_tokens) {
  const testing::GreedyReference ref = testing::read_greedy_reference(testing::moe_reference_file());
  Workload w;
  for (int copy = 0; copy < 2; ++copy)
    for (const auto& p : ref.prompts) w.prompts.push_back(p);
  std::vector<int32_t> fork(ref.prompts[0].begin(), ref.prompts[0].begin() + 32);
  fork.insert(fork.end(), ref.prompts[1].begin() + 10, ref.prompts[1].end());
  w.prompts.push_back(fork);
  w.params.assign(w.prompts.size(), testing::greedy_params(max_tokens));
  return w;
}

std::vector<std::vector<int32_t>> plain_outputs(const Workload& w) {
  auto engine = create_engine(moe_engine_config(""));
  engine->start();
  auto out = testing::run_all(*engine, w.prompts, w.params, "plain");
  engine->shutdown();
  return out;
}

TEST(MtpEngine, GreedyIsTokenForTokenThePlainOutput) {
  ASSERT_TRUE(have_moe()) << "committed specula-tiny-moe or its reference missing";
  const Workload w = workload(40);
  const auto plain = plain_outputs(w);
  // Without speculation the engine continues as transformers does.
  const testing::GreedyReference ref = testing::read_greedy_reference(testing::moe_reference_file());
  for (size_t i = 0; i < ref.prompts.size(); ++i)
    EXPECT_EQ(std::vector<int32_t>(plain[i].begin(), plain[i].begin() + 32), ref.greedy[i]);
  for (int k : {1, 2, 3}) {
    SCOPED_TRACE("k=" + std::to_string(k));
    auto engine = create_engine(moe_engine_config(mtp_spec(k)));
    engine->start();
    EXPECT_EQ(testing::run_all(*engine, w.prompts, w.params, "k"), plain);
    const EngineMetrics m = testing::settled(*engine);
    EXPECT_EQ(m.spec_num_speculative_tokens, k);
    EXPECT_GT(m.spec_num_draft_tokens, 50);
    EXPECT_GT(m.spec_num_accepted_tokens, m.spec_num_draft_tokens / 3);
    EXPECT_GT(m.prefix_cache_hits, 0);
    EXPECT_EQ(m.kv_cache_usage, 0.0);
    engine->shutdown();
  }
}

// Shared-expert fusion (the target's MoE layers and the MTP block's) changes nothing either.
TEST(MtpEngine, SharedExpertFusionKeepsTheOutput) {
  ASSERT_TRUE(have_moe()) << "committed specula-tiny-moe or its reference missing";
  const Workload w = workload(24);
  const auto plain = plain_outputs(w);
  EngineConfig ec = moe_engine_config(mtp_spec(2));
  ec.shared_expert_fusion = 2;
  auto engine = create_engine(ec);
  engine->start();
  EXPECT_EQ(testing::run_all(*engine, w.prompts, w.params, "f"), plain);
  EXPECT_GT(testing::settled(*engine).spec_num_accepted_tokens, 0);
  engine->shutdown();
}

// A KV cache too small for the workload: requests are preempted and recomputed (the MTP layer
// starts again from the first position the target recomputes), with adaptive depth on.
TEST(MtpEngine, PreemptionAndAdaptiveDepthKeepTheOutput) {
  ASSERT_TRUE(have_moe()) << "committed specula-tiny-moe or its reference missing";
  const Workload w = workload(40);
  const auto plain = plain_outputs(w);
  EngineConfig ec = moe_engine_config(mtp_spec(3, /*adaptive=*/true));
  ec.num_gpu_blocks_override = 14;  // 224 tokens for 5 requests of ~90
  ec.max_model_len = 128;
  auto engine = create_engine(ec);
  engine->start();
  EXPECT_EQ(testing::run_all(*engine, w.prompts, w.params, "p"), plain);
  const EngineMetrics m = testing::settled(*engine);
  EXPECT_GT(m.num_preemptions, 0);
  EXPECT_GT(m.spec_depth_steps, 0);
  EXPECT_EQ(m.kv_cache_usage, 0.0);
  engine->shutdown();
}

// models/README.md: 86.6 % greedy acceptance (k = 1) on the model's own greedy continuations of
// 64 held-out prompts. On the two reference prompts, 64 tokens each, it must be well above 70 %.
TEST(MtpEngine, AcceptanceOnItsOwnGreedyContinuations) {
  ASSERT_TRUE(have_moe()) << "committed specula-tiny-moe or its reference missing";
  const testing::GreedyReference ref = testing::read_greedy_reference(testing::moe_reference_file());
  auto engine = create_engine(moe_engine_config(mtp_spec(1)));
  engine->start();
  testing::run_all(*engine, ref.prompts, std::vector<SamplingParams>(ref.prompts.size(), testing::greedy_params(64)), "a");
  const EngineMetrics m = testing::settled(*engine);
  engine->shutdown();
  ASSERT_GT(m.spec_num_draft_tokens, 50);
  const double acceptance = static_cast<double>(m.spec_num_accepted_tokens) / static_cast<double>(m.spec_num_draft_tokens);
  RecordProperty("acceptance", std::to_string(acceptance));
  EXPECT_GT(acceptance, 0.7) << m.spec_num_accepted_tokens << " of " << m.spec_num_draft_tokens;
}

// Sampling through the whole engine (temperature 1, top_k 4, n = 16): the first token is a plain
// sample, the second goes through the rejection sampler against the MTP layer's q. The pairs must
// follow p1(y1) p2(y2 | y1) of the target (engine_chi_square.h).
constexpr int kChiSquareRequests = 150;  // x 16 choices = 2400 samples

TEST(MtpEngine, SamplingThroughTheEngineFollowsTheTarget) {
  ASSERT_TRUE(have_moe()) << "committed specula-tiny-moe or its reference missing";
  const std::vector<int32_t> prompt = Tokenizer::from_dir(testing::moe_dir())->encode("import os\nimport sys\nimport ");
  const SamplingParams p = testing::chi_square_params();
  const testing::TargetPairs target = testing::target_pairs(testing::moe_dir(), prompt, p, 2);
  auto engine = create_engine(testing::chi_square_engine_config(moe_engine_config(mtp_spec(2))));
  const testing::EngineChiSquare r = testing::engine_chi_square(*engine, target, prompt, p, kChiSquareRequests);
  EXPECT_EQ(r.seen, r.samples) << "a continuation outside the target's top-k";
  EXPECT_GT(r.chi.p_value, 1e-3) << "chi2 " << r.chi.statistic << " dof " << r.chi.dof;
  EXPECT_GE(r.chi.cells, 8);
  // Verification really happened, with both outcomes.
  EXPECT_GT(r.metrics.spec_num_draft_tokens, r.samples / 2);
  EXPECT_GT(r.metrics.spec_num_accepted_tokens, 0);
  EXPECT_LT(r.metrics.spec_num_accepted_tokens, r.metrics.spec_num_draft_tokens);
}

// The negative controls: the same run, the same statistic, with a broken rejection sampler swapped
// in (the engine assembled by hand): one that accepts every draft, one that resamples from p
// instead of the residual after a rejection. The test's criterion (p > 1e-3) must reject both
// (on this seed: always accept chi2 1.9e5, p 0; resample from p chi2 226 on 14 dof, p 2.5e-40).
TEST(MtpEngine, TheEngineChiSquareRejectsBrokenRejectionSamplers) {
  ASSERT_TRUE(have_moe()) << "committed specula-tiny-moe or its reference missing";
  const std::vector<int32_t> prompt = Tokenizer::from_dir(testing::moe_dir())->encode("import os\nimport sys\nimport ");
  const SamplingParams p = testing::chi_square_params();
  const testing::TargetPairs target = testing::target_pairs(testing::moe_dir(), prompt, p, 2);
  for (const testing::BrokenSampler& broken : testing::broken_samplers()) {
    SCOPED_TRACE(broken.name);
    auto engine = testing::engine_with_verifier(testing::chi_square_engine_config(moe_engine_config(mtp_spec(2))),
                                               broken.make());
    const testing::EngineChiSquare r = testing::engine_chi_square(*engine, target, prompt, p, kChiSquareRequests);
    EXPECT_GT(r.metrics.spec_num_draft_tokens, r.samples / 2) << "the broken sampler verified nothing";
    EXPECT_LT(r.chi.p_value, 1e-3) << "chi2 " << r.chi.statistic << " dof " << r.chi.dof;
    std::printf("%s: chi2 %.1f dof %d p %.3g, %lld of %lld samples in the target's top-k\n", broken.name,
                r.chi.statistic, r.chi.dof, r.chi.p_value, static_cast<long long>(r.seen), static_cast<long long>(r.samples));
  }
}

TEST(MtpEngine, ConfigErrorsSayWhy) {
  ASSERT_TRUE(have_moe()) << "committed specula-tiny-moe or its reference missing";
  auto error_of = [](EngineConfig ec) {
    try {
      create_engine(ec);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // specula-tiny (Qwen3) has no MTP layer.
  EngineConfig tiny = moe_engine_config(mtp_spec(1));
  tiny.model = (testing::models_dir() / "specula-tiny").string();
  const std::string no_layers = error_of(tiny);
  EXPECT_NE(no_layers.find("num_nextn_predict_layers is 0"), std::string::npos) << no_layers;
  EXPECT_NE(no_layers.find("specula-tiny"), std::string::npos) << no_layers;
  // "model" must be the target itself.
  const std::string other = error_of(moe_engine_config(
      R"({"method": "deepseek_mtp", "model": ")" + (testing::models_dir() / "specula-tiny").string() + R"("})"));
  EXPECT_NE(other.find("takes its layers from the target"), std::string::npos) << other;
  EXPECT_NE(error_of(moe_engine_config(R"({"method": "mtp", "num_speculative_tokens": 0})")).find("at least 1"),
            std::string::npos);
}

// vLLM's spelling, no num_speculative_tokens (the number of MTP layers: 1), "model" naming the
// target, n = 2: runs and keeps the greedy output.
TEST(MtpEngine, DeepseekMtpAliasDefaultsToTheNumberOfLayers) {
  ASSERT_TRUE(have_moe()) << "committed specula-tiny-moe or its reference missing";
  const testing::GreedyReference ref = testing::read_greedy_reference(testing::moe_reference_file());
  auto engine = create_engine(
      moe_engine_config(R"({"method": "deepseek_mtp", "model": ")" + testing::moe_dir().string() + R"(", "adaptive": false})"));
  engine->start();
  SamplingParams p = testing::greedy_params(32);
  p.n = 2;
  auto stream = engine->add_request(NewRequest{"n2", ref.prompts[1], p});
  std::map<int, std::vector<int32_t>> choices;
  RequestOutput o;
  while (stream->pop(&o, std::chrono::seconds(120))) {
    ASSERT_FALSE(o.error.has_value()) << *o.error;
    for (const ChoiceDelta& d : o.choices) choices[d.index].insert(choices[d.index].end(), d.token_ids.begin(), d.token_ids.end());
    if (o.finished) break;
  }
  ASSERT_EQ(choices.size(), 2u);
  for (auto& [i, t] : choices) EXPECT_EQ(t, ref.greedy[1]) << "choice " << i;
  const EngineMetrics m = testing::settled(*engine);
  EXPECT_EQ(m.spec_num_speculative_tokens, 1);
  EXPECT_GT(m.spec_num_draft_tokens, 0);
  engine->shutdown();
}

}  // namespace
}  // namespace specula
