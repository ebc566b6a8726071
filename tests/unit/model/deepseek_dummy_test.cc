// DeepSeek on `--load-format dummy` weights from the real configs in bench/configs: the
// DeepSeek-V2-Lite config at its real width, cut to 2 layers (one dense, one MoE), runs prefill
// and decode with finite logits; and shrunk V2-Lite / V3 configs (two shared experts, so that
// fusion has to cut the shared expert into two routed-width experts) give the same logits with
// shared-expert fusion off, on x1 and on x3.
#include <gtest/gtest.h>

#include <cmath>

#include "deepseek_test_util.h"
#include "model/config.h"
#include "small_configs.h"
#include "test_paths.h"

namespace specula {
namespace {

ModelConfig bench_config(const std::string& name) {
  return load_model_config(specula::testing::source_dir() / "bench" / "configs" / name / "config.json");
}

std::vector<int32_t> some_prompt(int64_t vocab, int n) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((7919 * (i + 3)) % vocab));
  return p;
}

TEST(DeepseekDummy, V2LiteAtRealWidthTwoLayersRuns) {
  ModelConfig c = bench_config("DeepSeek-V2-Lite");
  ASSERT_EQ(c.arch, Architecture::kDeepseekV2);
  c.num_hidden_layers = 2;  // layer 0 dense (first_k_dense_replace = 1), layer 1 MoE
  auto weights = make_dummy_weight_source(c, 0);
  auto backend = make_cpu_backend(2);
  auto model = create_model(c, *weights, *backend);
  EXPECT_EQ(model->kv_cache_spec().head_dim, 512 + 64);
  auto run = testing::run_prompt(*model, *backend, some_prompt(c.vocab_size, 12), 2, 1);
  ASSERT_EQ(run.prompt_logits.size(), static_cast<size_t>(12 * c.vocab_size));
  double lo = 1e30, hi = -1e30;
  for (float x : run.prompt_logits) {
    ASSERT_TRUE(std::isfinite(x));
    lo = std::min<double>(lo, x);
    hi = std::max<double>(hi, x);
  }
  EXPECT_GT(hi - lo, 1e-3);  // not a constant
  for (int32_t t : run.greedy) EXPECT_LT(t, c.vocab_size);
}


void expect_fusion_lossless(const ModelConfig& c) {
  auto backend = make_cpu_backend(2);
  const auto prompt = some_prompt(c.vocab_size, 21);
  std::vector<float> unfused;
  std::vector<int32_t> greedy;
  for (int fusion : {0, 1, 3}) {
    auto weights = make_dummy_weight_source(c, 7);
    auto model = create_model(c, *weights, *backend, ModelOptions{fusion});
    auto run = testing::run_prompt(*model, *backend, prompt, 4, 2);
    for (float x : run.prompt_logits) ASSERT_TRUE(std::isfinite(x));
    if (fusion == 0) {
      unfused = run.prompt_logits;
      greedy = run.greedy;
      continue;
    }
    EXPECT_LE(testing::relative_error(run.prompt_logits, unfused), 2e-6) << architecture_name(c.arch) << " x" << fusion;
    EXPECT_EQ(run.greedy, greedy) << architecture_name(c.arch) << " x" << fusion;
  }
}

TEST(DeepseekDummy, SplitSharedExpertFusionIsLosslessForV2Lite) {
  ModelConfig c = testing::shrink_deepseek_config(bench_config("DeepSeek-V2-Lite"), /*shared=*/2);  // V2-Lite's own count
  expect_fusion_lossless(c);
}

TEST(DeepseekDummy, SplitSharedExpertFusionIsLosslessForV3) {
  ModelConfig c = testing::shrink_deepseek_config(bench_config("DeepSeek-V3"), /*shared=*/3);
  ASSERT_EQ(c.arch, Architecture::kDeepseekV3);
  ASSERT_TRUE(c.q_lora_rank.has_value());
  expect_fusion_lossless(c);
}

}  // namespace
}  // namespace specula
