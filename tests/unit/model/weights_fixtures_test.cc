// The tiny checkpoints transformers 5.17 saved under tests/fixtures/models: every config parses,
// every weight loads (single file and sharded, F32/F16/BF16 storage), and the parsed config
// predicts exactly which optional tensors transformers wrote and the shapes it gave them.
#include <gtest/gtest.h>

#include "model/config.h"
#include "model/safetensors.h"
#include "model/weight_source.h"
#include "test_paths.h"
#include "weights_test_util.h"

namespace specula {
namespace {

using testing::MemoryBackend;

std::vector<std::filesystem::path> fixture_models() {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(testing::fixtures_dir() / "models", ec))
    if (e.is_directory() && std::filesystem::exists(e.path() / "config.json")) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// Raw stored values of one tensor as floats, read straight from the shard that holds it.
std::vector<float> raw_values(const std::filesystem::path& dir, const std::string& name) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors" || e.path().filename() == "reference.safetensors") continue;
    auto f = SafetensorsFile::open(e.path());
    if (const SafetensorsEntry* t = f->find(name)) {
      std::vector<float> out(static_cast<size_t>(t->numel()));
      std::vector<uint8_t> aligned(f->data(*t), f->data(*t) + t->nbytes());
      convert_to_f32(aligned.data(), *t->dtype, out.data(), out.size());
      return out;
    }
  }
  return {};
}

TEST(FixtureCheckpoints, AllPresent) {
  // tools/refs/model_refs.py writes twelve variants; a missing one means the fixtures are stale.
  EXPECT_EQ(fixture_models().size(), 12u);
}

TEST(FixtureCheckpoints, EveryWeightLoads) {
  MemoryBackend cpu;
  for (const auto& dir : fixture_models()) {
    SCOPED_TRACE(dir.filename().string());
    ModelConfig c = load_model_config(dir);
    auto src = open_safetensors_checkpoint(dir);
    std::vector<std::string> names = src->names();
    ASSERT_FALSE(names.empty());
    size_t loaded = 0;
    src->on_progress = [&](size_t n, size_t) { loaded = n; };
    for (const auto& name : names) {
      // Shapes as stored (read from the raw header), values compared with the raw bytes.
      std::vector<float> raw = raw_values(dir, name);
      Tensor t;
      for (const auto& e : std::filesystem::directory_iterator(dir)) {
        if (e.path().extension() != ".safetensors" || e.path().filename() == "reference.safetensors") continue;
        auto file = SafetensorsFile::open(e.path());
        if (const SafetensorsEntry* entry = file->find(name)) t = src->load(name, entry->shape, DType::kF32, cpu);
      }
      ASSERT_TRUE(t.defined()) << name;
      ASSERT_EQ(t.to_f32_vector(), raw) << name;
    }
    EXPECT_EQ(loaded, names.size());
    EXPECT_TRUE(src->has("model.embed_tokens.weight"));
    EXPECT_TRUE(src->has("model.norm.weight"));
  }
}

TEST(FixtureCheckpoints, ConfigPredictsOptionalTensorsAndShapes) {
  MemoryBackend cpu;
  for (const auto& dir : fixture_models()) {
    SCOPED_TRACE(dir.filename().string());
    ModelConfig c = load_model_config(dir);
    auto ckpt = open_safetensors_checkpoint(dir);
    auto dummy = make_dummy_weight_source(c, 0);
    // Everything transformers saved is something the config says exists...
    for (const auto& name : ckpt->names()) EXPECT_TRUE(dummy->has(name)) << name;
    // ...and each optional tensor exists exactly when the config says so.
    const int64_t moe_layer = c.first_k_dense_replace;
    const std::string l0 = "model.layers.0.";
    std::vector<std::string> optional = {"lm_head.weight", l0 + "self_attn.q_proj.bias", l0 + "self_attn.k_proj.bias",
                                         l0 + "self_attn.v_proj.bias", l0 + "self_attn.o_proj.bias",
                                         l0 + "self_attn.q_norm.weight", l0 + "self_attn.k_norm.weight",
                                         l0 + "mlp.gate_proj.bias", l0 + "mlp.down_proj.bias"};
    if (c.is_deepseek()) {
      optional = {"lm_head.weight", l0 + "self_attn.q_proj.weight", l0 + "self_attn.q_a_proj.weight",
                  l0 + "self_attn.q_b_proj.weight", l0 + "self_attn.q_a_layernorm.weight",
                  "model.layers." + std::to_string(moe_layer) + ".mlp.gate.e_score_correction_bias"};
    }
    for (const auto& name : optional) EXPECT_EQ(dummy->has(name), ckpt->has(name)) << name;

    // Shapes that follow from the parsed sizes load without a shape error.
    const int64_t H = c.hidden_size;
    ckpt->load("model.embed_tokens.weight", {c.vocab_size, H}, DType::kF32, cpu);
    ckpt->load(l0 + "mlp.down_proj.weight", {H, c.intermediate_size}, DType::kF32, cpu);
    if (!c.is_deepseek()) {
      ckpt->load(l0 + "self_attn.q_proj.weight", {c.num_attention_heads * c.head_dim, H}, DType::kF32, cpu);
      ckpt->load(l0 + "self_attn.k_proj.weight", {c.num_key_value_heads * c.head_dim, H}, DType::kF32, cpu);
      ckpt->load(l0 + "self_attn.o_proj.weight", {H, c.num_attention_heads * c.head_dim}, DType::kF32, cpu);
      if (c.qk_norm) ckpt->load(l0 + "self_attn.q_norm.weight", {c.head_dim}, DType::kF32, cpu);
    } else {
      const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
      ckpt->load(l0 + "self_attn.kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, H}, DType::kF32, cpu);
      ckpt->load(l0 + "self_attn.kv_b_proj.weight",
                 {c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, DType::kF32, cpu);
      ckpt->load(l0 + "self_attn.o_proj.weight", {H, c.num_attention_heads * c.v_head_dim}, DType::kF32, cpu);
      if (c.q_lora_rank) {
        ckpt->load(l0 + "self_attn.q_b_proj.weight", {c.num_attention_heads * qk, *c.q_lora_rank}, DType::kF32, cpu);
      } else {
        ckpt->load(l0 + "self_attn.q_proj.weight", {c.num_attention_heads * qk, H}, DType::kF32, cpu);
      }
      const std::string moe = "model.layers." + std::to_string(moe_layer) + ".mlp.";
      ASSERT_TRUE(c.is_moe_layer(moe_layer));
      ckpt->load(moe + "gate.weight", {c.n_routed_experts, H}, DType::kF32, cpu);
      ckpt->load(moe + "experts." + std::to_string(c.n_routed_experts - 1) + ".down_proj.weight",
                 {H, c.moe_intermediate_size}, DType::kF32, cpu);
      ckpt->load(moe + "shared_experts.up_proj.weight", {c.n_shared_experts * c.moe_intermediate_size, H}, DType::kF32, cpu);
    }
  }
}

}  // namespace
}  // namespace specula
