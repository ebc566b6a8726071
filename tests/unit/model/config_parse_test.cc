// config.json -> ModelConfig: every architecture and the defaults transformers' config classes
// give the keys a config leaves out; generation_config.json.
#include <gtest/gtest.h>

#include "model/config.h"
#include "weights_test_util.h"

namespace specula {
namespace {

using nlohmann::json;
using testing::TempDir;
using testing::write_text;

// The sizes every config must state, plus whatever the test adds.
json minimal(const std::string& arch, json extra = json::object()) {
  json j = {{"architectures", {arch}}, {"vocab_size", 1000}, {"hidden_size", 256}, {"intermediate_size", 512},
            {"num_hidden_layers", 2}, {"num_attention_heads", 8}};
  for (auto& [k, v] : extra.items()) j[k] = v;
  return j;
}

ModelConfig parse(const json& j) { return parse_model_config(j, "config.json"); }

TEST(ConfigParse, LlamaDefaultsAsTransformers) {
  ModelConfig c = parse(minimal("LlamaForCausalLM"));
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.num_key_value_heads, 8);  // num_key_value_heads=None -> num_attention_heads
  EXPECT_EQ(c.head_dim, 32);            // hidden_size / num_attention_heads
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.hidden_act, "silu");
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>({2}));
  EXPECT_EQ(c.rope.type, RopeConfig::Type::kDefault);
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
  EXPECT_EQ(c.rotary_dim(), 32);
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_FALSE(c.is_deepseek());
  EXPECT_EQ(c.raw["vocab_size"], 1000);
}

TEST(ConfigParse, LlamaAttentionAndMlpBiasKeys) {
  ModelConfig c = parse(minimal("LlamaForCausalLM", {{"attention_bias", true}, {"mlp_bias", true}}));
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.o_proj_bias);  // LlamaAttention puts attention_bias on o_proj too
  EXPECT_TRUE(c.mlp_bias);
}

TEST(ConfigParse, ExplicitHeadDimAndKvHeads) {
  ModelConfig c = parse(minimal("LlamaForCausalLM", {{"head_dim", 64}, {"num_key_value_heads", 2}}));
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.num_key_value_heads, 2);
  // An explicit null behaves like the class default None.
  c = parse(minimal("LlamaForCausalLM", {{"head_dim", nullptr}, {"num_key_value_heads", nullptr}}));
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
}

TEST(ConfigParse, MistralDefaults) {
  ModelConfig c = parse(minimal("MistralForCausalLM", {{"attention_bias", true}}));
  EXPECT_EQ(c.arch, Architecture::kMistral);
  EXPECT_EQ(c.num_key_value_heads, 8);  // MistralConfig: num_key_value_heads=8
  EXPECT_EQ(c.max_position_embeddings, 4096 * 32);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_FALSE(c.attention_bias);  // Mistral's projections never have a bias
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>({2}));
  c = parse(minimal("MistralForCausalLM",
                    {{"sliding_window", nullptr}, {"num_key_value_heads", nullptr}, {"num_attention_heads", 16}}));
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.num_key_value_heads, 16);  // an explicit null -> num_attention_heads, not 8
}

TEST(ConfigParse, Qwen2HasQkvBias) {
  ModelConfig c = parse(minimal("Qwen2ForCausalLM", {{"num_attention_heads", 32}, {"hidden_size", 1024}}));
  EXPECT_EQ(c.arch, Architecture::kQwen2);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.num_key_value_heads, 32);  // Qwen2Config: num_key_value_heads=32
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_FALSE(c.bos_token_id.has_value());  // Qwen2Config: bos/eos None
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_FALSE(c.sliding_window.has_value());  // use_sliding_window defaults to false
  c = parse(minimal("Qwen2ForCausalLM", {{"use_sliding_window", true}, {"sliding_window", 131072},
                                         {"num_key_value_heads", 2}}));
  EXPECT_EQ(c.sliding_window, 131072);
}

TEST(ConfigParse, Qwen3QkNormAndHeadDimDefault) {
  // Qwen3Config: head_dim=128 when absent, even where hidden/heads differs.
  ModelConfig c = parse(minimal("Qwen3ForCausalLM", {{"num_key_value_heads", 4}}));
  EXPECT_EQ(c.arch, Architecture::kQwen3);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rotary_dim(), 128);
  EXPECT_FALSE(c.attention_bias);
  c = parse(minimal("Qwen3ForCausalLM", {{"head_dim", 64}, {"attention_bias", true}, {"num_attention_heads", 64}}));
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.num_key_value_heads, 32);  // Qwen3Config: num_key_value_heads=32 when absent
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.o_proj_bias);
}

TEST(ConfigParse, ArchitectureFromModelTypeWhenListMissing) {
  json j = minimal("Qwen3ForCausalLM", {{"num_key_value_heads", 8}});
  j.erase("architectures");
  j["model_type"] = "qwen3";
  EXPECT_EQ(parse(j).arch, Architecture::kQwen3);
  EXPECT_EQ(architecture_name(Architecture::kDeepseekV3), "DeepseekV3ForCausalLM");
}

