// The embedded models' own tokenizer and chat template (models/specula-tiny, shared by the draft
// and the MoE model) against HF tokenizers / transformers outputs committed by the training code
// under tests/fixtures/embedded/ (same formats as tests/fixtures/tokenizers and chat_templates).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_paths.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace specula {
namespace {

using nlohmann::ordered_json;

ordered_json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return ordered_json::parse(in);
}

TEST(EmbeddedTokenizer, EveryModelFolderMatchesTheReference) {
  const auto fixture = read_json(testing::fixtures_dir() / "embedded" / "tokenizer.json");
  ASSERT_GE(fixture.at("cases").size(), 30u);
  for (const char* model : {"specula-tiny", "specula-tiny-draft", "specula-tiny-moe"}) {
    SCOPED_TRACE(model);
    auto tok = Tokenizer::from_dir(testing::models_dir() / model);
    EXPECT_EQ(tok->vocab_size(), fixture.at("vocab_size").get<int64_t>());
    EXPECT_FALSE(tok->add_bos_token());
    for (const auto& c : fixture.at("cases")) {
      const std::string text = c.at("text");
      const auto ids = c.at("ids").get<std::vector<int32_t>>();
      EXPECT_EQ(tok->encode(text, true), ids) << ordered_json(text).dump();
      EXPECT_EQ(tok->encode(text, false), c.at("ids_no_special").get<std::vector<int32_t>>());
      EXPECT_EQ(tok->decode(ids, false), c.at("decoded").get<std::string>());
      EXPECT_EQ(tok->decode(ids, true), c.at("decoded_skip").get<std::string>());
      // The streamed text equals the one-shot decode.
      IncrementalDetokenizer detok(*tok, /*skip_special_tokens=*/true);
      std::string streamed;
      for (int32_t id : ids) streamed += detok.add(id);
      streamed += detok.flush();
      EXPECT_EQ(streamed, c.at("decoded_skip").get<std::string>());
    }
    for (const auto& c : fixture.value("decode_cases", ordered_json::array())) {
      const auto ids = c.at("ids").get<std::vector<int32_t>>();
      EXPECT_EQ(tok->decode(ids, false), c.at("decoded").get<std::string>());
      EXPECT_EQ(tok->decode(ids, true), c.at("decoded_skip").get<std::string>());
    }
  }
}

// from_json (tokenizer.json's text alone, the seam the fuzz targets load through) gives the
// reference ids too: specula-tiny's tokenizer_config.json adds no bos and no special tokens.
TEST(EmbeddedTokenizer, FromJsonTextMatchesTheReference) {
  const auto fixture = read_json(testing::fixtures_dir() / "embedded" / "tokenizer.json");
  std::ifstream in(testing::models_dir() / "specula-tiny" / "tokenizer.json", std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto tok = Tokenizer::from_json(text);
  EXPECT_EQ(tok->vocab_size(), fixture.at("vocab_size").get<int64_t>());
  for (const auto& c : fixture.at("cases")) {
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    EXPECT_EQ(tok->encode(c.at("text").get<std::string>(), true), ids);
    EXPECT_EQ(tok->decode(ids, true), c.at("decoded_skip").get<std::string>());
  }
  try {
    Tokenizer::from_json(text.substr(0, text.size() / 2), "cut/tokenizer.json");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("cut/tokenizer.json: invalid JSON")) << e.what();
  }
}

TEST(EmbeddedChatTemplate, RendersEveryCaseAsTransformers) {
  const auto fixture = read_json(testing::fixtures_dir() / "embedded" / "chat_template.json");
  auto tok = Tokenizer::from_dir(testing::models_dir() / "specula-tiny");
  auto tmpl = ChatTemplate::compile(tok->chat_template());
  ASSERT_GE(fixture.at("cases").size(), 10u);
  for (const auto& c : fixture.at("cases")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    ordered_json ctx = ordered_json::object();
    ctx["messages"] = c.at("messages");
    if (c.contains("tools") && !c.at("tools").is_null()) ctx["tools"] = c.at("tools");
    ctx["add_generation_prompt"] = c.at("add_generation_prompt");
    ctx["bos_token"] = c.at("bos_token");
    ctx["eos_token"] = c.at("eos_token");
    const ordered_json kwargs = c.value("kwargs", ordered_json::object());
    for (const auto& [k, v] : kwargs.items()) ctx[k] = v;
    if (c.contains("error")) {
      std::string expected = c.at("error").get<std::string>();
      if (auto colon = expected.find(": "); colon != std::string::npos) expected = expected.substr(colon + 2);
      EXPECT_THROW(
          {
            try {
              tmpl->render(ctx);
            } catch (const Error& e) {
              EXPECT_THAT(e.what(), ::testing::HasSubstr(expected));
              throw;
            }
          },
          Error);
      continue;
    }
    const std::string rendered = tmpl->render(ctx);
    EXPECT_EQ(rendered, c.at("rendered").get<std::string>());
    if (c.contains("token_ids"))
      EXPECT_EQ(tok->encode(rendered, false), c.at("token_ids").get<std::vector<int32_t>>());
  }
}

}  // namespace
}  // namespace specula
