// Renders every case of tests/fixtures/chat_templates/<name>.json (transformers 5.17's
// apply_chat_template output for the real Qwen3, DeepSeek-V3 and Llama-3 templates) and compares
// the text exactly. The templates come from the fetched tokenizer_config.json files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_paths.h"
#include "tokenizer/chat_template.h"

namespace specula {
namespace {

using nlohmann::ordered_json;

ordered_json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return ordered_json::parse(in);  // ordered: tojson must see keys in the fixture's order
}

// The context transformers passes: messages, tools (only when given), add_generation_prompt,
// bos_token, eos_token, then the extra template kwargs.
ordered_json context_of(const ordered_json& c) {
  ordered_json ctx = ordered_json::object();
  ctx["messages"] = c.at("messages");
  if (c.contains("tools") && !c.at("tools").is_null()) ctx["tools"] = c.at("tools");
  ctx["add_generation_prompt"] = c.at("add_generation_prompt");
  ctx["bos_token"] = c.at("bos_token");
  ctx["eos_token"] = c.at("eos_token");
  if (c.contains("kwargs"))
    for (const auto& [k, v] : c.at("kwargs").items()) ctx[k] = v;
  return ctx;
}

class ChatTemplateFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateFixture, RendersEveryCaseExactlyAsTransformers) {
  const std::string name = GetParam();
  const auto config_path = testing::tokenizer_cache_dir() / name / "tokenizer_config.json";
  if (!std::filesystem::exists(config_path))
    GTEST_SKIP() << "real tokenizer not fetched: run scripts/fetch_tokenizers.sh (missing " << config_path << ")";
  const auto fixture = read_json(testing::fixtures_dir() / "chat_templates" / (name + ".json"));
  ASSERT_EQ(fixture.at("template").get<std::string>(), name);
  const auto source = read_json(config_path).at("chat_template").get<std::string>();

  auto tmpl = ChatTemplate::compile(source);
  const auto& cases = fixture.at("cases");
  ASSERT_GE(cases.size(), 10u);
  for (const auto& c : cases) {
    SCOPED_TRACE(name + "/" + c.at("name").get<std::string>());
    const ordered_json ctx = context_of(c);
    if (c.contains("error")) {
      // transformers raised (e.g. "TypeError: argument of type 'NoneType' is not iterable");
      // we must raise too, with the same Python message inside ours.
      std::string expected = c.at("error").get<std::string>();
      if (auto colon = expected.find(": "); colon != std::string::npos) expected = expected.substr(colon + 2);
      try {
        std::string out = tmpl->render(ctx);
        ADD_FAILURE() << "expected an error containing '" << expected << "', rendered:\n" << out;
      } catch (const Error& e) {
        EXPECT_THAT(e.what(), ::testing::HasSubstr(expected));
      }
      continue;
    }
    EXPECT_EQ(tmpl->render(ctx), c.at("rendered").get<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(RealTemplates, ChatTemplateFixture,
                         ::testing::Values("qwen3", "deepseek_v3", "llama3"));

// The same render through the nlohmann::json overload: keys get sorted on parse, so only cases
// whose output does not depend on dict key order can be compared; Llama-3's template has none.
TEST(ChatTemplateFixtureJson, PlainJsonOverloadRendersLlama3) {
  const auto config_path = testing::tokenizer_cache_dir() / "llama3" / "tokenizer_config.json";
  if (!std::filesystem::exists(config_path)) GTEST_SKIP() << "run scripts/fetch_tokenizers.sh";
  const auto fixture = read_json(testing::fixtures_dir() / "chat_templates" / "llama3.json");
  auto tmpl = ChatTemplate::compile(read_json(config_path).at("chat_template").get<std::string>());
  for (const auto& c : fixture.at("cases")) {
    if (c.contains("error")) continue;
    SCOPED_TRACE(c.at("name").get<std::string>());
    const nlohmann::json ctx = nlohmann::json::parse(context_of(c).dump());
    EXPECT_EQ(tmpl->render(ctx), c.at("rendered").get<std::string>());
  }
}

}  // namespace
}  // namespace specula
