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
#include "unit/sampling/chi_square.h"
#include "unit/spec_decode/model_logits.h"
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
  if (!have_models()) GTEST_SKIP() << "no embedded models";
  // The draft agrees with the target's greedy token most of the time (models/README.md: 84.6%
  // per draft on the target's own continuations).
  expect_transformers_greedy(R"({"method": "draft_model", "model": ")" + tiny_draft().string() +
                                 R"(", "num_speculative_tokens": 3, "adaptive": false})",
                             0.5);
}

TEST(EmbeddedSpec, NgramGreedyEqualsTransformers) {
  if (!have_models()) GTEST_SKIP() << "no embedded models";
  // Greedy continuations of tiny models repeat themselves: prompt lookup finds them.
  expect_transformers_greedy(
      R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4, "adaptive": false})",
      0.2);
}

TEST(EmbeddedSpec, TheTargetAsItsOwnDraftIsAlwaysAccepted) {
  if (!have_models()) GTEST_SKIP() << "no embedded models";
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
  if (!have_models()) GTEST_SKIP() << "no embedded models";
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
  if (!have_models()) GTEST_SKIP() << "no embedded models";
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
  EXPECT_NE(error_of(R"({"method": "eagle", "num_speculative_tokens": 2})").find("not yet supported"), std::string::npos);
  EXPECT_NE(error_of(R"({"method": "draft_model", "model": "/nonexistent", "num_speculative_tokens": 2})").find("no config.json"),
            std::string::npos);
  const fs::path other = testing::fixtures_dir() / "models" / "qwen3_qknorm_headdim";
  EXPECT_NE(error_of(R"({"model": ")" + other.string() + R"(", "num_speculative_tokens": 2})").find("vocab_size"),
            std::string::npos);
}

// Sampling through the whole engine (temperature 1, top_k 4): the first token is a plain sample,
// the second goes through the rejection sampler against the draft's q. The pairs must follow
// p1(y1) p2(y2 | y1) of the target.
TEST(EmbeddedSpec, SamplingThroughTheEngineFollowsTheTarget) {
  if (!have_models()) GTEST_SKIP() << "no embedded models";
  auto tok = Tokenizer::from_dir(tiny());
  const std::vector<int32_t> prompt = tok->encode("import os\nimport sys\nimport ");
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 4;
  p.max_tokens = 3;  // after the first token, one draft (max_tokens leaves room for no more)
  p.ignore_eos = true;
  p.n = 16;

  // The target's exact distributions.
  auto backend = make_cpu_backend(0);
  auto target = create_model(load_model_config(tiny()), *open_safetensors_checkpoint(tiny()), *backend);
  SamplingRow r0;
  r0.params = &p;
  r0.prompt_token_ids = prompt;
  std::vector<float> p1 = testing::last_logits(*target, *backend, {prompt})[0];
  logits_to_probs(p1, r0);
  std::map<int32_t, std::vector<float>> p2;
  for (int32_t y = 0; y < static_cast<int32_t>(p1.size()); ++y) {
    if (p1[y] <= 0) continue;
    std::vector<int32_t> ctx = prompt;
    ctx.push_back(y);
    p2[y] = testing::last_logits(*target, *backend, {ctx})[0];
    SamplingRow r1 = r0;
    r1.output_token_ids = std::span<const int32_t>(&ctx.back(), 1);
    logits_to_probs(p2[y], r1);
  }

  EngineConfig ec = engine_config(R"({"model": ")" + tiny_draft().string() +
                                  R"(", "num_speculative_tokens": 2, "adaptive": false})");
  ec.max_num_seqs = 128;
  ec.max_num_batched_tokens = 2048;
  ec.seed = 11;
  auto engine = create_engine(ec);
  engine->start();
  const int requests = 150;  // x 16 choices = 2400 samples
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < requests; ++i) streams.push_back(engine->add_request(NewRequest{"s" + std::to_string(i), prompt, p}));
  std::map<std::pair<int32_t, int32_t>, int64_t> counts;
  for (auto& s : streams) {
    std::map<int, std::vector<int32_t>> choices;
    RequestOutput o;
    while (s->pop(&o, std::chrono::seconds(120))) {
      ASSERT_FALSE(o.error.has_value()) << *o.error;
      for (const ChoiceDelta& d : o.choices)
        choices[d.index].insert(choices[d.index].end(), d.token_ids.begin(), d.token_ids.end());
      if (o.finished) break;
    }
    for (auto& [i, t] : choices) {
      ASSERT_EQ(t.size(), 3u);
      counts[{t[0], t[1]}] += 1;
    }
  }
  const EngineMetrics m = settled_metrics(*engine);
  engine->shutdown();
  std::vector<int64_t> observed;
  std::vector<double> expected;
  int64_t seen = 0;
  for (const auto& [y1, q] : p2) {
    for (int32_t y2 = 0; y2 < static_cast<int32_t>(q.size()); ++y2) {
      if (q[y2] <= 0) continue;
      auto it = counts.find({y1, y2});
      observed.push_back(it == counts.end() ? 0 : it->second);
      seen += observed.back();
      expected.push_back(static_cast<double>(p1[y1]) * q[y2]);
    }
  }
  EXPECT_EQ(seen, requests * p.n) << "a continuation outside the target's top-k";
  const testing::ChiSquareResult chi = testing::chi_square_test(observed, expected);
  EXPECT_GT(chi.p_value, 1e-3) << "chi2 " << chi.statistic << " dof " << chi.dof;
  // Verification really happened, with both outcomes.
  EXPECT_GT(m.spec_num_draft_tokens, requests * p.n / 2);
  EXPECT_GT(m.spec_num_accepted_tokens, 0);
  EXPECT_LT(m.spec_num_accepted_tokens, m.spec_num_draft_tokens);
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

TEST(EmbeddedSpec, GenerateCliTakesTheSpeculativeConfig) {
  const char* bin = std::getenv("SPECULA_BINARY");
  if (!bin || !fs::exists(bin)) GTEST_SKIP() << "SPECULA_BINARY not set (run through ctest)";
  if (!have_models()) GTEST_SKIP() << "no embedded models";
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
