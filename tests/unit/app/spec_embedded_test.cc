// Speculative decoding through LLMEngine::create on the embedded pair (specula-tiny target,
// specula-tiny-draft draft, real tokenizer): greedy output equals transformers' continuation with
// draft_model and ngram, and sampling through the whole engine follows the target's distribution.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <nlohmann/json.hpp>

#include "app/create_engine.h"
#include "engine/llm_engine.h"
#include "sampling/sampling_math.h"
#include "model/weight_source.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"
#include "engine_chi_square.h"
#include "unit/spec_decode/reference_fixture.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

fs::path tiny() { return testing::models_dir() / "specula-tiny"; }
fs::path tiny_draft() { return testing::models_dir() / "specula-tiny-draft"; }
fs::path reference_file() { return testing::fixtures_dir() / "embedded" / "specula-tiny" / "reference.safetensors"; }

bool have_models() {
  return fs::exists(tiny() / "model.safetensors") && fs::exists(tiny_draft() / "model.safetensors") &&
         fs::exists(reference_file());
}

std::pair<std::vector<std::vector<int32_t>>, std::vector<std::vector<int32_t>>> read_reference() {
  testing::GreedyReference r = testing::read_greedy_reference(reference_file());
  return {r.prompts, r.greedy};
}

std::vector<int32_t> collect(RequestStream& stream) {
  std::vector<int32_t> tokens;
  RequestOutput o;
  while (stream.pop(&o, std::chrono::seconds(120))) {
    EXPECT_FALSE(o.error.has_value()) << *o.error;
    for (const ChoiceDelta& d : o.choices) tokens.insert(tokens.end(), d.token_ids.begin(), d.token_ids.end());
    if (o.finished) break;
  }
  return tokens;
}

// Waits for the loop to publish the metrics of its last step.
EngineMetrics settled_metrics(LLMEngine& engine) {
  EngineMetrics m = engine.metrics();
  for (int i = 0; i < 6000 && m.num_requests_running + m.num_requests_waiting > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    m = engine.metrics();
  }
  return m;
}

EngineConfig engine_config(const std::string& spec) {
  EngineConfig ec;
  ec.model = tiny().string();
  ec.device = "cpu";
  ec.max_num_seqs = 8;
  ec.max_model_len = 512;
  ec.max_num_batched_tokens = 64;  // chunked prefill of the ~50-token prompts alongside verifications
  ec.speculative_config = spec;
  return ec;
}

// Both reference prompts and a repeat of each (prefix-cache hits), all at once.
void expect_transformers_greedy(const std::string& spec, double min_acceptance) {
  const auto [prompts, greedy] = read_reference();
  auto engine = create_engine(engine_config(spec));
  engine->start();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int copy = 0; copy < 2; ++copy) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      SamplingParams p;
      p.temperature = 0.0f;
      p.ignore_eos = true;
      p.max_tokens = static_cast<int>(greedy[i].size());
      streams.push_back(engine->add_request(NewRequest{"r" + std::to_string(copy) + std::to_string(i), prompts[i], p}));
    }
  }
  for (size_t k = 0; k < streams.size(); ++k) EXPECT_EQ(collect(*streams[k]), greedy[k % prompts.size()]) << spec;
  const EngineMetrics m = settled_metrics(*engine);
  EXPECT_GT(m.spec_num_draft_tokens, 0) << spec;
  EXPECT_GE(static_cast<double>(m.spec_num_accepted_tokens), min_acceptance * m.spec_num_draft_tokens) << spec;
  EXPECT_GT(m.prefix_cache_hits, 0);
  EXPECT_EQ(m.kv_cache_usage, 0.0);
  engine->shutdown();
}

TEST(EmbeddedSpec, DraftModelGreedyEqualsTransformers) {
  ASSERT_TRUE(have_models()) << "committed embedded models or reference missing";
  // The draft agrees with the target's greedy token most of the time (models/README.md: 84.6%
  // per draft on the target's own continuations).
  expect_transformers_greedy(R"({"method": "draft_model", "model": ")" + tiny_draft().string() +
                                 R"(", "num_speculative_tokens": 3, "adaptive": false})",
                             0.5);
}

