// Bad tokenizer files are specula::Errors that name the file and the component at fault.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_toy.h"

namespace specula {
namespace {

using testing::TempTokenizerDir;
using testing::toy_tokenizer;

// Loads `dir` expecting an Error whose message contains every one of `needles`.
void expect_load_error(const TempTokenizerDir& dir, std::initializer_list<std::string> needles) {
  try {
    Tokenizer::from_dir(dir.path());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "missing '" << n << "' in: " << msg;
  }
}

TEST(TokenizerErrors, MissingFolderOrFile) {
  TempTokenizerDir dir;
  expect_load_error(dir, {(dir.path() / "tokenizer.json").string(), "cannot open"});
  try {
    Tokenizer::from_dir("/nonexistent/specula/tok");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/specula/tok/tokenizer.json"), std::string::npos) << e.what();
  }
}

TEST(TokenizerErrors, CorruptJson) {
  TempTokenizerDir dir;
  dir.write("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, )");
  expect_load_error(dir, {"tokenizer.json", "invalid JSON"});
  TempTokenizerDir dir2;
  dir2.write("tokenizer.json", "[1, 2, 3]");
  expect_load_error(dir2, {"tokenizer.json", "expected a JSON object"});
}

TEST(TokenizerErrors, CorruptConfig) {
  TempTokenizerDir dir;
  dir.write_json("tokenizer.json", toy_tokenizer({}));
  dir.write("tokenizer_config.json", "{ not json");
  expect_load_error(dir, {"tokenizer_config.json", "invalid JSON"});
  TempTokenizerDir dir2;
  dir2.write_json("tokenizer.json", toy_tokenizer({}));
  dir2.write_json("tokenizer_config.json", {{"bos_token", 7}});
  expect_load_error(dir2, {"tokenizer_config.json", "bos_token"});
}

TEST(TokenizerErrors, UnsupportedModels) {
  for (const char* type : {"WordPiece", "Unigram", "WordLevel"}) {
    TempTokenizerDir dir;
    auto t = toy_tokenizer({});
    t["model"]["type"] = type;
    dir.write_json("tokenizer.json", t);
    expect_load_error(dir, {"tokenizer.json", "unsupported model type", type});
  }
}

TEST(TokenizerErrors, UnsupportedComponents) {
  struct Case {
    const char* key;
    nlohmann::json value;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"pre_tokenizer", {{"type", "Whitespace"}}, "unsupported pre_tokenizer type 'Whitespace'"},
      {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Metaspace"}}}}}, "'Metaspace'"},
      {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "x"}}}, {"behavior", "Sideways"}}, "'Sideways'"},
      {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "(x"}}}, {"behavior", "Isolated"}}, "cannot compile regex"},
      {"normalizer", {{"type", "Lowercase"}}, "unsupported normalizer type 'Lowercase'"},
      {"normalizer", {{"type", "Precompiled"}}, "'Precompiled'"},
      {"decoder", {{"type", "WordPiece"}}, "unsupported decoder type 'WordPiece'"},
      {"decoder", nullptr, "decoder"},
      {"post_processor", {{"type", "Fancy"}}, "unsupported post_processor type 'Fancy'"},
  };
  for (const auto& c : cases) {
    TempTokenizerDir dir;
    auto t = toy_tokenizer({});
    t[c.key] = c.value;
    dir.write_json("tokenizer.json", t);
    SCOPED_TRACE(c.value.dump());
    expect_load_error(dir, {"tokenizer.json", c.needle});
  }
}

// Tables are indexed by token id: one huge id allocated gigabytes before anything failed (found by
// tests/fuzz/tokenizer_json_fuzz: an id of 27,777,761 took 1.8 GB under ASan).
TEST(TokenizerErrors, TokenIdsBeyondTheSupportedRange) {
  {
    TempTokenizerDir dir;
    auto t = toy_tokenizer({});
    t["model"]["vocab"]["x"] = 2000000000;
    dir.write_json("tokenizer.json", t);
    expect_load_error(dir, {"tokenizer.json", "model.vocab[\"x\"]", "2000000000", "above the largest supported"});
  }
  {
    TempTokenizerDir dir;
    auto t = toy_tokenizer({});
    t["added_tokens"] = {{{"id", 100000000}, {"content", "<big>"}}};
    dir.write_json("tokenizer.json", t);
    expect_load_error(dir, {"tokenizer.json", "added_tokens[0]", "100000000"});
    t["added_tokens"] = {{{"id", -3}, {"content", "<neg>"}}};
    dir.write_json("tokenizer.json", t);
    expect_load_error(dir, {"added_tokens[0]", "-3"});
  }
  {  // the largest supported id still loads
    TempTokenizerDir dir;
    auto t = toy_tokenizer({});
    t["added_tokens"] = {{{"id", kMaxTokenId}, {"content", "<last>"}, {"special", true}}};
    dir.write_json("tokenizer.json", t);
    auto tok = Tokenizer::from_dir(dir.path());
    EXPECT_EQ(tok->vocab_size(), int64_t{kMaxTokenId} + 1);
    EXPECT_EQ(tok->token_to_id("<last>"), kMaxTokenId);
  }
}

TEST(TokenizerErrors, BadModelContents) {
  {
    TempTokenizerDir dir;
    auto t = toy_tokenizer({});
    t["model"]["merges"] = {"a zz"};
    dir.write_json("tokenizer.json", t);
    expect_load_error(dir, {"tokenizer.json", "model.merges[0]", "\"zz\""});
  }
  {
    TempTokenizerDir dir;
    auto t = toy_tokenizer({});
    t["model"]["merges"] = {"abc"};
    dir.write_json("tokenizer.json", t);
    expect_load_error(dir, {"model.merges[0]", "two tokens"});
  }
  {
    TempTokenizerDir dir;
    auto t = toy_tokenizer({});
    t["model"]["vocab"]["x"] = "seven";
    dir.write_json("tokenizer.json", t);
    expect_load_error(dir, {"model.vocab", "\"x\""});
  }
  {
    TempTokenizerDir dir;
    auto t = toy_tokenizer({});
    t["model"]["dropout"] = 0.1;
    dir.write_json("tokenizer.json", t);
    expect_load_error(dir, {"model.dropout"});
  }
  {
    TempTokenizerDir dir;
    auto t = toy_tokenizer({});
    t.erase("model");
    dir.write_json("tokenizer.json", t);
    expect_load_error(dir, {"tokenizer.json", "model"});
  }
}

}  // namespace
}  // namespace specula
