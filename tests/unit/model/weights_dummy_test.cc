// make_dummy_weight_source: deterministic per (seed, name), sensibly scaled, chunk-independent,
// generated straight into BF16, fast at real sizes.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "model/config.h"
#include "model/dummy_weights.h"
#include "model/weight_source.h"
#include "test_paths.h"
#include "weights_test_util.h"

namespace specula {
namespace {

using testing::MemoryBackend;

ModelConfig qwen3_8b() {
  return load_model_config(testing::source_dir() / "bench" / "configs" / "Qwen3-8B");
}

TEST(DummyWeights, DeterministicPerSeedAndName) {
  ModelConfig c = qwen3_8b();
  MemoryBackend cpu;
  auto a = make_dummy_weight_source(c, 0), b = make_dummy_weight_source(c, 0), other = make_dummy_weight_source(c, 1);
  const std::string name = "model.layers.0.mlp.down_proj.weight";
  std::vector<float> x = a->load(name, {64, 96}, DType::kF32, cpu).to_f32_vector();
  EXPECT_EQ(x, b->load(name, {64, 96}, DType::kF32, cpu).to_f32_vector());
  EXPECT_NE(x, other->load(name, {64, 96}, DType::kF32, cpu).to_f32_vector());
  EXPECT_NE(x, a->load("model.layers.1.mlp.down_proj.weight", {64, 96}, DType::kF32, cpu).to_f32_vector());
  EXPECT_EQ(a->describe(), "dummy weights (seed 0)");
  EXPECT_EQ(a->names(), std::vector<std::string>({"model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"}));
}

TEST(DummyWeights, MatricesAreUniformInPlusMinusOneOverSqrtIn) {
  MemoryBackend cpu;
  auto src = make_dummy_weight_source(qwen3_8b(), 42);
  const int64_t out = 512, in = 4096;
  std::vector<float> w = src->load("model.layers.3.self_attn.q_proj.weight", {out, in}, DType::kF32, cpu).to_f32_vector();
  const double bound = 1.0 / std::sqrt(double(in));
  double sum = 0, sq = 0, maxabs = 0;
  for (float v : w) {
    sum += v;
    sq += double(v) * v;
    maxabs = std::max(maxabs, double(std::fabs(v)));
  }
  const double n = double(w.size());
  EXPECT_LE(maxabs, bound);
  EXPECT_GT(maxabs, 0.999 * bound);
  EXPECT_NEAR(sum / n, 0.0, 0.01 * bound);
  // U(-b, b) has variance b^2 / 3.
  EXPECT_NEAR(std::sqrt(sq / n), bound / std::sqrt(3.0), 0.01 * bound);
  // Roughly flat histogram over 8 bins.
  std::vector<int> bins(8);
  for (float v : w) bins[std::min(7, int((v / bound + 1.0) * 4.0))]++;
  for (int b : bins) EXPECT_NEAR(b / n, 0.125, 0.005);
}

TEST(DummyWeights, NormsAreOneBiasesSmall) {
  MemoryBackend cpu;
  ModelConfig c = qwen3_8b();
  auto src = make_dummy_weight_source(c, 7);
  for (const char* name : {"model.norm.weight", "model.layers.0.input_layernorm.weight",
                           "model.layers.0.post_attention_layernorm.weight", "model.layers.0.self_attn.q_norm.weight",
                           "model.layers.0.self_attn.k_norm.weight", "model.layers.2.self_attn.kv_a_layernorm.weight"}) {
    for (float v : src->load(name, {128}, DType::kBF16, cpu).to_f32_vector()) ASSERT_EQ(v, 1.0f) << name;
  }
  std::vector<float> bias = src->load("model.layers.0.self_attn.q_proj.bias", {4096}, DType::kF32, cpu).to_f32_vector();
  double maxabs = 0;
  for (float v : bias) maxabs = std::max(maxabs, double(std::fabs(v)));
  EXPECT_LE(maxabs, 0.02);
  EXPECT_GT(maxabs, 0.015);
  std::vector<float> corr =
      src->load("model.layers.5.mlp.gate.e_score_correction_bias", {256}, DType::kF32, cpu).to_f32_vector();
  maxabs = 0;
  for (float v : corr) maxabs = std::max(maxabs, double(std::fabs(v)));
  EXPECT_LE(maxabs, 0.01);
  EXPECT_GT(maxabs, 0.0);
  // Stacked expert weights scale by their last (input) dim too.
  std::vector<float> experts = src->load("model.layers.5.mlp.experts.w2", {4, 64, 256}, DType::kF32, cpu).to_f32_vector();
  for (float v : experts) ASSERT_LE(std::fabs(v), 1.0 / 16.0);
}

TEST(DummyWeights, Bf16IsTheRoundedF32AndChunkingDoesNotMatter) {
  MemoryBackend cpu;
  auto src = make_dummy_weight_source(qwen3_8b(), 3);
  const Shape shape = {3, 50000};  // several generation chunks with a ragged tail
  std::vector<float> f32 = src->load("lm_head.weight", shape, DType::kF32, cpu).to_f32_vector();
  Tensor bf16 = src->load("lm_head.weight", shape, DType::kBF16, cpu);
  Tensor f16 = src->load("lm_head.weight", shape, DType::kF16, cpu);
  ASSERT_EQ(bf16.dtype(), DType::kBF16);
  for (size_t i = 0; i < f32.size(); ++i) {
    ASSERT_EQ(bf16.data_as<uint16_t>()[i], f32_to_bf16(f32[i])) << i;
    ASSERT_EQ(f16.data_as<uint16_t>()[i], f32_to_f16(f32[i])) << i;
  }
  // Any split of the element range reproduces the same values.
  DummyInit init = dummy_init_for("w", {8, 100});
  std::vector<float> whole(70000), parts(70000);
  fill_dummy_values(init, 12345, DType::kF32, whole.data(), 0, whole.size());
  fill_dummy_values(init, 12345, DType::kF32, parts.data(), 0, 30001);
  fill_dummy_values(init, 12345, DType::kF32, parts.data() + 30001, 30001, 39999);
  EXPECT_EQ(whole, parts);
}

TEST(DummyWeights, DeviceUploadMatchesCpu) {
  testing::FakeDeviceScope device;
  MemoryBackend cpu, gpu(Device::kCUDA);
  auto src = make_dummy_weight_source(qwen3_8b(), 5);
  Tensor host = src->load("model.embed_tokens.weight", {1000, 128}, DType::kBF16, cpu);
  Tensor dev = src->load("model.embed_tokens.weight", {1000, 128}, DType::kBF16, gpu);
  EXPECT_EQ(dev.device(), Device::kCUDA);
  EXPECT_GE(gpu.copies, 1);
  EXPECT_EQ(testing::host_values(dev), host.to_f32_vector());
}

TEST(DummyWeights, HasFollowsTheConfig) {
  ModelConfig qwen3 = qwen3_8b();
  auto src = make_dummy_weight_source(qwen3, 0);
  EXPECT_TRUE(src->has("lm_head.weight"));  // Qwen3-8B does not tie
  EXPECT_TRUE(src->has("model.layers.0.self_attn.q_norm.weight"));
  EXPECT_FALSE(src->has("model.layers.0.self_attn.q_proj.bias"));
  EXPECT_TRUE(src->has("model.layers.0.mlp.gate_proj.weight"));
  ModelConfig tied = load_model_config(testing::source_dir() / "bench" / "configs" / "Qwen3-0.6B");
  EXPECT_FALSE(make_dummy_weight_source(tied, 0)->has("lm_head.weight"));
  ModelConfig v3 = load_model_config(testing::source_dir() / "bench" / "configs" / "DeepSeek-V3");
  auto ds = make_dummy_weight_source(v3, 0);
  EXPECT_TRUE(ds->has("model.layers.3.mlp.gate.e_score_correction_bias"));
  EXPECT_TRUE(ds->has("model.layers.0.self_attn.q_a_proj.weight"));
  EXPECT_FALSE(ds->has("model.layers.0.self_attn.q_proj.weight"));
  ModelConfig v2 = load_model_config(testing::source_dir() / "bench" / "configs" / "DeepSeek-V2-Lite");
  auto ds2 = make_dummy_weight_source(v2, 0);
  EXPECT_FALSE(ds2->has("model.layers.3.mlp.gate.e_score_correction_bias"));
  EXPECT_TRUE(ds2->has("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_FALSE(ds2->has("model.layers.0.self_attn.q_a_proj.weight"));
}

TEST(DummyWeights, RejectsNonFloatDtypes) {
  MemoryBackend cpu;
  auto src = make_dummy_weight_source(qwen3_8b(), 0);
  testing::expect_error_mentions([&] { src->load("ids", {4}, DType::kI32, cpu); }, {"'ids'", "I32"});
}

// One Llama-3.1-8B MLP matrix (58.7 M parameters) straight to BF16. How long it took is recorded
// (load_seconds in the XML output), not asserted: a speed figure on a shared machine belongs to a
// benchmark, not to a unit test.
TEST(DummyWeights, LoadsRealSizes) {
  MemoryBackend cpu;
  auto src = make_dummy_weight_source(qwen3_8b(), 0);
  auto t0 = std::chrono::steady_clock::now();
  Tensor w = src->load("model.layers.0.mlp.gate_proj.weight", {14336, 4096}, DType::kBF16, cpu);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  RecordProperty("load_seconds", std::to_string(secs));
  EXPECT_EQ(w.numel(), 14336LL * 4096);
  float first = bf16_to_f32(w.data_as<uint16_t>()[0]), last = bf16_to_f32(w.data_as<uint16_t>()[w.numel() - 1]);
  EXPECT_NE(first, last);
  EXPECT_LE(std::fabs(last), 1.0 / 64.0);
}

}  // namespace
}  // namespace specula
