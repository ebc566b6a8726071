// --calculate-kv-scales: the scales a calibration prefill gives are each layer's largest |K| / 200
// and |V| / 100 of that prefill, computed independently here by running the same prompt through
// a paged runner with a full-precision cache; the tokens are the seed's; and the engine serves
// from an fp8 cache with them.
#include <gtest/gtest.h>

#include "engine/kv_cache_calibration.h"
#include "engine/llm_engine.h"
#include "model/config.h"
#include "model/weight_source.h"
#include "test_paths.h"
#include "unit/engine/greedy_streams.h"
#include "unit/model/deepseek_test_util.h"
#include "unit/spec_decode/reference_fixture.h"

namespace specula {
namespace {

std::filesystem::path tiny() { return testing::models_dir() / "specula-tiny"; }

TEST(KvCacheCalibration, ScalesAreThePrefillsLargestKAndVOverTheirConstants) {
  const ModelConfig config = load_model_config(tiny());
  auto weights = open_safetensors_checkpoint(tiny());
  auto backend = make_cpu_backend(2);
  auto model = create_model(config, *weights, *backend);
  const std::vector<int32_t> tokens = calibration_tokens(config.vocab_size, 100, 7);
  ASSERT_EQ(tokens, calibration_tokens(config.vocab_size, 100, 7));
  EXPECT_NE(tokens, calibration_tokens(config.vocab_size, 100, 8));
  for (int32_t t : tokens) ASSERT_TRUE(t >= 0 && t < config.vocab_size);

  const std::vector<KVCacheScales> scales = calibrate_kv_cache_scales(*model, *backend, tokens, 16);
  const testing::PromptRun run = testing::run_prompt(*model, *backend, tokens, /*steps=*/0, 1);
  ASSERT_EQ(scales.size(), run.cache_amax.size());
  ASSERT_EQ(scales.size(), static_cast<size_t>(config.num_hidden_layers));
  for (size_t l = 0; l < scales.size(); ++l) {
    EXPECT_FLOAT_EQ(scales[l].k, run.cache_amax[l].k / kKScaleConstant) << "layer " << l;
    EXPECT_FLOAT_EQ(scales[l].v, run.cache_amax[l].v / kVScaleConstant) << "layer " << l;
    EXPECT_GT(scales[l].k, 0.0f);
  }
}

std::vector<std::vector<int32_t>> greedy(bool calculate, const std::vector<std::vector<int32_t>>& prompts, int tokens) {
  EngineConfig c;
  c.model = tiny().string();
  c.device = "cpu";
  c.max_model_len = 512;
  c.max_num_seqs = 8;
  c.kv_cache_dtype = "fp8";
  c.calculate_kv_scales = calculate;
  auto engine = LLMEngine::create(c);
  engine->start();
  auto out = testing::greedy_streams(*engine, prompts, tokens, std::chrono::seconds(120));
  engine->shutdown();
  return out;
}

// The engine's fp8 cache takes the calculated scales (its tokens are not scale 1's) and still
// serves the embedded model: both continuations printed.
TEST(KvCacheCalibration, TheEngineServesFromTheCalculatedScales) {
  const auto ref = testing::read_greedy_reference(testing::fixtures_dir() / "embedded" / "specula-tiny" /
                                                  "reference.safetensors");
  const int tokens = static_cast<int>(ref.greedy[0].size());
  const auto unit = greedy(false, ref.prompts, tokens), calculated = greedy(true, ref.prompts, tokens);
  size_t unit_agree = 0, calculated_agree = 0, total = 0;
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    ASSERT_EQ(calculated[i].size(), ref.greedy[i].size());
    auto agree = [&](const std::vector<int32_t>& got) {
      size_t same = 0;
      while (same < got.size() && got[same] == ref.greedy[i][same]) ++same;
      return same;
    };
    unit_agree += agree(unit[i]);
    calculated_agree += agree(calculated[i]);
    total += ref.greedy[i].size();
  }
  std::printf("[ fp8 kv ] specula-tiny, tokens before the first difference from transformers: scale 1 %zu, "
              "calculated scales %zu, of %zu\n",
              unit_agree, calculated_agree, total);
  EXPECT_NE(calculated, unit);
  EXPECT_GE(calculated_agree * 2, total);
}

}  // namespace
}  // namespace specula
