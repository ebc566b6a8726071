// FP8 weights for Llama / Qwen models, on the transformers fixtures:
//   * an FP8 checkpoint in the layouts HF / AutoFP8 (quant_method "fp8", a per-tensor scalar
//     weight_scale) and llm-compressor (quant_method "compressed-tensors", per-channel [N, 1]
//     scales, an ignore list) write gives the logits of a plain checkpoint holding the dequantised
//     weights (the FP8 GEMM applies the row scale to the finished dot product, so only rounding
//     differs);
//   * `--quantization fp8` (quantised at load) is exactly the per-channel FP8 checkpoint of the
//     same weights;
//   * on the trained embedded model the logits stay close to full precision and greedy decoding
//     mostly agrees (the figures are printed);
//   * unsupported schemes and inconsistent checkpoints are errors naming what is wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "deepseek_test_util.h"
#include "model/config.h"
#include "model/config_json.h"
#include "model/weight_quantization.h"
#include "model/weight_upload.h"
#include "test_paths.h"
#include "weights_test_util.h"

namespace specula {
namespace {

using testing::TempDir;
using testing::write_checkpoint;
using Tensors = std::vector<std::pair<std::string, Tensor>>;

std::filesystem::path fixture_dir(const std::string& variant) {
  return specula::testing::fixtures_dir() / "models" / variant;
}

bool is_linear(const std::string& name) {
  if (name.rfind("model.layers.", 0) != 0) return false;
  for (const char* p : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight",
                        "up_proj.weight", "down_proj.weight"}) {
    const std::string s = p;
    if (name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) return true;
  }
  return false;
}

// w [N, K] -> e4m3 codes and the scales (one per row, or one for the tensor), by the test's own
// arithmetic: scale = amax / 448, code = round_to_nearest_even(w / scale).
struct Quantized {
  Tensor codes;                 // F8_E4M3 [N, K]
  std::vector<float> scales;    // N or 1
  Tensor dequantized;           // F32 [N, K]: codes * scale
};
Quantized quantize(const Tensor& w, bool per_channel) {
  const int64_t n = w.size(0), k = w.size(1);
  const float* v = w.data_as<float>();
  Quantized q{Tensor::empty({n, k}, DType::kF8E4M3), {}, Tensor::empty({n, k}, DType::kF32)};
  auto amax_of = [&](int64_t r0, int64_t r1) {
    float a = 0;
    for (int64_t i = r0 * k; i < r1 * k; ++i) a = std::max(a, std::fabs(v[i]));
    return a > 0 ? a / 448.0f : 1.0f;
  };
  if (!per_channel) q.scales.push_back(amax_of(0, n));
  for (int64_t r = 0; r < n; ++r) {
    const float s = per_channel ? amax_of(r, r + 1) : q.scales[0];
    if (per_channel) q.scales.push_back(s);
    for (int64_t c = 0; c < k; ++c) {
      const uint8_t code = f32_to_f8e4m3(v[r * k + c] / s);
      q.codes.data_as<uint8_t>()[r * k + c] = code;
      q.dequantized.data_as<float>()[r * k + c] = f8e4m3_to_f32(code) * s;
    }
  }
  return q;
}

struct Checkpoints {
  Tensors fp8, plain;
};
// The FP8 checkpoint of a fixture and the plain one holding its dequantised weights. `ignored`
// stays in full precision in both.
Checkpoints make_fp8(const std::string& variant, bool per_channel, const std::string& ignored = "") {
  Checkpoints c;
  for (const auto& [name, t] : testing::read_checkpoint_f32(fixture_dir(variant))) {
    if (!is_linear(name) || name == ignored + ".weight") {
      c.fp8.emplace_back(name, t);
      c.plain.emplace_back(name, t);
      continue;
    }
    Quantized q = quantize(t, per_channel);
    c.fp8.emplace_back(name, q.codes);
    const int64_t n = t.size(0);
    c.fp8.emplace_back(name + "_scale",
                       per_channel ? Tensor::from_f32(q.scales, {n, 1}) : Tensor::from_f32(q.scales, Shape{}));
    c.plain.emplace_back(name, q.dequantized);
  }
  return c;
}

struct ModelRun {
  std::vector<float> logits;
  std::vector<int32_t> greedy;
};
ModelRun run(const std::filesystem::path& dir, const std::string& quantization, const std::vector<int32_t>& prompt) {
  ModelConfig config = load_model_config(dir);
  auto weights = open_safetensors_checkpoint(dir);
  auto backend = make_cpu_backend(2);
  ModelOptions options;
  options.quantization = quantization;
  auto model = create_model(config, *weights, *backend, options);
  auto r = testing::run_prompt(*model, *backend, prompt, 16, 5);
  return {r.prompt_logits, r.greedy};
}

std::vector<int32_t> prompt_for(const nlohmann::json& config) {
  std::vector<int32_t> p;
  const int32_t v = config["vocab_size"];
  for (int i = 0; i < 23; ++i) p.push_back(static_cast<int32_t>((i * 37 + 11) % v));
  return p;
}

// The plain checkpoint under `config`, the FP8 one with `quantization_config` added: their logits
// agree to rounding and their greedy tokens exactly.
void expect_fp8_equals_dequantised(nlohmann::json config, const Checkpoints& c,
                                   const nlohmann::json& quantization_config) {
  TempDir tmp;
  write_checkpoint(tmp / "plain", config, c.plain);
  config["quantization_config"] = quantization_config;
  write_checkpoint(tmp / "fp8", config, c.fp8);
  const auto prompt = prompt_for(config);
  ModelRun want = run(tmp / "plain", "", prompt), got = run(tmp / "fp8", "", prompt);
  EXPECT_LE(testing::relative_error(got.logits, want.logits), 1e-5);
  EXPECT_EQ(got.greedy, want.greedy);
}

class Fp8Weights : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8Weights, PerTensorCheckpointEqualsItsDequantisedWeights) {
  expect_fp8_equals_dequantised(read_json_file(fixture_dir(GetParam()) / "config.json"),
                                make_fp8(GetParam(), /*per_channel=*/false),
                                {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}});
}

