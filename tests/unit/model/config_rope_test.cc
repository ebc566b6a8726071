// RoPE settings in both spellings real checkpoints use, for every supported type.
#include <gtest/gtest.h>

#include <cmath>

#include "model/config.h"
#include "weights_test_util.h"

namespace specula {
namespace {

using nlohmann::json;

ModelConfig with(json extra, const std::string& arch = "LlamaForCausalLM") {
  json j = {{"architectures", {arch}}, {"vocab_size", 100}, {"hidden_size", 64}, {"intermediate_size", 128},
            {"num_hidden_layers", 1}, {"num_attention_heads", 4}, {"max_position_embeddings", 131072}};
  if (arch.rfind("Deepseek", 0) == 0) j["num_experts_per_tok"] = 2;
  for (auto& [k, v] : extra.items()) j[k] = v;
  return parse_model_config(j, "config.json");
}

TEST(ConfigRope, OldStyleThetaWithNullScaling) {
  RopeConfig r = with({{"rope_theta", 1000000}, {"rope_scaling", nullptr}}).rope;
  EXPECT_EQ(r.type, RopeConfig::Type::kDefault);
  EXPECT_DOUBLE_EQ(r.theta, 1e6);
  EXPECT_DOUBLE_EQ(r.factor, 1.0);
  EXPECT_DOUBLE_EQ(r.partial_rotary_factor, 1.0);
}

TEST(ConfigRope, NewStyleDefault) {
  RopeConfig r = with({{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 500000.0}}}}).rope;
  EXPECT_EQ(r.type, RopeConfig::Type::kDefault);
  EXPECT_DOUBLE_EQ(r.theta, 500000.0);
}

TEST(ConfigRope, NoRopeKeysAtAllUsesDefaultTheta) {
  RopeConfig r = with(json::object()).rope;
  EXPECT_EQ(r.type, RopeConfig::Type::kDefault);
  EXPECT_DOUBLE_EQ(r.theta, 10000.0);
}

