// Bad config.json / generation_config.json: one clear error line naming the file and the key.
#include <gtest/gtest.h>

#include "model/config.h"
#include "weights_test_util.h"

namespace specula {
namespace {

using nlohmann::json;
using testing::expect_error_mentions;
using testing::TempDir;
using testing::write_text;

json good() {
  return {{"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 100}, {"hidden_size", 64},
          {"intermediate_size", 128}, {"num_hidden_layers", 1}, {"num_attention_heads", 4}};
}

// Writes `j` as config.json and expects loading to fail naming the file and every part.
void expect_load_error(const json& j, std::initializer_list<std::string> parts) {
  TempDir dir;
  write_text(dir / "config.json", j.dump());
  std::vector<std::string> all(parts);
  all.push_back((dir / "config.json").string());
  try {
    load_model_config(dir.path());
    ADD_FAILURE() << "expected an error for " << j.dump();
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& p : all) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(ConfigErrors, MissingFile) {
  TempDir dir;
  expect_error_mentions([&] { load_model_config(dir.path()); }, {(dir / "config.json").string(), "not found"});
}

TEST(ConfigErrors, CorruptJson) {
  TempDir dir;
  write_text(dir / "config.json", R"({"architectures": ["LlamaForCausalLM"], "vocab_size": )");
  expect_error_mentions([&] { load_model_config(dir.path()); }, {(dir / "config.json").string(), "invalid JSON"});
  write_text(dir / "config.json", "[1, 2]");
  expect_error_mentions([&] { load_model_config(dir.path()); }, {(dir / "config.json").string(), "JSON object"});
}

TEST(ConfigErrors, UnknownArchitecture) {
  json j = good();
  j["architectures"] = {"GPT2LMHeadModel"};
  expect_load_error(j, {"architectures", "GPT2LMHeadModel", "LlamaForCausalLM"});
  j.erase("architectures");
  expect_load_error(j, {"architectures", "missing"});
  j["model_type"] = "gpt2";
  expect_load_error(j, {"model_type", "gpt2"});
  j = good();
  j["architectures"] = json::array();
  expect_load_error(j, {"architectures"});
}

TEST(ConfigErrors, MissingRequiredKey) {
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"}) {
    json j = good();
    j.erase(key);
    expect_load_error(j, {std::string("'") + key + "'", "missing required key"});
    j[key] = nullptr;
    expect_load_error(j, {std::string("'") + key + "'", "null"});
  }
}

TEST(ConfigErrors, WrongJsonTypes) {
  json j = good();
  j["hidden_size"] = "64";
  expect_load_error(j, {"'hidden_size'", "expected an integer", "string"});
  j = good();
  j["hidden_size"] = 64.5;
  expect_load_error(j, {"'hidden_size'", "expected an integer"});
  j = good();
  j["rms_norm_eps"] = "1e-5";
  expect_load_error(j, {"'rms_norm_eps'", "expected a number"});
  j = good();
  j["tie_word_embeddings"] = 1;
  expect_load_error(j, {"'tie_word_embeddings'", "true or false"});
  j = good();
  j["eos_token_id"] = {1, "2"};
  expect_load_error(j, {"'eos_token_id'", "element 1"});
  j = good();
  j["rope_scaling"] = "yarn";
  expect_load_error(j, {"'rope_scaling'", "expected an object"});
  j = good();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", "2"}};
  expect_load_error(j, {"'rope_scaling.factor'", "expected a number"});
  // An integral float is accepted where an integer is expected.
  j = good();
  j["max_position_embeddings"] = 4096.0;
  TempDir dir;
  write_text(dir / "config.json", j.dump());
  EXPECT_EQ(load_model_config(dir.path()).max_position_embeddings, 4096);
}

TEST(ConfigErrors, BadValues) {
  json j = good();
  j["num_key_value_heads"] = 3;
  expect_load_error(j, {"'num_key_value_heads'", "does not divide"});
  j = good();
  j["hidden_size"] = 66;
  expect_load_error(j, {"'hidden_size'", "not a multiple"});
  j = good();
  j["num_attention_heads"] = 0;
  expect_load_error(j, {"'num_attention_heads'", "positive"});
  j = good();
  j["partial_rotary_factor"] = 1.5;
  expect_load_error(j, {"'partial_rotary_factor'"});
}

TEST(ConfigErrors, UnknownRopeType) {
  json j = good();
  j["rope_scaling"] = {{"type", "longrope"}, {"factor", 2.0}};
  expect_load_error(j, {"'rope_scaling.type'", "longrope", "yarn"});
  j = good();
  j["rope_parameters"] = {{"rope_type", "su"}, {"rope_theta", 1e4}};
  expect_load_error(j, {"'rope_parameters.rope_type'", "su"});
}

TEST(ConfigErrors, MissingRopeParameters) {
  json j = good();
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}};
  expect_load_error(j, {"'rope_scaling.original_max_position_embeddings'", "missing required key"});
  j = good();
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e4}};
  expect_load_error(j, {"'rope_parameters.factor'", "missing required key"});
  j = good();
  j["rope_scaling"] = {{"type", "linear"}};
  expect_load_error(j, {"'rope_scaling.factor'"});
  j = good();
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 2.0}, {"truncate", false}};
  expect_load_error(j, {"'rope_parameters.truncate'"});
}

TEST(ConfigErrors, DeepseekKeys) {
  json j = good();
  j["architectures"] = {"DeepseekV2ForCausalLM"};
  expect_load_error(j, {"'num_experts_per_tok'", "missing required key"});
  j["num_experts_per_tok"] = 2;
  j["n_routed_experts"] = 8;
  j["n_group"] = 3;
  expect_load_error(j, {"'n_group'", "does not divide"});
  j["n_group"] = 2;
  j["topk_group"] = 4;
  expect_load_error(j, {"'topk_group'"});
  j["topk_group"] = 1;
  j["topk_method"] = "random";
  expect_load_error(j, {"'topk_method'", "random"});
  j["topk_method"] = "greedy";
  j["scoring_func"] = "tanh";
  expect_load_error(j, {"'scoring_func'", "tanh"});
  j["scoring_func"] = "softmax";
  j["num_experts_per_tok"] = 9;
  expect_load_error(j, {"'num_experts_per_tok'", "exceeds"});
}

TEST(ConfigErrors, GenerationConfig) {
  TempDir dir;
  write_text(dir / "generation_config.json", "{not json");
  expect_error_mentions([&] { load_generation_config(dir.path()); },
                        {(dir / "generation_config.json").string(), "invalid JSON"});
  write_text(dir / "generation_config.json", R"({"temperature": "hot"})");
  expect_error_mentions([&] { load_generation_config(dir.path()); },
                        {(dir / "generation_config.json").string(), "'temperature'", "expected a number"});
  write_text(dir / "generation_config.json", R"({"top_k": 2.5})");
  expect_error_mentions([&] { load_generation_config(dir.path()); }, {"'top_k'", "expected an integer"});
  write_text(dir / "generation_config.json", R"({"top_p": 1.5})");
  expect_error_mentions([&] { load_generation_config(dir.path()); }, {"'top_p'"});
  write_text(dir / "generation_config.json", R"({"eos_token_id": "x"})");
  expect_error_mentions([&] { load_generation_config(dir.path()); }, {"'eos_token_id'"});
}

}  // namespace
}  // namespace specula