TEST_P(Fp8Weights, CompressedTensorsChannelCheckpointWithIgnoredLayerEqualsItsDequantisedWeights) {
  expect_fp8_equals_dequantised(read_json_file(fixture_dir(GetParam()) / "config.json"),
                                make_fp8(GetParam(), /*per_channel=*/true, "model.layers.0.mlp.down_proj"),
                                nlohmann::json::parse(R"({
    "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
    "config_groups": {"group_0": {"targets": ["Linear"],
      "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": true, "dynamic": false},
      "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true}}},
    "ignore": ["lm_head", "re:.*layers\\.0\\.mlp\\.down_proj$"]})"));
}

TEST_P(Fp8Weights, QuantisedAtLoadIsThePerChannelCheckpoint) {
  nlohmann::json config = read_json_file(fixture_dir(GetParam()) / "config.json");
  Checkpoints c = make_fp8(GetParam(), /*per_channel=*/true);
  TempDir tmp;
  nlohmann::json fp8_config = config;
  fp8_config["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}};
  write_checkpoint(tmp / "fp8", fp8_config, c.fp8);
  const auto prompt = prompt_for(config);
  ModelRun at_load = run(fixture_dir(GetParam()), "fp8", prompt), checkpoint = run(tmp / "fp8", "", prompt);
  EXPECT_EQ(at_load.logits, checkpoint.logits);
  EXPECT_EQ(at_load.greedy, checkpoint.greedy);

}

INSTANTIATE_TEST_SUITE_P(Fixtures, Fp8Weights,
                         ::testing::Values("llama", "qwen2_bias_tied", "qwen3_qknorm_headdim"));

// Against full precision on the trained embedded model (the random-init fixtures above are
// chaotic: their weights are O(1), so any perturbation, FP8's 2.5% per weight included, changes
// their argmax). Real text prompts of the transformers reference; figures are printed.
TEST(Fp8WeightsEmbedded, QuantisedAtLoadStaysCloseToFullPrecision) {
  const auto dir = testing::models_dir() / "specula-tiny";
  auto ref = SafetensorsFile::open(testing::fixtures_dir() / "embedded" / "specula-tiny" / "reference.safetensors");
  double worst = 0;
  size_t agree = 0, total = 0;
  for (int i = 0;; ++i) {
    const SafetensorsEntry* e = ref->find("prompt_" + std::to_string(i));
    if (e == nullptr) break;
    std::vector<int32_t> prompt(static_cast<size_t>(e->numel()));
    std::memcpy(prompt.data(), ref->data(*e), e->nbytes());
    ModelRun fp8 = run(dir, "fp8", prompt), full = run(dir, "", prompt);
    worst = std::max(worst, testing::relative_error(fp8.logits, full.logits));
    size_t same = 0;
    while (same < full.greedy.size() && fp8.greedy[same] == full.greedy[same]) ++same;
    agree += same;
    total += full.greedy.size();
  }
  ASSERT_GT(total, 0u);
  std::printf("[ fp8 ] specula-tiny: prompt logits within %.4f of their scale; greedy tokens before the first "
              "difference %zu of %zu\n",
              worst, agree, total);
  EXPECT_LE(worst, 0.05);
  EXPECT_GT(worst, 0.0);
  EXPECT_GE(agree * 2, total);
}

ModelConfig config_with(const std::string& variant, const nlohmann::json& quantization_config) {
  ModelConfig c = load_model_config(fixture_dir(variant));
  if (!quantization_config.is_null()) c.raw["quantization_config"] = quantization_config;
  return c;
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; wanted one containing: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Fp8WeightsErrors, UnsupportedSchemesNameWhatIsUnsupported) {
  const nlohmann::json none;
  expect_error([&] { resolve_weight_quantization(config_with("llama", none), "awq"); },
               "--quantization awq is not supported (supported: fp8)");
  expect_error([&] { resolve_weight_quantization(config_with("llama", {{"quant_method", "gptq"}, {"bits", 4}}), ""); },
               "'gptq' is not supported");
  expect_error(
      [&] {
        resolve_weight_quantization(
            config_with("llama", {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}}), "");
      },
      "block-wise FP8 (weight_block_size) is supported for DeepSeek checkpoints only, not LlamaForCausalLM");
  auto compressed = [](const nlohmann::json& weights) {
    return nlohmann::json{{"quant_method", "compressed-tensors"},
                          {"format", "float-quantized"},
                          {"config_groups", {{"group_0", {{"weights", weights}}}}}};
  };
  expect_error(
      [&] {
        resolve_weight_quantization(
            config_with("llama", compressed({{"num_bits", 8}, {"type", "int"}, {"strategy", "channel"}})), "");
      },
      "8-bit int weights are not supported");
  expect_error(
      [&] {
        resolve_weight_quantization(
            config_with("llama", compressed({{"num_bits", 8}, {"type", "float"}, {"strategy", "block"}})), "");
      },
      "'block' scales are not supported (supported: tensor, channel)");
  expect_error([&] { resolve_weight_quantization(config_with("deepseek_v2_greedy", none), "fp8"); },
               "supported for Llama / Qwen dense models, not DeepseekV2ForCausalLM");
  // What works: nothing, fp8 at load, an FP8 checkpoint with or without --quantization fp8.
  EXPECT_FALSE(resolve_weight_quantization(config_with("llama", none), "").fp8());
  EXPECT_FALSE(resolve_weight_quantization(config_with("llama", none), "fp8").from_checkpoint);
  EXPECT_TRUE(resolve_weight_quantization(config_with("llama", {{"quant_method", "fp8"}}), "fp8").from_checkpoint);
}

TEST(Fp8WeightsErrors, InconsistentCheckpointsNameTheTensor) {
  nlohmann::json config = read_json_file(fixture_dir("llama") / "config.json");
  config["quantization_config"] = {{"quant_method", "fp8"}};
  const auto prompt = prompt_for(config);
  {
    Checkpoints c = make_fp8("llama", true);
    std::erase_if(c.fp8, [](const auto& e) { return e.first == "model.layers.1.self_attn.o_proj.weight_scale"; });
    TempDir tmp;
    write_checkpoint(tmp / "x", config, c.fp8);
    expect_error([&] { run(tmp / "x", "", prompt); },
                 "FP8 tensor 'model.layers.1.self_attn.o_proj.weight' has no "
                 "'model.layers.1.self_attn.o_proj.weight_scale' beside it");
  }
  {
    Checkpoints c = make_fp8("llama", true);
    for (auto& [name, t] : c.fp8)
      if (name == "model.layers.0.mlp.up_proj.weight_scale") t = Tensor::from_f32({1.0f, 2.0f}, {2});
    TempDir tmp;
    write_checkpoint(tmp / "x", config, c.fp8);
    expect_error([&] { run(tmp / "x", "", prompt); },
                 "'model.layers.0.mlp.up_proj.weight_scale' has shape [2]: expected one scale (per tensor) or");
  }
  {  // q_proj ignored but k_proj / v_proj (fused with it) quantised
    nlohmann::json c2 = config;
    c2["quantization_config"]["ignored_layers"] = {"model.layers.0.self_attn.q_proj"};
    TempDir tmp;
    write_checkpoint(tmp / "x", c2, make_fp8("llama", true).fp8);
    expect_error([&] { run(tmp / "x", "", prompt); }, "are fused into one projection but only one of them");
  }
}

}  // namespace
}  // namespace specula
