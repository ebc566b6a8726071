// Token masks over the real Qwen3 and Llama-3 vocabularies (scripts/fetch_tokenizers.sh), checked
// token by token against brute force: a token is allowed exactly when the output so far plus its
// bytes is still a prefix of a match, decided by a separate automaton walking the whole text from
// the start (no shared transitions, no sorted-vocabulary walk).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "structured_output/grammar_matcher.h"
#include "structured_output/json_schema_to_grammar.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace specula {
namespace {

const char* kSchema = R"({"type": "object", "properties": {
  "city": {"type": "string", "maxLength": 20}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
  "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "days"]})";

void check_against_brute_force(const std::string& name, Grammar (*make)(), const std::string& output) {
  const auto dir = testing::tokenizer_cache_dir() / name;
  if (!std::filesystem::exists(dir / "tokenizer.json")) GTEST_SKIP() << "no " << dir << " (scripts/fetch_tokenizers.sh)";
  auto tok = Tokenizer::from_dir(dir);
  auto vocab = std::make_shared<const TokenVocabulary>(*tok, tok->vocab_size());
  auto compiled = std::make_shared<CompiledGrammar>(make(), vocab);
  const int32_t eos = tok->eos_token_id().value();
  GrammarMatcher m(compiled, {eos});
  std::vector<int32_t> ids = tok->encode(output, false);
  ids.push_back(eos);
  std::vector<uint32_t> mask(static_cast<size_t>(vocab->mask_words()));
  std::string text;
  for (size_t step = 0; step < ids.size(); ++step) {
    m.fill_next_token_mask(mask);
    GrammarAutomaton reference(make());
    const auto at = reference.advance(reference.initial(), text);
    ASSERT_NE(at, GrammarAutomaton::kDead) << text;
    int64_t allowed = 0;
    for (int32_t t = 0; t < vocab->size(); ++t) {
      const std::string bytes = tok->is_special(t) ? std::string() : tok->token_bytes(t);
      bool expect = t == eos ? reference.accepting(at)
                             : !bytes.empty() && reference.advance(at, bytes) != GrammarAutomaton::kDead;
      const bool got = mask[static_cast<size_t>(t) >> 5] >> (t & 31) & 1;
      ASSERT_EQ(got, expect) << name << " token " << t << " '" << bytes << "' after '" << text << "'";
      allowed += got;
    }
    EXPECT_GT(allowed, 0);
    ASSERT_TRUE(m.accept_token(ids[step])) << ids[step];
    if (ids[step] != eos) text += tok->token_bytes(ids[step]);
  }
  EXPECT_TRUE(m.terminated());
}

Grammar tool_schema() { return json_schema_text_to_grammar(kSchema); }
Grammar any_object() { return any_json_grammar(); }

TEST(RealVocabularyMasks, ToolSchemaQwen3) {
  check_against_brute_force("qwen3", tool_schema, R"({"city": "Zürich, CH", "days": 12, "unit": "celsius"})");
}
TEST(RealVocabularyMasks, ToolSchemaLlama3) {
  check_against_brute_force("llama3", tool_schema, "{\n  \"city\": \"東京\",\n  \"days\": 3\n}");
}
TEST(RealVocabularyMasks, JsonObjectQwen3) {
  check_against_brute_force("qwen3", any_object, R"({"a": [1, -2.5e3, true, null], "b": {"c": "x\"y\u00e9"}})");
}
TEST(RealVocabularyMasks, JsonObjectLlama3) {
  check_against_brute_force("llama3", any_object, R"({"list": [{"k": 0}, []], "s": "tab\there"})");
}

}  // namespace
}  // namespace specula
