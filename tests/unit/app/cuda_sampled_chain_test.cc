// Sampled drafts chained on the device (spec_decode/draft_chain.h) on the GPU: seeded
// temperature-1 requests through the whole engine (graphs, the device draft sampler drawing into
// the next draft step's input, q kept in the store, async scheduling) give the tokens and the
// drafting of the step-by-step path (SPECULA_SAMPLED_DRAFT_CHAIN=0), for the draft model and the
// EAGLE-3 head, where the draft steps run as graphs (SPECULA_FUSED_SAMPLED_CHAIN=0). The fused
// chain draws from its own logits, which differ from the graphs' by rounding, so its drafts may
// differ where a draw falls within rounding of a token boundary: its run is held to the same
// lengths and an acceptance rate within the sampling spread of the graphs' (the kernel's tests,
// decoder_chain_test.cc, check each draw against the q it keeps).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "app/create_engine.h"
#include "engine/llm_engine.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"
#include "unit/backend/cuda/cuda_test_util.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

struct Run {
  std::vector<std::vector<int32_t>> tokens;
  EngineMetrics metrics;
};

enum class Path { kStepByStep, kChainGraphs, kChainFused };

Run seeded_run(const std::string& spec, const std::vector<std::vector<int32_t>>& prompts, int tokens, Path path) {
  if (path != Path::kStepByStep) {
    unsetenv("SPECULA_SAMPLED_DRAFT_CHAIN");
  } else {
    setenv("SPECULA_SAMPLED_DRAFT_CHAIN", "0", 1);
  }
  if (path == Path::kChainFused) {
    unsetenv("SPECULA_FUSED_SAMPLED_CHAIN");
  } else {
    setenv("SPECULA_FUSED_SAMPLED_CHAIN", "0", 1);
  }
  EngineConfig c;
  c.model = (testing::models_dir() / "specula-tiny").string();
  c.device = "cuda";
  c.max_model_len = 512;
  c.max_num_seqs = 8;
  c.gpu_memory_utilization = 0.3;
  c.speculative_config = spec;
  auto engine = create_engine(c);
  engine->start();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_p = i % 2 == 0 ? 1.0f : 0.95f;
    p.seed = 1000 + i;
    p.max_tokens = tokens - static_cast<int>(i);  // requests end apart: ragged last steps
    p.ignore_eos = true;
    streams.push_back(engine->add_request(NewRequest{"s" + std::to_string(i), prompts[i], p}));
  }
  Run run;
  run.tokens.resize(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestOutput o;
    while (streams[i]->pop(&o, std::chrono::seconds(60))) {
      EXPECT_FALSE(o.error.has_value()) << *o.error;
      for (const ChoiceDelta& d : o.choices) run.tokens[i].insert(run.tokens[i].end(), d.token_ids.begin(), d.token_ids.end());
      if (o.finished) break;
    }
  }
  run.metrics = engine->metrics();
  for (int i = 0; i < 500 && run.metrics.num_requests_running + run.metrics.num_requests_waiting > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    run.metrics = engine->metrics();
  }
  engine->shutdown();
  unsetenv("SPECULA_SAMPLED_DRAFT_CHAIN");
  unsetenv("SPECULA_FUSED_SAMPLED_CHAIN");
  return run;
}

void expect_chain_is_step_by_step(const std::string& spec) {
  auto tok = Tokenizer::from_dir(testing::models_dir() / "specula-tiny");
  std::vector<std::vector<int32_t>> prompts;
  for (const char* t : {"def main():", "The quick brown fox", "import numpy as np\n", "class Foo:", "for i in range("})
    prompts.push_back(tok->encode(t));
  const Run chained = seeded_run(spec, prompts, 48, Path::kChainGraphs);
  const Run stepped = seeded_run(spec, prompts, 48, Path::kStepByStep);
  const Run fused = seeded_run(spec, prompts, 48, Path::kChainFused);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(chained.tokens[i].size(), 48 - i);
    EXPECT_EQ(chained.tokens[i], stepped.tokens[i]) << "prompt " << i;
  }
  EXPECT_GT(chained.metrics.spec_num_draft_tokens, 50);
  EXPECT_GT(chained.metrics.spec_num_accepted_tokens, 0);
  EXPECT_EQ(chained.metrics.spec_num_draft_tokens, stepped.metrics.spec_num_draft_tokens);
  EXPECT_EQ(chained.metrics.spec_num_accepted_tokens, stepped.metrics.spec_num_accepted_tokens);

  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(fused.tokens[i].size(), 48 - i);
  auto rate = [](const EngineMetrics& m) {
    return static_cast<double>(m.spec_num_accepted_tokens) / static_cast<double>(m.spec_num_draft_tokens);
  };
  EXPECT_GT(fused.metrics.spec_num_draft_tokens, 50);
  EXPECT_NEAR(rate(fused.metrics), rate(chained.metrics), 0.15)
      << fused.metrics.spec_num_accepted_tokens << " of " << fused.metrics.spec_num_draft_tokens << " fused, "
      << chained.metrics.spec_num_accepted_tokens << " of " << chained.metrics.spec_num_draft_tokens << " as graphs";
}

TEST(CudaSampledChain, DraftModelDrawsWhatTheStepByStepPathDraws) {
  SKIP_WITHOUT_GPU();
  expect_chain_is_step_by_step(R"({"method": "draft_model", "model": ")" +
                               (testing::models_dir() / "specula-tiny-draft").string() +
                               R"(", "num_speculative_tokens": 3, "adaptive": false})");
}

TEST(CudaSampledChain, Eagle3DrawsWhatTheStepByStepPathDraws) {
  SKIP_WITHOUT_GPU();
  const fs::path head = testing::models_dir() / "specula-tiny-eagle3";
  if (!fs::exists(head / "model.safetensors")) GTEST_SKIP() << "models/specula-tiny-eagle3 missing";
  expect_chain_is_step_by_step(R"({"method": "eagle3", "model": ")" + head.string() +
                               R"(", "num_speculative_tokens": 3, "adaptive": false})");
}

}  // namespace
}  // namespace specula
