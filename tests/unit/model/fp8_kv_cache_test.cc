// The fp8 KV cache at the model level:
//   * the trained embedded model over an e4m3 cache (scale 1) against its fp32 cache on the
//     transformers reference prompts: prompt logits within a stated share of their scale, greedy
//     agreement printed;
//   * a checkpoint's scales (Model::kv_cache_scales), under each name checkpoints give them:
//     llm-compressor / vLLM's self_attn.k_scale and v_scale, one self_attn.kv_scale for both,
//     AutoFP8's k_proj.output_scale and v_proj.output_scale; and what is refused, naming the tensor.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>

#include "backend/backend.h"
#include "deepseek_test_util.h"
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

// Every prompt position's logits, each cache written and read by the prefill itself, then 16
// greedy tokens. e4m3 keeps 3 mantissa bits (a relative step of 2^-3 .. 2^-4 per element), so
// the logits move by a few percent of their scale; a trained model's argmax mostly holds. Scales
// calibrated as llm-compressor does (each layer's largest |K| and |V| over 448, here from the
// fp32 run of the same prompt) use e4m3's whole range and must do no worse. Figures are printed.
TEST(Fp8KvCache, TheEmbeddedModelStaysCloseToItsFp32Cache) {
  const auto dir = testing::models_dir() / "specula-tiny";
  auto ref = SafetensorsFile::open(testing::fixtures_dir() / "embedded" / "specula-tiny" / "reference.safetensors");
  const ModelConfig config = load_model_config(dir);
  auto weights = open_safetensors_checkpoint(dir);
  auto backend = make_cpu_backend(2);
  auto model = create_model(config, *weights, *backend);
  struct Tally {
    double worst = 0;
    size_t agree = 0, total = 0;
    void add(const testing::PromptRun& got, const testing::PromptRun& want) {
      worst = std::max(worst, testing::relative_error(got.prompt_logits, want.prompt_logits));
      size_t same = 0;
      while (same < want.greedy.size() && got.greedy[same] == want.greedy[same]) ++same;
      agree += same;
      total += want.greedy.size();
    }
  } unit_scale, calibrated;
  for (int i = 0;; ++i) {
    const SafetensorsEntry* e = ref->find("prompt_" + std::to_string(i));
    if (e == nullptr) break;
    std::vector<int32_t> prompt(static_cast<size_t>(e->numel()));
    std::memcpy(prompt.data(), ref->data(*e), e->nbytes());
    const auto full = testing::run_prompt(*model, *backend, prompt, 16, 5);
    unit_scale.add(testing::run_prompt(*model, *backend, prompt, 16, 5, {DType::kF8E4M3, {}}), full);
    std::vector<KVCacheScales> scales;
    for (const KVCacheScales& amax : full.cache_amax) scales.push_back({amax.k / 448, amax.v / 448});
    calibrated.add(testing::run_prompt(*model, *backend, prompt, 16, 5, {DType::kF8E4M3, scales}), full);
  }
  ASSERT_GT(unit_scale.total, 0u);
  for (const auto& [name, t] : {std::pair{"scale 1", unit_scale}, std::pair{"calibrated scales", calibrated}}) {
    std::printf("[ fp8 kv ] specula-tiny, %s: prompt logits within %.4f of their scale; greedy tokens before the "
                "first difference %zu of %zu\n",
                name, t.worst, t.agree, t.total);
  }
  EXPECT_LE(unit_scale.worst, 0.1);
  EXPECT_GT(unit_scale.worst, 0.0);
  EXPECT_GE(unit_scale.agree * 2, unit_scale.total);
  EXPECT_LE(calibrated.worst, unit_scale.worst);
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
