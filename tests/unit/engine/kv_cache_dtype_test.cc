// --kv-cache-dtype: which names resolve to which cache type, what is refused and how it says so,
// and the embedded model served from an fp8 cache (CPU) against the same engine in full precision.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/kv_cache_dtype.h"
#include "engine/llm_engine.h"
#include "test_paths.h"
#include "unit/engine/greedy_streams.h"
#include "unit/model/weights_test_util.h"
#include "unit/spec_decode/reference_fixture.h"

namespace specula {
namespace {

using testing::expect_error_mentions;

TEST(KvCacheDtype, NamesResolveToTheComputeTypeOrFp8) {
  EXPECT_EQ(kv_cache_dtype_of("auto", DType::kBF16), DType::kBF16);
  EXPECT_EQ(kv_cache_dtype_of("auto", DType::kF32), DType::kF32);
  EXPECT_EQ(kv_cache_dtype_of("bfloat16", DType::kBF16), DType::kBF16);
  EXPECT_EQ(kv_cache_dtype_of("float32", DType::kF32), DType::kF32);
  EXPECT_EQ(kv_cache_dtype_of("fp8", DType::kBF16), DType::kF8E4M3);
  EXPECT_EQ(kv_cache_dtype_of("fp8_e4m3", DType::kF32), DType::kF8E4M3);
}

TEST(KvCacheDtype, WhatIsNotSupportedIsRefusedNamingIt) {
  expect_error_mentions([] { kv_cache_dtype_of("fp8_e5m2", DType::kBF16); },
                        {"--kv-cache-dtype fp8_e5m2: not supported; the fp8 cache is e4m3"});
  expect_error_mentions([] { kv_cache_dtype_of("bfloat16", DType::kF32); }, {"kept in the compute type (F32) or in fp8"});
  expect_error_mentions([] { kv_cache_dtype_of("int4", DType::kBF16); }, {"expected auto, fp8, fp8_e4m3"});
  const KVCacheSpec mla{27, 1, 576, 0}, llama{32, 8, 128, 128};
  EXPECT_NO_THROW(check_kv_cache_dtype_fits(DType::kF8E4M3, DType::kBF16, llama, "fp8"));
  EXPECT_NO_THROW(check_kv_cache_dtype_fits(DType::kBF16, DType::kBF16, mla, "auto"));
  expect_error_mentions([&] { check_kv_cache_dtype_fits(DType::kF8E4M3, DType::kBF16, mla, "fp8"); },
                        {"--kv-cache-dtype fp8: the model's MLA latent cache is kept in the compute type (BF16)"});
}

// A DeepSeek checkpoint is refused after its config is read, naming the MLA cache.
TEST(KvCacheDtype, AnMlaModelRefusesFp8) {
  EngineConfig c;
  c.model = (testing::fixtures_dir() / "models" / "deepseek_v2_greedy").string();
  c.device = "cpu";
  c.max_model_len = 128;
  c.kv_cache_dtype = "fp8";
  c.skip_tokenizer_init = true;
  expect_error_mentions([&] { LLMEngine::create(c); }, {"MLA latent cache"});
}

std::filesystem::path tiny() { return testing::models_dir() / "specula-tiny"; }

std::vector<std::vector<int32_t>> greedy(const std::string& kv_cache_dtype,
                                         const std::vector<std::vector<int32_t>>& prompts, int tokens,
                                         const std::filesystem::path& model = tiny(), int tensor_parallel_size = 1) {
  EngineConfig c;
  c.model = model.string();
  c.tensor_parallel_size = tensor_parallel_size;
  c.skip_tokenizer_init = true;  // prompts are token ids; a rewritten checkpoint has no tokenizer
  c.device = "cpu";
  c.max_model_len = 512;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 48;  // chunked prefill: later chunks read earlier ones from the cache
  c.kv_cache_dtype = kv_cache_dtype;
  auto engine = LLMEngine::create(c);
  engine->start();
  auto out = testing::greedy_streams(*engine, prompts, tokens, std::chrono::seconds(120));
  engine->shutdown();
  return out;
}

// The trained embedded model from an e4m3 cache with scale 1 (vLLM's default without calibrated
// scales): its greedy continuations of the transformers reference prompts follow full precision
// for most tokens (e4m3 keeps 3 mantissa bits, so a continuation may leave at a near-tie); the
// figures are printed.
TEST(KvCacheDtype, Fp8CacheServesTheEmbeddedModelCloseToFullPrecision) {
  const auto ref = testing::read_greedy_reference(testing::fixtures_dir() / "embedded" / "specula-tiny" /
                                                  "reference.safetensors");
  ASSERT_FALSE(ref.prompts.empty());
  const int tokens = static_cast<int>(ref.greedy[0].size());
  const auto full = greedy("auto", ref.prompts, tokens), fp8 = greedy("fp8", ref.prompts, tokens);
  size_t agree = 0, total = 0;
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    EXPECT_TRUE(testing::greedy_matches(full[i], ref, i, 0.0)) << "prompt " << i << " (full precision)";
    ASSERT_EQ(fp8[i].size(), full[i].size());
    size_t same = 0;
    while (same < full[i].size() && fp8[i][same] == full[i][same]) ++same;
    agree += same;
    total += full[i].size();
  }
  std::printf("[ fp8 kv ] specula-tiny: greedy tokens before the first difference from full precision %zu of %zu\n",
              agree, total);
  EXPECT_GE(agree * 2, total);
}

// The checkpoint's k_scale / v_scale reach an fp8 cache and nothing else: scales of 1 give the
// tokens of no scales, scales of 1e-4 (every element saturates at 448 x 1e-4) change them, on one
// rank and on two, and a cache in the compute type ignores them.
TEST(KvCacheDtype, AnFp8CacheTakesTheCheckpointsScales) {
  const auto ref = testing::read_greedy_reference(testing::fixtures_dir() / "embedded" / "specula-tiny" /
                                                  "reference.safetensors");
  const auto tensors = testing::read_checkpoint_f32(tiny());
  const nlohmann::json config = nlohmann::json::parse(std::ifstream(tiny() / "config.json"));
  const int layers = config["num_hidden_layers"];
  testing::TempDir tmp;
  auto with_scales = [&](const std::string& name, float scale) {
    auto t = tensors;
    for (int i = 0; i < layers; ++i) {
      for (const char* which : {"k_scale", "v_scale"}) {
        t.emplace_back("model.layers." + std::to_string(i) + ".self_attn." + which,
                       Tensor::from_f32({scale}, Shape{}));
      }
    }
    testing::write_checkpoint(tmp / name, config, t);
    return tmp / name;
  };
  const auto ones = with_scales("ones", 1.0f), tiny_scales = with_scales("tiny", 1e-4f);
  const int tokens = 16;
  const auto fp8 = greedy("fp8", ref.prompts, tokens);
  EXPECT_EQ(greedy("fp8", ref.prompts, tokens, ones), fp8);
  const auto scaled = greedy("fp8", ref.prompts, tokens, tiny_scales);
  EXPECT_NE(scaled, fp8);
  EXPECT_EQ(greedy("auto", ref.prompts, tokens, tiny_scales), greedy("auto", ref.prompts, tokens));
  // Under tensor parallelism too (the checkpoint's scalars load unsplit; ranks copy rank 0's cache
  // type and scales).
  EXPECT_NE(greedy("fp8", ref.prompts, tokens, tiny_scales, 2), greedy("fp8", ref.prompts, tokens, tiny(), 2));
}

}  // namespace
}  // namespace specula
