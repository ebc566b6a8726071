// LLMEngine::create on the GPU: the memory plan sizes the KV cache from --gpu-memory-utilization
// (and refuses, naming the sizes, when one sequence cannot fit), decode graphs are captured
// unless enforce_eager, and both modes serve the embedded model with the same greedy tokens as
// the CPU engine (the bar: the first 32 tokens).
#include <gtest/gtest.h>

#include "engine/llm_engine.h"
#include "engine/memory_plan.h"
#include "model/model.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"
#include "unit/cuda/cuda_test_util.h"

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

std::vector<std::vector<int32_t>> greedy(LLMEngine& engine, const std::vector<std::string>& texts, int tokens) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < texts.size(); ++i) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = tokens;
    p.ignore_eos = true;
    streams.push_back(engine.add_request(NewRequest{"g" + std::to_string(i), engine.tokenizer().encode(texts[i]), p}));
  }
  std::vector<std::vector<int32_t>> out(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    RequestOutput o;
    while (streams[i]->pop(&o, std::chrono::seconds(60))) {
      EXPECT_FALSE(o.error.has_value()) << *o.error;
      for (const ChoiceDelta& d : o.choices) out[i].insert(out[i].end(), d.token_ids.begin(), d.token_ids.end());
      if (o.finished) break;
    }
  }
  return out;
}

TEST(CudaEngine, GreedyTokensWithGraphsEagerAndOnTheCpuAgree) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::string> texts{"The quick brown fox", "Once upon a time,", "def main():", "A B C D E F"};
  std::vector<std::vector<std::vector<int32_t>>> runs;
  for (const char* mode : {"cpu", "cuda-eager", "cuda-graphs"}) {
    EngineConfig c = tiny_config(std::string(mode).substr(0, std::string(mode).find('-')));
    c.enforce_eager = std::string(mode) == "cuda-eager";
    auto engine = LLMEngine::create(c);
    engine->start();
    runs.push_back(greedy(*engine, texts, 32));
    engine->shutdown();
  }
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(runs[0][i].size(), 32u);
    EXPECT_EQ(runs[1][i], runs[0][i]) << "eager CUDA vs CPU, prompt " << i;
    EXPECT_EQ(runs[2][i], runs[0][i]) << "CUDA graphs vs CPU, prompt " << i;
  }
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
