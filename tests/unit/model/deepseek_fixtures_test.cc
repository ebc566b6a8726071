// DeepSeek-V2/V3 against transformers 5.17: every tests/fixtures/models/deepseek_* checkpoint (V2
// greedy routing; V2 group-limited routing with yarn; V3 with q LoRA and yarn; V3 without q LoRA)
// and the embedded specula-tiny-moe (a trained V3-style model with tied embeddings and an MTP
// layer the main model must skip). Logits at every referenced prompt position within 1e-3 of the
// logit scale and identical greedy tokens, both for one prefill + decode per prompt and for the
// engine's schedule (chunked prefill and batched decode through the paged latent cache). Each
// case runs with shared-expert fusion off, on with 1 replica and on with 2, and the fused logits
// must equal the unfused ones within fp32 rounding.
#include <gtest/gtest.h>

#include "deepseek_test_util.h"
#include "model/config.h"
#include "model/model.h"
#include "test_paths.h"

namespace specula {
namespace {

using testing::DeepseekReference;

struct Case {
  std::string name;        // test name suffix
  std::string model;       // folder with config.json + model.safetensors
  std::string reference;   // reference.safetensors
  int fusion;              // shared_expert_fusion replicas
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

Case fixture(const std::string& variant, int fusion) {
  const auto dir = specula::testing::fixtures_dir() / "models" / variant;
  return {variant + "_fusion" + std::to_string(fusion), dir.string(), (dir / "reference.safetensors").string(), fusion};
}

Case tiny_moe(int fusion) {
  return {"specula_tiny_moe_fusion" + std::to_string(fusion),
          (specula::testing::models_dir() / "specula-tiny-moe").string(),
          (specula::testing::fixtures_dir() / "embedded" / "specula-tiny-moe" / "reference.safetensors").string(),
          fusion};
}

class DeepseekFixture : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case& c = GetParam();
    ASSERT_TRUE(std::filesystem::exists(c.reference)) << c.reference;
    config_ = load_model_config(c.model);
    weights_ = open_safetensors_checkpoint(c.model);
    backend_ = make_cpu_backend(2);
    model_ = create_model(config_, *weights_, *backend_, ModelOptions{c.fusion});
    refs_ = testing::load_deepseek_reference(c.reference);
    ASSERT_FALSE(refs_.empty());
  }

  // The logits the reference holds: every position, or those of logits_pos.
  std::vector<float> referenced(const DeepseekReference& ref, const std::vector<float>& all) const {
    return ref.logits_pos.empty() ? all : testing::select_rows(all, config_.vocab_size, ref.logits_pos);
  }

  ModelConfig config_;
  std::unique_ptr<WeightSource> weights_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::vector<DeepseekReference> refs_;
};

TEST_P(DeepseekFixture, KVCacheHoldsOneLatentHeadPerToken) {
  const KVCacheSpec spec = model_->kv_cache_spec();
  EXPECT_EQ(spec.num_layers, config_.num_hidden_layers);
  EXPECT_EQ(spec.num_kv_heads, 1);
  EXPECT_EQ(spec.head_dim, config_.kv_lora_rank + config_.qk_rope_head_dim);
  EXPECT_EQ(spec.v_head_dim, 0);
}

TEST_P(DeepseekFixture, PrefillLogitsAndGreedyDecodeMatchTransformers) {
  for (size_t i = 0; i < refs_.size(); ++i) {
    const DeepseekReference& ref = refs_[i];
    auto run = testing::run_prompt(*model_, *backend_, ref.prompt, ref.greedy.size(), static_cast<unsigned>(i));
    std::vector<float> got = referenced(ref, run.prompt_logits);
    ASSERT_EQ(got.size(), ref.logits.size());
    EXPECT_LE(testing::relative_error(got, ref.logits), 1e-3) << GetParam().name << " prompt " << i;
    EXPECT_EQ(run.greedy, ref.greedy) << GetParam().name << " prompt " << i;
  }
}

TEST_P(DeepseekFixture, ChunkedBatchedScheduleMatchesTransformers) {
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& r : refs_) prompts.push_back(r.prompt);
  auto runs = testing::run_schedule(*model_, *backend_, prompts, refs_[0].greedy.size());
  for (size_t s = 0; s < refs_.size(); ++s) {
    std::vector<float> got = referenced(refs_[s], runs[s].prompt_logits);
    ASSERT_EQ(got.size(), refs_[s].logits.size());
    EXPECT_LE(testing::relative_error(got, refs_[s].logits), 1e-3) << GetParam().name << " prompt " << s;
    std::vector<int32_t> want(refs_[s].greedy.begin(), refs_[s].greedy.begin() + runs[s].greedy.size());
    EXPECT_EQ(runs[s].greedy, want) << GetParam().name << " prompt " << s;
  }
}

class DeepseekFusedFixture : public DeepseekFixture {};

TEST_P(DeepseekFusedFixture, FusedSharedExpertEqualsUnfused) {
  ASSERT_GT(GetParam().fusion, 0);
  auto unfused_weights = open_safetensors_checkpoint(GetParam().model);
  auto unfused = create_model(config_, *unfused_weights, *backend_, ModelOptions{0});
  for (size_t i = 0; i < refs_.size(); ++i) {
    auto fused_run = testing::run_prompt(*model_, *backend_, refs_[i].prompt, 4, 1);
    auto plain_run = testing::run_prompt(*unfused, *backend_, refs_[i].prompt, 4, 1);
    // Only the order of fp32 additions differs (routed + shared as one weighted sum).
    EXPECT_LE(testing::relative_error(fused_run.prompt_logits, plain_run.prompt_logits), 2e-6)
        << GetParam().name << " prompt " << i;
    EXPECT_EQ(fused_run.greedy, plain_run.greedy) << GetParam().name << " prompt " << i;
  }
}

std::vector<Case> cases_with_fusion(std::initializer_list<int> fusions) {
  std::vector<Case> cases;
  for (int fusion : fusions) {
    for (const char* v : {"deepseek_v2_greedy", "deepseek_v2_group_limited", "deepseek_v3", "deepseek_v3_no_qlora"})
      cases.push_back(fixture(v, fusion));
    cases.push_back(tiny_moe(fusion));
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Deepseek, DeepseekFixture, ::testing::ValuesIn(cases_with_fusion({0, 1, 2})),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(Deepseek, DeepseekFusedFixture, ::testing::ValuesIn(cases_with_fusion({1, 2})),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace specula
