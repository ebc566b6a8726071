// LLMEngine::create on the GPU: the memory plan sizes the KV cache from --gpu-memory-utilization
// (and refuses, naming the sizes, when one sequence cannot fit); decode graphs are captured unless
// enforce_eager, and both modes serve the embedded models with transformers' greedy tokens (the
// issue's bar: the first 32), and each other's on any prompts.
#include <gtest/gtest.h>

#include <cstdio>

#include "engine/llm_engine.h"
#include "engine/memory_plan.h"
#include "model/model.h"
#include "test_paths.h"
#include "unit/engine/greedy_streams.h"
#include "tokenizer/tokenizer.h"
#include "unit/backend/cuda/cuda_test_util.h"
#include "unit/spec_decode/reference_fixture.h"

namespace specula {
namespace {

EngineConfig tiny_config(const std::string& device) {
  EngineConfig c;
  c.model = (testing::models_dir() / "specula-tiny").string();
  c.device = device;
  c.max_model_len = 512;
  c.max_num_seqs = 8;
  c.gpu_memory_utilization = 0.3;
  return c;
}

std::vector<std::vector<int32_t>> run_engine(EngineConfig c, bool eager,
                                             const std::vector<std::vector<int32_t>>& prompts, int tokens) {
  c.enforce_eager = eager;
  auto engine = LLMEngine::create(c);
  engine->start();
  auto out = testing::greedy_streams(*engine, prompts, tokens);
  engine->shutdown();
  return out;
}

// The bar: the embedded models' greedy continuations on the GPU equal transformers' (up
// to a bf16 near-tie, reference_fixture.h), with and without decode graphs, the reference prompts
// running as one batch.
TEST(CudaEngine, EmbeddedModelsGreedyEqualsTransformersWithAndWithoutGraphs) {
  SKIP_WITHOUT_GPU();
  for (const char* name : {"specula-tiny", "specula-tiny-draft"}) {
    const auto ref = testing::read_greedy_reference(testing::fixtures_dir() / "embedded" / name /
                                                    "reference.safetensors");
    ASSERT_FALSE(ref.prompts.empty()) << name;
    EngineConfig c = tiny_config("cuda");
    c.model = (testing::models_dir() / name).string();
    for (bool eager : {true, false}) {
      const auto got = run_engine(c, eager, ref.prompts, static_cast<int>(ref.greedy[0].size()));
      for (size_t i = 0; i < ref.prompts.size(); ++i)
        EXPECT_TRUE(testing::greedy_matches(got[i], ref, i, testing::kBf16NearTie)) << name << " prompt " << i << (eager ? " (eager)" : " (graphs)");
    }
  }
}

// Any prompts: decode graphs (padded batches of 1, 3 -> 4, 5 -> 8) give the eager engine's tokens.
TEST(CudaEngine, GraphsGiveTheEagerEnginesTokens) {
  SKIP_WITHOUT_GPU();
  const EngineConfig c = tiny_config("cuda");
  auto tok = Tokenizer::from_dir(c.model);
  const std::vector<std::string> texts{"The quick brown fox", "Once upon a time,", "def main():", "A B C D E F",
                                       "In 1492"};
  for (size_t batch : {1u, 3u, 5u}) {
    std::vector<std::vector<int32_t>> prompts;
    for (size_t i = 0; i < batch; ++i) prompts.push_back(tok->encode(texts[i]));
    const auto eager = run_engine(c, true, prompts, 32);
    const auto graphs = run_engine(c, false, prompts, 32);
    for (size_t i = 0; i < batch; ++i) {
      EXPECT_EQ(eager[i].size(), 32u);
      EXPECT_EQ(graphs[i], eager[i]) << "batch " << batch << " prompt " << i;
    }
  }
}

// --kv-cache-dtype fp8 on the GPU: decode graphs give the eager engine's tokens (both read the
// e4m3 cache through the same kernels), and the embedded model's continuations follow the bf16
// cache's for most tokens (printed).
TEST(CudaEngine, Fp8KvCacheGraphsGiveTheEagerTokensCloseToBf16) {
  SKIP_WITHOUT_GPU();
  EngineConfig c = tiny_config("cuda");
  const auto ref = testing::read_greedy_reference(testing::fixtures_dir() / "embedded" / "specula-tiny" /
                                                  "reference.safetensors");
  const int tokens = static_cast<int>(ref.greedy[0].size());
  const auto bf16 = run_engine(c, false, ref.prompts, tokens);
  c.kv_cache_dtype = "fp8";
  const auto eager = run_engine(c, true, ref.prompts, tokens), graphs = run_engine(c, false, ref.prompts, tokens);
  size_t agree = 0, total = 0;
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    EXPECT_EQ(graphs[i], eager[i]) << "prompt " << i;
    size_t same = 0;
    while (same < bf16[i].size() && same < graphs[i].size() && graphs[i][same] == bf16[i][same]) ++same;
    agree += same;
    total += bf16[i].size();
  }
  std::printf("[ fp8 kv ] specula-tiny on the GPU: greedy tokens before the first difference from the bf16 cache "
              "%zu of %zu\n",
              agree, total);
  EXPECT_GE(agree * 2, total);
}

TEST(CudaEngine, KvCacheTakesWhatGpuMemoryUtilizationLeaves) {
  SKIP_WITHOUT_GPU();
  const size_t total = make_cuda_backend(0)->memory_info().value().total;
  EngineConfig c = tiny_config("cuda");
  auto engine = LLMEngine::create(c);
  const ModelConfig& mc = engine->model_config();
  const size_t per_block = static_cast<size_t>(c.block_size) * 2 * mc.num_hidden_layers * mc.num_key_value_heads *
                           mc.head_dim * 2;  // K and V, bf16
  const size_t kv = static_cast<size_t>(engine->metrics().num_gpu_blocks) * per_block;
  const double budget = c.gpu_memory_utilization * static_cast<double>(total);
  EXPECT_LE(static_cast<double>(kv), budget);
  // A 2 MB model: what is not KV cache is the CUDA context, libraries, activations and reserve.
  EXPECT_GE(static_cast<double>(kv), budget - 3.0 * (1ull << 30)) << "KV cache " << gib(kv) << " of " << gib(budget);
}

TEST(CudaEngine, ATooSmallUtilizationIsAnErrorNamingTheSizes) {
  SKIP_WITHOUT_GPU();
  EngineConfig c = tiny_config("cuda");
  c.gpu_memory_utilization = 0.001;
  try {
    LLMEngine::create(c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* part : {"does not fit", "weights", "activations", "--gpu-memory-utilization", "512 tokens"})
      EXPECT_NE(msg.find(part), std::string::npos) << part << " missing from: " << msg;
  }
}

}  // namespace
}  // namespace specula
