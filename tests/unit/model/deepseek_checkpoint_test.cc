// DeepSeek checkpoints in the shapes real ones come in, built from the transformers fixtures:
//   * experts in transformers 5's fused naming (mlp.experts.gate_up_proj / down_proj) load to the
//     same model as the checkpoints' per-expert naming;
//   * MTP layers stored after the main ones (model.layers.{num_hidden_layers}.*) are left alone;
//   * FP8 block-quantised weights with `weight_scale_inv` beside them (DeepSeek-V3's format; the
//     tensors that broke vLLM's shared-expert fusion with a KeyError) are dequantised, and the
//     fused shared-expert replicas carry the dequantised values: with fusion off, on x1 and x2 the
//     logits equal those of a plain checkpoint holding the dequantised weights;
//   * V3's rope_interleave=false (rotate_half pairs) is the interleaved model with its rope rows
//     reordered;
//   * and the errors for inconsistent checkpoints name the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "deepseek_test_util.h"
#include "model/config.h"
#include "model/config_json.h"
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

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

Tensor random_tensor(const Shape& shape, std::mt19937& rng) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return Tensor::from_f32(v, shape);
}
bool ends_with(const std::string& s, const std::string& x) {
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

struct CheckpointRun {
  std::vector<float> logits;
  std::vector<int32_t> greedy;
};

// Prefill of one fixture prompt (all positions' logits) and three greedy decode steps.
CheckpointRun run_checkpoint(const std::filesystem::path& dir, int fusion, const std::vector<int32_t>& prompt) {
  ModelConfig config = load_model_config(dir);
  auto weights = open_safetensors_checkpoint(dir);
  auto backend = make_cpu_backend(2);
  auto model = create_model(config, *weights, *backend, ModelOptions{fusion});
  auto run = testing::run_prompt(*model, *backend, prompt, 3, 5);
  return {run.prompt_logits, run.greedy};
}

std::vector<int32_t> fixture_prompt(const std::string& variant) {
  return testing::load_deepseek_reference(fixture_dir(variant) / "reference.safetensors").at(1).prompt;
}

nlohmann::json fixture_config(const std::string& variant) { return read_json_file(fixture_dir(variant) / "config.json"); }

class DeepseekCheckpoint : public ::testing::TestWithParam<std::string> {};

TEST_P(DeepseekCheckpoint, TransformersFusedExpertNamingLoadsTheSameModel) {
  const std::string variant = GetParam();
  const nlohmann::json config = fixture_config(variant);
  const int64_t e = config["n_routed_experts"], inter = config["moe_intermediate_size"], h = config["hidden_size"];
  Tensors in = testing::read_checkpoint_f32(fixture_dir(variant)), out;
  // Per MoE layer: stack experts.{x}.gate_proj/up_proj into gate_up_proj [E, 2I, H] and
  // down_proj into [E, H, I], as transformers 5 holds them.
  std::map<std::string, std::pair<Tensor, Tensor>> fused;  // mlp prefix -> (gate_up, down)
  for (const auto& [name, t] : in) {
    const auto pos = name.find("mlp.experts.");
    if (pos == std::string::npos) {
      out.emplace_back(name, t);
      continue;
    }
    const std::string prefix = name.substr(0, pos + 4);  // "model.layers.N.mlp."
    auto& [gu, down] = fused[prefix];
    if (!gu.defined()) {
      gu = Tensor::zeros({e, 2 * inter, h}, DType::kF32);
      down = Tensor::zeros({e, h, inter}, DType::kF32);
    }
    const std::string rest = name.substr(pos + 12);  // "{x}.gate_proj.weight"
    const int64_t x = std::stoll(rest.substr(0, rest.find('.')));
    const float* src = t.data_as<float>();
    if (ends_with(rest, "gate_proj.weight")) std::copy_n(src, inter * h, gu.data_as<float>() + x * 2 * inter * h);
    if (ends_with(rest, "up_proj.weight")) std::copy_n(src, inter * h, gu.data_as<float>() + (x * 2 + 1) * inter * h);
    if (ends_with(rest, "down_proj.weight")) std::copy_n(src, h * inter, down.data_as<float>() + x * h * inter);
  }
  ASSERT_FALSE(fused.empty());
  for (const auto& [prefix, t] : fused) {
    out.emplace_back(prefix + "experts.gate_up_proj", t.first);
    out.emplace_back(prefix + "experts.down_proj", t.second);
  }
  TempDir tmp;
  write_checkpoint(tmp / "fused", config, out);
  const auto prompt = fixture_prompt(variant);
  for (int fusion : {0, 1}) {
    CheckpointRun want = run_checkpoint(fixture_dir(variant), fusion, prompt);
    CheckpointRun got = run_checkpoint(tmp / "fused", fusion, prompt);
    EXPECT_EQ(got.logits, want.logits) << variant << " fusion " << fusion;
    EXPECT_EQ(got.greedy, want.greedy) << variant << " fusion " << fusion;
  }
}

TEST_P(DeepseekCheckpoint, MtpLayersAfterTheMainLayersAreLeftAlone) {
  const std::string variant = GetParam();
  nlohmann::json config = fixture_config(variant);
  const int64_t layers = config["num_hidden_layers"], h = config["hidden_size"], v = config["vocab_size"];
  config["num_nextn_predict_layers"] = 1;
  Tensors tensors = testing::read_checkpoint_f32(fixture_dir(variant)), extra;
  // The MTP layer: a copy of the last decoder layer under the next index, plus its own parts.
  const std::string last = "model.layers." + std::to_string(layers - 1) + ".";
  const std::string mtp = "model.layers." + std::to_string(layers) + ".";
  for (const auto& [name, t] : tensors)
    if (starts_with(name, last)) extra.emplace_back(mtp + name.substr(last.size()), t);
  std::mt19937 rng(3);
  extra.emplace_back(mtp + "enorm.weight", random_tensor({h}, rng));
  extra.emplace_back(mtp + "hnorm.weight", random_tensor({h}, rng));
  extra.emplace_back(mtp + "eh_proj.weight", random_tensor({h, 2 * h}, rng));
  extra.emplace_back(mtp + "embed_tokens.weight", random_tensor({v, h}, rng));
  extra.emplace_back(mtp + "shared_head.norm.weight", random_tensor({h}, rng));
  extra.emplace_back(mtp + "shared_head.head.weight", random_tensor({v, h}, rng));
  tensors.insert(tensors.end(), extra.begin(), extra.end());
  TempDir tmp;
  write_checkpoint(tmp / "mtp", config, tensors);
  const auto prompt = fixture_prompt(variant);
  CheckpointRun want = run_checkpoint(fixture_dir(variant), 0, prompt);
  CheckpointRun got = run_checkpoint(tmp / "mtp", 0, prompt);
  EXPECT_EQ(got.logits, want.logits);
  EXPECT_EQ(got.greedy, want.greedy);
}

// transformers' V3 with rope_interleave=false rotates (x[i], x[i + dr/2]) pairs of the raw rope
// dims (rotate_half); with rope_interleave=true it rotates (x[2i], x[2i+1]) pairs. So a checkpoint
// whose rope rows (each head's q_pe rows, and k_pe's rows of kv_a_proj_with_mqa) are reordered
// evens-then-odds must give, with rope_interleave=false, the same model as the original with
// rope_interleave=true: the same pairs rotate with the same frequencies, and q.k is unchanged
// by permuting q's and k's dims alike.
TEST(DeepseekCheckpointRope, NeoxRopeOnDeinterleavedRowsEqualsInterleavedRope) {
  const std::string variant = "deepseek_v3_no_qlora";
  nlohmann::json config = fixture_config(variant);
  const int64_t heads = config["num_attention_heads"], dn = config["qk_nope_head_dim"],
                dr = config["qk_rope_head_dim"], c = config["kv_lora_rank"];
  auto deinterleave_rows = [&](Tensor& t, int64_t first_row) {  // rows first_row .. + dr
    const int64_t k = t.size(1);
    std::vector<float> old(t.data_as<float>() + first_row * k, t.data_as<float>() + (first_row + dr) * k);
    for (int64_t j = 0; j < dr; ++j) {
      const int64_t from = j < dr / 2 ? 2 * j : 2 * (j - dr / 2) + 1;
      std::copy_n(old.data() + from * k, k, t.data_as<float>() + (first_row + j) * k);
    }
  };
  Tensors tensors = testing::read_checkpoint_f32(fixture_dir(variant));
  int permuted = 0;
  for (auto& [name, t] : tensors) {
    if (ends_with(name, "self_attn.q_proj.weight")) {
      for (int64_t h = 0; h < heads; ++h) deinterleave_rows(t, h * (dn + dr) + dn);
      ++permuted;
    } else if (ends_with(name, "self_attn.kv_a_proj_with_mqa.weight")) {
      deinterleave_rows(t, c);
      ++permuted;
    }
  }
  ASSERT_EQ(permuted, 2 * static_cast<int>(config["num_hidden_layers"]));
  config["rope_interleave"] = false;
  TempDir tmp;
  write_checkpoint(tmp / "neox", config, tensors);
  const auto prompt = fixture_prompt(variant);
  CheckpointRun want = run_checkpoint(fixture_dir(variant), 0, prompt);
  CheckpointRun got = run_checkpoint(tmp / "neox", 0, prompt);
  EXPECT_LE(testing::relative_error(got.logits, want.logits), 1e-5);
  EXPECT_EQ(got.greedy, want.greedy);
  // And the flag is really read: the permuted rows with interleaved rope are another model.
  config["rope_interleave"] = true;
  write_checkpoint(tmp / "mismatch", config, tensors);
  EXPECT_GT(testing::relative_error(run_checkpoint(tmp / "mismatch", 0, prompt).logits, want.logits), 1e-3);
}

// The e4m3 value nearest to x (the format's 126 finite magnitudes; no infinities).
uint8_t to_e4m3(float x) {
  uint8_t best = 0;
  for (int code = 0; code < 0x7f; ++code)
    if (std::fabs(std::fabs(x) - f8e4m3_to_f32(static_cast<uint8_t>(code))) <
        std::fabs(std::fabs(x) - f8e4m3_to_f32(best)))
      best = static_cast<uint8_t>(code);
  return x < 0 ? best | 0x80 : best;
}

// Quantises every linear weight of the attention and MLPs (DeepSeek-V3's FP8 set: not the router,
// embeddings, norms or lm_head) in [block x block] tiles: scale = amax / 448, q = e4m3(w / scale).
// `quantised` gets the F8 weights with their weight_scale_inv; `dequantised` the exact values
// those represent, f8(q) * scale, as plain F32.
void quantise(const Tensors& in, int64_t block, Tensors& quantised, Tensors& dequantised) {
  for (const auto& [name, t] : in) {
    const bool linear = t.ndim() == 2 && ends_with(name, ".weight") &&
                        (name.find(".self_attn.") != std::string::npos || name.find(".mlp.") != std::string::npos) &&
                        !ends_with(name, "mlp.gate.weight");
    if (!linear) {
      quantised.emplace_back(name, t);
      dequantised.emplace_back(name, t);
      continue;
    }
    const int64_t n = t.size(0), k = t.size(1), sn = (n + block - 1) / block, sk = (k + block - 1) / block;
    Tensor q = Tensor::empty({n, k}, DType::kF8E4M3), scale = Tensor::empty({sn, sk}, DType::kF32);
    Tensor deq = Tensor::empty({n, k}, DType::kF32);
    const float* w = t.data_as<float>();
    for (int64_t bi = 0; bi < sn; ++bi) {
      for (int64_t bj = 0; bj < sk; ++bj) {
        float amax = 0;
        for (int64_t r = bi * block; r < std::min(n, (bi + 1) * block); ++r)
          for (int64_t c = bj * block; c < std::min(k, (bj + 1) * block); ++c) amax = std::max(amax, std::fabs(w[r * k + c]));
        const float s = amax > 0 ? amax / 448.0f : 1.0f;
        scale.data_as<float>()[bi * sk + bj] = s;
        for (int64_t r = bi * block; r < std::min(n, (bi + 1) * block); ++r) {
          for (int64_t c = bj * block; c < std::min(k, (bj + 1) * block); ++c) {
            const uint8_t code = to_e4m3(w[r * k + c] / s);
            q.data_as<uint8_t>()[r * k + c] = code;
            deq.data_as<float>()[r * k + c] = f8e4m3_to_f32(code) * s;
          }
        }
      }
    }
    quantised.emplace_back(name, q);
    quantised.emplace_back(name + "_scale_inv", scale);
    dequantised.emplace_back(name, deq);
  }
}

TEST_P(DeepseekCheckpoint, Fp8BlockScalesAreAppliedAndCarriedIntoFusedReplicas) {
  const std::string variant = GetParam();
  nlohmann::json config = fixture_config(variant);
  const int64_t block = 16;  // small tiles: several per matrix, ragged ones at the edges (24 rows)
  Tensors quantised, dequantised;
  quantise(testing::read_checkpoint_f32(fixture_dir(variant)), block, quantised, dequantised);
  TempDir tmp;
  write_checkpoint(tmp / "plain", config, dequantised);
  config["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                   {"weight_block_size", {block, block}}};
  write_checkpoint(tmp / "fp8", config, quantised);
  const auto prompt = fixture_prompt(variant);
  CheckpointRun plain = run_checkpoint(tmp / "plain", 0, prompt);
  CheckpointRun fp8 = run_checkpoint(tmp / "fp8", 0, prompt);
  EXPECT_EQ(fp8.logits, plain.logits) << "dequantised weights differ";
  EXPECT_EQ(fp8.greedy, plain.greedy);
  for (int fusion : {1, 2}) {
    CheckpointRun fused = run_checkpoint(tmp / "fp8", fusion, prompt);
    EXPECT_LE(testing::relative_error(fused.logits, plain.logits), 2e-6) << "fusion " << fusion;
    EXPECT_EQ(fused.greedy, plain.greedy) << "fusion " << fusion;
  }
  // A block size that does not match the scale tensors' shapes is an error naming a tensor.
  config["quantization_config"]["weight_block_size"] = {block * 2, block};
  write_checkpoint(tmp / "bad_block", config, quantised);
  try {
    run_checkpoint(tmp / "bad_block", 0, prompt);
    FAIL() << "expected a shape error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weight_scale_inv"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Deepseek, DeepseekCheckpoint,
                         ::testing::Values("deepseek_v2_greedy", "deepseek_v3", "deepseek_v3_no_qlora"),
                         [](const auto& info) { return info.param; });

TEST(DeepseekCheckpointErrors, ScaleBesideAFloatWeightIsNamed) {
  nlohmann::json config = fixture_config("deepseek_v3_no_qlora");
  Tensors tensors = testing::read_checkpoint_f32(fixture_dir("deepseek_v3_no_qlora"));
  tensors.emplace_back("model.layers.1.mlp.shared_experts.down_proj.weight_scale_inv",
                       Tensor::zeros({1, 1}, DType::kF32));
  TempDir tmp;
  write_checkpoint(tmp / "ckpt", config, tensors);
  try {
    run_checkpoint(tmp / "ckpt", 1, {5, 6, 7});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1.mlp.shared_experts.down_proj.weight"), std::string::npos)
        << e.what();
  }
}

TEST(DeepseekCheckpointErrors, MissingExpertsNameBothNamings) {
  nlohmann::json config = fixture_config("deepseek_v3_no_qlora");
  Tensors tensors;
  for (auto& [name, t] : testing::read_checkpoint_f32(fixture_dir("deepseek_v3_no_qlora")))
    if (name.find("layers.2.mlp.experts.") == std::string::npos) tensors.emplace_back(name, t);
  TempDir tmp;
  write_checkpoint(tmp / "ckpt", config, tensors);
  try {
    run_checkpoint(tmp / "ckpt", 0, {5, 6, 7});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("model.layers.2.mlp.experts.0.gate_proj.weight"), std::string::npos) << what;
    EXPECT_NE(what.find("model.layers.2.mlp.experts.gate_up_proj"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace specula