TEST(EmbeddedSpec, NgramGreedyEqualsTransformers) {
  ASSERT_TRUE(have_models()) << "committed embedded models or reference missing";
  // Greedy continuations of tiny models repeat themselves: prompt lookup finds them.
  expect_transformers_greedy(
      R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4, "adaptive": false})",
      0.2);
}

TEST(EmbeddedSpec, TheTargetAsItsOwnDraftIsAlwaysAccepted) {
  ASSERT_TRUE(have_models()) << "committed embedded models or reference missing";
  const auto [prompts, greedy] = read_reference();
  auto engine = create_engine(engine_config(R"({"model": ")" + tiny().string() +
                                                R"(", "num_speculative_tokens": 4, "adaptive": false})"));
  engine->start();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.ignore_eos = true;
    p.max_tokens = static_cast<int>(greedy[i].size());
    streams.push_back(engine->add_request(NewRequest{"r" + std::to_string(i), prompts[i], p}));
  }
  for (size_t i = 0; i < streams.size(); ++i) EXPECT_EQ(collect(*streams[i]), greedy[i]);
  const EngineMetrics m = settled_metrics(*engine);
  EXPECT_GT(m.spec_num_draft_tokens, 20);
  EXPECT_EQ(m.spec_num_accepted_tokens, m.spec_num_draft_tokens);
  engine->shutdown();
}

TEST(EmbeddedSpec, AdaptiveDepthKeepsTheOutput) {
  ASSERT_TRUE(have_models()) << "committed embedded models or reference missing";
  const auto [prompts, greedy] = read_reference();
  auto engine = create_engine(engine_config(R"({"model": ")" + tiny_draft().string() +
                                                R"(", "num_speculative_tokens": 4})"));
  engine->start();
  SamplingParams p;
  p.temperature = 0.0f;
  p.ignore_eos = true;
  p.max_tokens = static_cast<int>(greedy[0].size());
  auto stream = engine->add_request(NewRequest{"a", prompts[0], p});
  EXPECT_EQ(collect(*stream), greedy[0]);
  const EngineMetrics m = settled_metrics(*engine);
  EXPECT_TRUE(m.spec_adaptive);
  EXPECT_EQ(m.spec_num_speculative_tokens, 4);
  EXPECT_GT(m.spec_depth_steps, 0);
  engine->shutdown();
}

TEST(EmbeddedSpec, ConfigErrorsAtCreate) {
  ASSERT_TRUE(have_models()) << "committed embedded models or reference missing";
  auto error_of = [](const std::string& spec) {
    try {
      create_engine(engine_config(spec));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of(R"({"method": "ngram", "num_speculative_tokeens": 2})").find("did you mean \"num_speculative_tokens\""),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method": "eagle", "num_speculative_tokens": 2})").find("needs \"model\""), std::string::npos);
  EXPECT_NE(error_of(R"({"method": "draft_model", "model": "/nonexistent", "num_speculative_tokens": 2})").find("no config.json"),
            std::string::npos);
  const fs::path other = testing::fixtures_dir() / "models" / "qwen3_qknorm_headdim";
  EXPECT_NE(error_of(R"({"model": ")" + other.string() + R"(", "num_speculative_tokens": 2})").find("vocab_size"),
            std::string::npos);
}

// Sampling through the whole engine (temperature 1, top_k 4): the first token is a plain sample,
// the second goes through the rejection sampler against the draft's q. The pairs must follow
// p1(y1) p2(y2 | y1) of the target (engine_chi_square.h).
EngineConfig chi_square_config() {
  return testing::chi_square_engine_config(engine_config(R"({"model": ")" + tiny_draft().string() +
                                                         R"(", "num_speculative_tokens": 2, "adaptive": false})"));
}
constexpr int kChiSquareRequests = 150;  // x 16 choices = 2400 samples

