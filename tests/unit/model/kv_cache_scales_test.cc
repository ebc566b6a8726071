// A checkpoint's fp8 KV cache scales (Model::kv_cache_scales), under each name checkpoints give
// them: llm-compressor / vLLM's self_attn.k_scale and v_scale, one self_attn.kv_scale for both,
// AutoFP8's k_proj.output_scale and v_proj.output_scale; and what is refused, naming the tensor.
#include <gtest/gtest.h>

#include <fstream>

#include "backend/backend.h"
#include "model/config.h"
#include "model/model.h"
#include "model/weight_source.h"
#include "test_paths.h"
#include "weights_test_util.h"

namespace specula {
namespace {

using testing::TempDir;
using Tensors = std::vector<std::pair<std::string, Tensor>>;

std::filesystem::path fixture() { return testing::fixtures_dir() / "models" / "llama"; }

// The llama fixture (2 layers) with `extra` tensors added, loaded on the CPU.
std::unique_ptr<Model> load_with(const TempDir& tmp, const Tensors& extra) {
  Tensors tensors = testing::read_checkpoint_f32(fixture());
  tensors.insert(tensors.end(), extra.begin(), extra.end());
  nlohmann::json config = nlohmann::json::parse(std::ifstream(fixture() / "config.json"));
  testing::write_checkpoint(tmp / "m", config, tensors);
  const ModelConfig c = load_model_config(tmp / "m");
  auto weights = open_safetensors_checkpoint(tmp / "m");
  static std::unique_ptr<Backend> backend = make_cpu_backend(1);
  return create_model(c, *weights, *backend);
}

Tensor scalar(float v) { return Tensor::from_f32({v}, Shape{}); }
std::string layer(int i) { return "model.layers." + std::to_string(i) + ".self_attn."; }

TEST(KvCacheScales, ReadUnderEveryNameCheckpointsUse) {
  TempDir tmp;
  auto scales = load_with(tmp, {})->kv_cache_scales();
  EXPECT_TRUE(scales.empty()) << "a checkpoint without scales has none";

  scales = load_with(tmp, {{layer(0) + "k_scale", scalar(0.5f)}, {layer(0) + "v_scale", scalar(0.25f)},
                           {layer(1) + "k_scale", scalar(2.0f)}, {layer(1) + "v_scale", Tensor::from_f32({4.0f}, {1})}})
               ->kv_cache_scales();
  ASSERT_EQ(scales.size(), 2u);
  EXPECT_EQ(scales[0].k, 0.5f);
  EXPECT_EQ(scales[0].v, 0.25f);
  EXPECT_EQ(scales[1].k, 2.0f);
  EXPECT_EQ(scales[1].v, 4.0f);

  scales = load_with(tmp, {{layer(0) + "kv_scale", scalar(0.125f)}, {layer(1) + "kv_scale", scalar(3.0f)}})
               ->kv_cache_scales();
  ASSERT_EQ(scales.size(), 2u);
  EXPECT_EQ(scales[0].k, 0.125f);
  EXPECT_EQ(scales[0].v, 0.125f);
  EXPECT_EQ(scales[1].v, 3.0f);

  scales = load_with(tmp, {{layer(0) + "k_proj.output_scale", scalar(0.75f)},
                           {layer(0) + "v_proj.output_scale", scalar(1.5f)},
                           {layer(1) + "k_proj.output_scale", scalar(0.75f)},
                           {layer(1) + "v_proj.output_scale", scalar(1.5f)}})
               ->kv_cache_scales();
  ASSERT_EQ(scales.size(), 2u);
  EXPECT_EQ(scales[1].k, 0.75f);
  EXPECT_EQ(scales[1].v, 1.5f);
}

TEST(KvCacheScales, IncompleteOrInvalidScalesAreErrorsNamingTheTensor) {
  TempDir tmp;
  testing::expect_error_mentions(
      [&] { load_with(tmp, {{layer(0) + "k_scale", scalar(0.5f)}}); },
      {"'model.layers.0.self_attn.k_scale' has no V scale beside it"});
  testing::expect_error_mentions(
      [&] { load_with(tmp, {{layer(0) + "k_scale", scalar(0.5f)}, {layer(0) + "v_scale", scalar(0.0f)}}); },
      {"KV cache scale 'model.layers.0.self_attn.v_scale' is 0: it must be positive"});
  testing::expect_error_mentions(
      [&] { load_with(tmp, {{layer(0) + "kv_scale", Tensor::from_f32({1.0f, 2.0f}, {2})}}); },
      {"'model.layers.0.self_attn.kv_scale' has shape [2]: expected one value"});
  testing::expect_error_mentions(
      [&] { load_with(tmp, {{layer(0) + "kv_scale", scalar(1.0f)}})->kv_cache_scales(); },
      {"layer 0 has KV cache scales", "but layer 1 has none"});
}

}  // namespace
}  // namespace specula
