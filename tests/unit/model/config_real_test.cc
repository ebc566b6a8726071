// Real config.json files: the published checkpoints' configs under bench/configs and the configs
// transformers 5.17 wrote for the reference fixtures (tests/fixtures/models, both rope styles).
#include <gtest/gtest.h>

#include "model/config.h"
#include "model/tensor_parallel_plan.h"
#include "test_paths.h"

namespace specula {
namespace {

std::filesystem::path bench(const std::string& name) { return testing::source_dir() / "bench" / "configs" / name; }
std::filesystem::path fixture(const std::string& name) { return testing::fixtures_dir() / "models" / name; }

TEST(RealConfigs, Llama31_8B_Instruct) {
  ModelConfig c = load_model_config(bench("Llama-3.1-8B-Instruct"));
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.rope.type, RopeConfig::Type::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>({128001, 128008, 128009}));
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
}

TEST(RealConfigs, Llama31_70B_Instruct) {
  ModelConfig c = load_model_config(bench("Llama-3.1-70B-Instruct"));
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_EQ(c.hidden_size, 8192);
  EXPECT_EQ(c.intermediate_size, 28672);
  EXPECT_EQ(c.num_hidden_layers, 80);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.rope.type, RopeConfig::Type::kLlama3);
  // Splits over 2, 4 and 8 ranks (tensor_parallel_plan.h).
  for (int tp : {2, 4, 8}) EXPECT_NO_THROW(check_tensor_parallel(c, tp)) << tp;
}

TEST(RealConfigs, Qwen3Family) {
  struct Expect {
    const char* name;
    int64_t hidden, intermediate, layers, heads;
    bool tied;
  };
  for (const Expect& e : {Expect{"Qwen3-8B", 4096, 12288, 36, 32, false}, Expect{"Qwen3-1.7B", 2048, 6144, 28, 16, true},
                          Expect{"Qwen3-0.6B", 1024, 3072, 28, 16, true}}) {
    SCOPED_TRACE(e.name);
    ModelConfig c = load_model_config(bench(e.name));
    EXPECT_EQ(c.arch, Architecture::kQwen3);
    EXPECT_EQ(c.hidden_size, e.hidden);
    EXPECT_EQ(c.intermediate_size, e.intermediate);
    EXPECT_EQ(c.num_hidden_layers, e.layers);
    EXPECT_EQ(c.num_attention_heads, e.heads);
    EXPECT_EQ(c.num_key_value_heads, 8);
    EXPECT_EQ(c.head_dim, 128);  // != hidden / heads for 0.6B and 1.7B
    EXPECT_TRUE(c.qk_norm);
    EXPECT_FALSE(c.attention_bias);
    EXPECT_EQ(c.tie_word_embeddings, e.tied);
    EXPECT_EQ(c.vocab_size, 151936);
    EXPECT_EQ(c.rope.type, RopeConfig::Type::kDefault);
    EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
    EXPECT_EQ(c.max_position_embeddings, 40960);
    EXPECT_FALSE(c.sliding_window.has_value());
    EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>({151645}));
  }
}

TEST(RealConfigs, DeepSeekV2Lite) {
  ModelConfig c = load_model_config(bench("DeepSeek-V2-Lite"));
  EXPECT_EQ(c.arch, Architecture::kDeepseekV2);
  EXPECT_EQ(c.num_hidden_layers, 27);
  EXPECT_FALSE(c.q_lora_rank.has_value());
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.n_routed_experts, 64);
  EXPECT_EQ(c.n_shared_experts, 2);
  EXPECT_EQ(c.num_experts_per_tok, 6);
  EXPECT_EQ(c.moe_intermediate_size, 1408);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.topk_method, "greedy");
  EXPECT_EQ(c.scoring_func, "softmax");
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.rope.type, RopeConfig::Type::kYarn);
  EXPECT_DOUBLE_EQ(c.rope.factor, 40.0);
  EXPECT_DOUBLE_EQ(c.rope.mscale, 0.707);
  EXPECT_DOUBLE_EQ(c.rope.mscale_all_dim, 0.707);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 4096);
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
}