TEST(ConfigRope, Llama3BothStylesAgree) {
  json params = {{"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                 {"original_max_position_embeddings", 8192}};
  json old_style = params;
  old_style["rope_type"] = "llama3";
  json new_style = params;
  new_style["rope_type"] = "llama3";
  new_style["rope_theta"] = 500000.0;
  RopeConfig a = with({{"rope_theta", 500000.0}, {"rope_scaling", old_style}}).rope;
  RopeConfig b = with({{"rope_parameters", new_style}}).rope;
  for (const RopeConfig& r : {a, b}) {
    EXPECT_EQ(r.type, RopeConfig::Type::kLlama3);
    EXPECT_DOUBLE_EQ(r.theta, 500000.0);
    EXPECT_DOUBLE_EQ(r.factor, 8.0);
    EXPECT_DOUBLE_EQ(r.low_freq_factor, 1.0);
    EXPECT_DOUBLE_EQ(r.high_freq_factor, 4.0);
    EXPECT_EQ(r.original_max_position_embeddings, 8192);
  }
}

TEST(ConfigRope, LinearWithTheOldTypeKey) {
  RopeConfig r = with({{"rope_theta", 10000.0}, {"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}}).rope;
  EXPECT_EQ(r.type, RopeConfig::Type::kLinear);
  EXPECT_DOUBLE_EQ(r.factor, 2.0);
}

TEST(ConfigRope, DynamicParsesWithFallbackOriginalLength) {
  RopeConfig r = with({{"rope_scaling", {{"type", "dynamic"}, {"factor", 8.0}}}}).rope;
  EXPECT_EQ(r.type, RopeConfig::Type::kDynamic);
  EXPECT_DOUBLE_EQ(r.factor, 8.0);
  EXPECT_EQ(r.original_max_position_embeddings, 131072);
}

TEST(ConfigRope, YarnQwenStyleDefaults) {
  // Qwen's documented long-context setting: no beta/mscale keys.
  RopeConfig r = with({{"rope_theta", 1000000},
                       {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0},
                                         {"original_max_position_embeddings", 32768}}}})
                     .rope;
  EXPECT_EQ(r.type, RopeConfig::Type::kYarn);
  EXPECT_DOUBLE_EQ(r.factor, 4.0);
  EXPECT_EQ(r.original_max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(r.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(r.beta_slow, 1.0);
  EXPECT_DOUBLE_EQ(r.mscale, 1.0);
  EXPECT_DOUBLE_EQ(r.mscale_all_dim, 0.0);
  EXPECT_FALSE(r.attention_factor.has_value());
}

TEST(ConfigRope, YarnWithoutOriginalLengthFallsBackToMaxPositions) {
  RopeConfig r = with({{"rope_parameters", {{"rope_type", "yarn"}, {"factor", 2.0}, {"rope_theta", 1e6}}}}).rope;
  EXPECT_EQ(r.original_max_position_embeddings, 131072);
}

TEST(ConfigRope, YarnDeepseekStyle) {
  ModelConfig c = with({{"rope_theta", 10000},
                        {"rope_scaling", {{"beta_fast", 32}, {"beta_slow", 1}, {"factor", 40}, {"mscale", 0.707},
                                          {"mscale_all_dim", 0.707}, {"original_max_position_embeddings", 4096},
                                          {"type", "yarn"}}}},
                       "DeepseekV2ForCausalLM");
  const RopeConfig& r = c.rope;
  EXPECT_EQ(r.type, RopeConfig::Type::kYarn);
  EXPECT_DOUBLE_EQ(r.factor, 40.0);
  EXPECT_DOUBLE_EQ(r.mscale, 0.707);
  EXPECT_DOUBLE_EQ(r.mscale_all_dim, 0.707);
  EXPECT_EQ(r.original_max_position_embeddings, 4096);
  EXPECT_FALSE(r.attention_factor.has_value());
  EXPECT_EQ(c.rotary_dim(), 64);
}

TEST(ConfigRope, YarnExplicitAttentionFactorAndZeroBetas) {
  RopeConfig r = with({{"rope_parameters", {{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", 1.5},
                                            {"beta_fast", 0}, {"beta_slow", 2.0}}}})
                     .rope;
  EXPECT_EQ(r.attention_factor, 1.5);
  EXPECT_DOUBLE_EQ(r.beta_fast, 32.0);  // transformers: `beta_fast or 32`
  EXPECT_DOUBLE_EQ(r.beta_slow, 2.0);
}

TEST(ConfigRope, YarnMscaleAllDimWithoutMscalePinsTransformersFactor) {
  // transformers uses mscale/mscale_all_dim only when both are set; otherwise 0.1 ln(factor) + 1.
  RopeConfig r = with({{"rope_parameters", {{"rope_type", "yarn"}, {"factor", 40.0}, {"mscale_all_dim", 1.0}}}}).rope;
  ASSERT_TRUE(r.attention_factor.has_value());
  EXPECT_NEAR(*r.attention_factor, 0.1 * std::log(40.0) + 1.0, 1e-12);
}

TEST(ConfigRope, RopeScalingWinsOverRopeParameters) {
  // transformers: `rope_parameters = rope_scaling or rope_parameters`.
  RopeConfig r = with({{"rope_scaling", {{"type", "linear"}, {"factor", 3.0}}},
                       {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 5.0}}},
                       {"rope_theta", 7.0}})
                     .rope;
  EXPECT_EQ(r.type, RopeConfig::Type::kLinear);
  EXPECT_DOUBLE_EQ(r.theta, 7.0);
  // An empty rope_scaling falls through.
  r = with({{"rope_scaling", json::object()}, {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 5.0}}}}).rope;
  EXPECT_DOUBLE_EQ(r.theta, 5.0);
}

TEST(ConfigRope, PartialRotaryFactorEitherPlace) {
  ModelConfig c = with({{"partial_rotary_factor", 0.5}});
  EXPECT_EQ(c.rotary_dim(), 8);
  c = with({{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e4}, {"partial_rotary_factor", 0.25}}}});
  EXPECT_EQ(c.rotary_dim(), 4);
}

TEST(ConfigRope, NestedByLayerType) {
  RopeConfig r = with({{"rope_parameters", {{"full_attention", {{"rope_type", "linear"}, {"factor", 2.0},
                                                                {"rope_theta", 3e5}}}}}})
                     .rope;
  EXPECT_EQ(r.type, RopeConfig::Type::kLinear);
  EXPECT_DOUBLE_EQ(r.theta, 3e5);
}

}  // namespace
}  // namespace specula
