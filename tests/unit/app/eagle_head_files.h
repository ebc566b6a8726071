// EAGLE heads written to a temporary folder for the CPU tests: random weights in the public
// checkpoint layouts (EAGLE-3: midlayer.*, fc over three target layers, a reduced draft vocabulary
// with its d2t/t2d maps; EAGLE-1: layers.0.*, fc over [embedding, hidden] with its bias), so that
// loading, the maps and the engine's equality with plain decoding are tested whatever the trained
// head does. Acceptance needs the trained head (models/specula-tiny-eagle3).
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace specula::testing {

struct RandomEagleHead {
  bool eagle3 = true;
  int64_t draft_vocab = 0;           // EAGLE-3; 0: half the target's, every other id
  std::vector<int> aux_layers = {2, 4, 5};
  int64_t intermediate = 352;
  uint64_t seed = 7;
  nlohmann::json config_overrides = nlohmann::json::object();
  std::vector<std::string> skip;     // tensors left out (error tests)
};

inline std::filesystem::path write_random_eagle_head(const std::filesystem::path& dir, const ModelConfig& target,
                                                     const RandomEagleHead& spec) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  const int64_t h = target.hidden_size, v = target.vocab_size, hq = target.num_attention_heads,
                hk = target.num_key_value_heads, d = target.head_dim, inter = spec.intermediate;
  const int64_t dv = spec.eagle3 ? (spec.draft_vocab > 0 ? spec.draft_vocab : v / 2) : v;
  nlohmann::json c = {{"architectures", {spec.eagle3 ? "LlamaForCausalLMEagle3" : "LlamaForCausalLM"}},
                      {"model_type", "llama"},
                      {"hidden_size", h},
                      {"intermediate_size", inter},
                      {"num_attention_heads", hq},
                      {"num_key_value_heads", hk},
                      {"head_dim", d},
                      {"num_hidden_layers", 1},
                      {"rms_norm_eps", 1e-6},
                      {"rope_theta", 10000.0},
                      {"max_position_embeddings", 2048},
                      {"hidden_act", "silu"},
                      {"vocab_size", v},
                      {"tie_word_embeddings", false},
                      {"torch_dtype", "float32"}};
  if (spec.eagle3) {
    c["draft_vocab_size"] = dv;
    c["eagle_config"] = {{"eagle_aux_hidden_state_layer_ids", spec.aux_layers}, {"use_aux_hidden_state", true}};
  }
  for (const auto& [k, val] : spec.config_overrides.items()) c[k] = val;
  std::ofstream(dir / "config.json") << c.dump(2);

  std::mt19937_64 rng(spec.seed);
  std::vector<std::pair<std::string, Tensor>> tensors;
  auto add = [&](const std::string& name, Tensor t) {
    for (const std::string& s : spec.skip)
      if (s == name) return;
    tensors.emplace_back(name, std::move(t));
  };
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    std::uniform_real_distribution<float> u(-1.0f / std::sqrt(static_cast<float>(cols)), 1.0f / std::sqrt(static_cast<float>(cols)));
    std::vector<float> x(static_cast<size_t>(rows * cols));
    for (float& f : x) f = u(rng);
    add(name, Tensor::from_f32(x, {rows, cols}));
  };
  auto ones = [&](const std::string& name, int64_t n) { add(name, Tensor::from_f32(std::vector<float>(static_cast<size_t>(n), 1.0f), {n})); };
  const std::string p = spec.eagle3 ? "midlayer." : "layers.0.";
  const int64_t in = spec.eagle3 ? 2 * h : h;
  if (spec.eagle3) {
    ones(p + "input_layernorm.weight", h);
    ones(p + "hidden_norm.weight", h);
  }
  matrix(p + "self_attn.q_proj.weight", hq * d, in);
  matrix(p + "self_attn.k_proj.weight", hk * d, in);
  matrix(p + "self_attn.v_proj.weight", hk * d, in);
  matrix(p + "self_attn.o_proj.weight", h, hq * d);
  ones(p + "post_attention_layernorm.weight", h);
  matrix(p + "mlp.gate_proj.weight", inter, h);
  matrix(p + "mlp.up_proj.weight", inter, h);
  matrix(p + "mlp.down_proj.weight", h, inter);
  if (spec.eagle3) {
    ones("norm.weight", h);
    matrix("fc.weight", h, static_cast<int64_t>(spec.aux_layers.size()) * h);
    matrix("lm_head.weight", dv, h);
    // Draft id i -> target id 2 i (every other token) while it fits, then the odd ones.
    std::vector<int64_t> d2t(static_cast<size_t>(dv));
    std::vector<uint8_t> t2d(static_cast<size_t>(v), 0);
    for (int64_t i = 0; i < dv; ++i) {
      const int64_t target_id = 2 * i < v ? 2 * i : 2 * (i - (v + 1) / 2) + 1;
      d2t[static_cast<size_t>(i)] = target_id - i;
      t2d[static_cast<size_t>(target_id)] = 1;
    }
    add("d2t", Tensor::from_i64(d2t, {dv}));
    Tensor mask = Tensor::empty({v}, DType::kBool, Device::kCPU);
    std::copy(t2d.begin(), t2d.end(), mask.data_as<uint8_t>());
    add("t2d", mask);
  } else {
    matrix("fc.weight", h, 2 * h);
    std::vector<float> bias(static_cast<size_t>(h), 0.01f);
    add("fc.bias", Tensor::from_f32(bias, {h}));
  }
  write_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

}  // namespace specula::testing