TEST(RealConfigs, DeepSeekV3) {
  ModelConfig c = load_model_config(bench("DeepSeek-V3"));
  EXPECT_EQ(c.arch, Architecture::kDeepseekV3);
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_hidden_layers, 61);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_EQ(c.topk_method, "noaux_tc");
  EXPECT_EQ(c.scoring_func, "sigmoid");
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.first_k_dense_replace, 3);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.rope.type, RopeConfig::Type::kYarn);
  EXPECT_DOUBLE_EQ(c.rope.mscale_all_dim, 1.0);
  EXPECT_EQ(c.vocab_size, 129280);
}

TEST(RealConfigs, FixtureConfigsWrittenByTransformers5) {
  // Every fixture's config parses; spot-check what each variant is about.
  ModelConfig old_style = load_model_config(fixture("llama3_rope_old_style"));
  ModelConfig new_style = load_model_config(fixture("llama3_rope_new_style"));
  for (const ModelConfig* c : {&old_style, &new_style}) {
    EXPECT_EQ(c->rope.type, RopeConfig::Type::kLlama3);
    EXPECT_DOUBLE_EQ(c->rope.theta, 500000.0);
    EXPECT_DOUBLE_EQ(c->rope.factor, 8.0);
    EXPECT_EQ(c->rope.original_max_position_embeddings, 64);
  }
  ModelConfig linear = load_model_config(fixture("llama_linear_rope_type_key"));
  EXPECT_EQ(linear.rope.type, RopeConfig::Type::kLinear);
  EXPECT_DOUBLE_EQ(linear.rope.factor, 2.0);
  EXPECT_TRUE(linear.attention_bias && linear.o_proj_bias && linear.mlp_bias);

  ModelConfig qwen2 = load_model_config(fixture("qwen2_bias_tied"));
  EXPECT_TRUE(qwen2.attention_bias);
  EXPECT_TRUE(qwen2.tie_word_embeddings);
  ModelConfig qwen3 = load_model_config(fixture("qwen3_qknorm_headdim"));
  EXPECT_EQ(qwen3.head_dim, 32);
  EXPECT_TRUE(qwen3.qk_norm);
  ModelConfig yarn = load_model_config(fixture("qwen3_yarn_tied"));
  EXPECT_EQ(yarn.rope.type, RopeConfig::Type::kYarn);
  EXPECT_DOUBLE_EQ(yarn.rope.factor, 4.0);
  ModelConfig mistral = load_model_config(fixture("mistral_sharded"));
  EXPECT_EQ(mistral.arch, Architecture::kMistral);
  EXPECT_FALSE(mistral.sliding_window.has_value());

  ModelConfig v2 = load_model_config(fixture("deepseek_v2_group_limited"));
  EXPECT_EQ(v2.topk_method, "group_limited_greedy");
  EXPECT_EQ(v2.n_group, 2);
  EXPECT_FALSE(v2.q_lora_rank.has_value());
  EXPECT_DOUBLE_EQ(v2.rope.mscale, 0.707);
  ModelConfig v3 = load_model_config(fixture("deepseek_v3"));
  EXPECT_EQ(v3.q_lora_rank, 32);
  EXPECT_EQ(v3.topk_method, "noaux_tc");
  EXPECT_EQ(v3.head_dim, 8);
  ModelConfig v3b = load_model_config(fixture("deepseek_v3_no_qlora"));
  EXPECT_FALSE(v3b.q_lora_rank.has_value());
  EXPECT_EQ(v3b.rope.type, RopeConfig::Type::kDefault);
  EXPECT_NO_THROW(load_model_config(fixture("llama")));
  EXPECT_NO_THROW(load_model_config(fixture("deepseek_v2_greedy")));
}

}  // namespace
}  // namespace specula