TEST(EmbeddedSpec, SamplingThroughTheEngineFollowsTheTarget) {
  ASSERT_TRUE(have_models()) << "committed embedded models or reference missing";
  const std::vector<int32_t> prompt = Tokenizer::from_dir(tiny())->encode("import os\nimport sys\nimport ");
  const SamplingParams p = testing::chi_square_params();
  const testing::TargetPairs target = testing::target_pairs(tiny(), prompt, p, 0);
  auto engine = create_engine(chi_square_config());
  const testing::EngineChiSquare r = testing::engine_chi_square(*engine, target, prompt, p, kChiSquareRequests);
  EXPECT_EQ(r.seen, r.samples) << "a continuation outside the target's top-k";
  EXPECT_GT(r.chi.p_value, 1e-3) << "chi2 " << r.chi.statistic << " dof " << r.chi.dof;
  // Verification really happened, with both outcomes.
  EXPECT_GT(r.metrics.spec_num_draft_tokens, r.samples / 2);
  EXPECT_GT(r.metrics.spec_num_accepted_tokens, 0);
  EXPECT_LT(r.metrics.spec_num_accepted_tokens, r.metrics.spec_num_draft_tokens);
}

// The negative controls: the same run, the same statistic, with a broken rejection sampler swapped
// in (the engine assembled by hand): one that accepts every draft, one that resamples from p
// instead of the residual after a rejection. The test's criterion (p > 1e-3) must reject both
// (on this seed: always accept chi2 9417, p 0; resample from p chi2 39.9 on 10 dof, p 1.8e-5).
TEST(EmbeddedSpec, TheEngineChiSquareRejectsBrokenRejectionSamplers) {
  ASSERT_TRUE(have_models()) << "committed embedded models or reference missing";
  const std::vector<int32_t> prompt = Tokenizer::from_dir(tiny())->encode("import os\nimport sys\nimport ");
  const SamplingParams p = testing::chi_square_params();
  const testing::TargetPairs target = testing::target_pairs(tiny(), prompt, p, 0);
  for (const testing::BrokenSampler& broken : testing::broken_samplers()) {
    SCOPED_TRACE(broken.name);
    auto engine = testing::engine_with_verifier(chi_square_config(), broken.make());
    const testing::EngineChiSquare r = testing::engine_chi_square(*engine, target, prompt, p, kChiSquareRequests);
    EXPECT_GT(r.metrics.spec_num_draft_tokens, r.samples / 2) << "the broken sampler verified nothing";
    EXPECT_LT(r.chi.p_value, 1e-3) << "chi2 " << r.chi.statistic << " dof " << r.chi.dof;
    std::printf("%s: chi2 %.1f dof %d p %.3g, %lld of %lld samples in the target's top-k\n", broken.name,
                r.chi.statistic, r.chi.dof, r.chi.p_value, static_cast<long long>(r.seen), static_cast<long long>(r.samples));
  }
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

TEST(EmbeddedSpec, GenerateCliTakesTheSpeculativeConfig) {
  const char* bin = std::getenv("SPECULA_BINARY");
  if (!bin || !fs::exists(bin)) GTEST_SKIP() << "SPECULA_BINARY not set (run through ctest)";
  ASSERT_TRUE(have_models()) << "committed embedded models or reference missing";
  const auto [prompts, greedy] = read_reference();
  auto tok = Tokenizer::from_dir(tiny());
  const std::string prompt = testing::read_greedy_reference(reference_file()).metadata["prompt_0_text"];
  const std::string spec = R"({"method": "draft_model", "model": ")" + tiny_draft().string() +
                           R"(", "num_speculative_tokens": 3})";
  const std::string cmd = shell_quote(bin) + " generate " + shell_quote(tiny().string()) + " --prompt " +
                          shell_quote(prompt) + " --max-tokens " + std::to_string(greedy[0].size()) +
                          " --temperature 0 --ignore-eos --device cpu --max-model-len 256 --speculative-config " +
                          shell_quote(spec) + " 2>/dev/null";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << cmd;
  EXPECT_EQ(out, tok->decode(greedy[0]) + "\n");
}

}  // namespace
}  // namespace specula