TEST(ConfigParse, DtypeKeysAndEosForms) {
  EXPECT_EQ(parse(minimal("LlamaForCausalLM", {{"torch_dtype", "float16"}})).torch_dtype, "float16");
  EXPECT_EQ(parse(minimal("LlamaForCausalLM", {{"dtype", "float32"}})).torch_dtype, "float32");
  ModelConfig c = parse(minimal("LlamaForCausalLM", {{"eos_token_id", {128001, 128008, 128009}}, {"bos_token_id", 128000}}));
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>({128001, 128008, 128009}));
  EXPECT_EQ(c.bos_token_id, 128000);
  c = parse(minimal("LlamaForCausalLM", {{"eos_token_id", 7}, {"bos_token_id", nullptr}}));
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>({7}));
  EXPECT_FALSE(c.bos_token_id.has_value());
}

TEST(ConfigParse, DeepseekV2Defaults) {
  ModelConfig c = parse(minimal("DeepseekV2ForCausalLM", {{"num_experts_per_tok", 6}}));
  EXPECT_EQ(c.arch, Architecture::kDeepseekV2);
  EXPECT_TRUE(c.is_deepseek());
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.head_dim, 64);  // transformers: head_dim = qk_rope_head_dim
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_EQ(c.n_routed_experts, 64);
  EXPECT_EQ(c.n_shared_experts, 2);
  EXPECT_EQ(c.moe_intermediate_size, 1407);
  EXPECT_EQ(c.first_k_dense_replace, 0);
  EXPECT_EQ(c.n_group, 1);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_EQ(c.topk_method, "greedy");
  EXPECT_EQ(c.scoring_func, "softmax");
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 1.0);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_TRUE(c.rope_interleave);
  EXPECT_EQ(c.num_nextn_predict_layers, 0);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_TRUE(c.is_moe_layer(0));
  // q_lora_rank null: plain q_proj.
  c = parse(minimal("DeepseekV2ForCausalLM", {{"num_experts_per_tok", 6}, {"q_lora_rank", nullptr},
                                               {"first_k_dense_replace", 1}, {"moe_layer_freq", 2}}));
  EXPECT_FALSE(c.q_lora_rank.has_value());
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(2));
  EXPECT_FALSE(c.is_moe_layer(3));
}

TEST(ConfigParse, DeepseekV3Defaults) {
  ModelConfig c = parse(minimal("DeepseekV3ForCausalLM"));
  EXPECT_EQ(c.arch, Architecture::kDeepseekV3);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 2048);
  EXPECT_EQ(c.first_k_dense_replace, 3);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_EQ(c.topk_method, "noaux_tc");
  EXPECT_EQ(c.scoring_func, "sigmoid");
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.num_key_value_heads, 128);  // DeepseekV3Config: num_key_value_heads=128 when absent
  EXPECT_EQ(c.max_position_embeddings, 4096);
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>({1}));
  EXPECT_TRUE(c.rope_interleave);
  c = parse(minimal("DeepseekV3ForCausalLM", {{"rope_interleave", false}, {"num_nextn_predict_layers", 1}}));
  EXPECT_FALSE(c.rope_interleave);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
}

TEST(GenerationConfig, AbsentFileIsEmpty) {
  TempDir dir;
  GenerationConfig g = load_generation_config(dir.path());
  EXPECT_TRUE(g.eos_token_ids.empty());
  EXPECT_FALSE(g.temperature.has_value());
  EXPECT_FALSE(g.max_new_tokens.has_value());
}

TEST(GenerationConfig, ParsesSamplingDefaults) {
  TempDir dir;
  // Qwen3-8B's generation_config.json plus the keys it lacks.
  write_text(dir / "generation_config.json", R"({
    "bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
    "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0",
    "min_p": 0.05, "repetition_penalty": 1.1, "max_new_tokens": 512})");
  GenerationConfig g = load_generation_config(dir.path());
  EXPECT_EQ(g.eos_token_ids, std::vector<int64_t>({151645, 151643}));
  EXPECT_EQ(g.bos_token_id, 151643);
  EXPECT_DOUBLE_EQ(*g.temperature, 0.6);
  EXPECT_EQ(g.top_k, 20);
  EXPECT_DOUBLE_EQ(*g.top_p, 0.95);
  EXPECT_DOUBLE_EQ(*g.min_p, 0.05);
  EXPECT_DOUBLE_EQ(*g.repetition_penalty, 1.1);
  EXPECT_EQ(g.max_new_tokens, 512);
  // The config.json path itself finds the file beside it.
  write_text(dir / "config.json", "{}");
  EXPECT_EQ(load_generation_config(dir / "config.json").top_k, 20);
  write_text(dir / "generation_config.json", R"({"eos_token_id": 2})");
  EXPECT_EQ(load_generation_config(dir.path()).eos_token_ids, std::vector<int64_t>({2}));
}

TEST(ConfigLoad, FromFolderOrFile) {
  TempDir dir;
  write_text(dir / "config.json", minimal("Qwen3ForCausalLM", {{"num_key_value_heads", 2}}).dump());
  EXPECT_EQ(load_model_config(dir.path()).arch, Architecture::kQwen3);
  EXPECT_EQ(load_model_config(dir / "config.json").arch, Architecture::kQwen3);
}

}  // namespace
}  // namespace specula
