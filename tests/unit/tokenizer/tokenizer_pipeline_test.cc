// The pipeline components on small hand-made inputs whose HF results are known (mostly the
// examples of HF tokenizers' own documentation and tests): split behaviours, Digits, ByteLevel,
// BPE merge order, ignore_merges, added-token matching, post-processing and the config layer.
#include <gtest/gtest.h>

#include <variant>

#include <random>

#include "tokenizer/bpe_model.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_toy.h"

namespace specula {
namespace {

using testing::TempTokenizerDir;
using testing::toy_tokenizer;
using Pieces = std::vector<std::string>;

Pieces pre_tokenize(const nlohmann::json& spec, const std::string& text) {
  auto p = make_pre_tokenizer(spec, "test.json");
  Pieces pieces{text};
  p->pre_tokenize(pieces);
  return pieces;
}

nlohmann::json split(const std::string& literal, const std::string& behavior, bool invert = false) {
  return {{"type", "Split"}, {"pattern", {{"String", literal}}}, {"behavior", behavior}, {"invert", invert}};
}

// The example of HF's SplitDelimiterBehavior documentation.
TEST(PreTokenizer, SplitBehaviours) {
  const std::string text = "the-final--countdown";
  EXPECT_EQ(pre_tokenize(split("-", "Removed"), text), (Pieces{"the", "final", "countdown"}));
  EXPECT_EQ(pre_tokenize(split("-", "Isolated"), text), (Pieces{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(pre_tokenize(split("-", "MergedWithPrevious"), text), (Pieces{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(pre_tokenize(split("-", "MergedWithNext"), text), (Pieces{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pre_tokenize(split("-", "Contiguous"), text), (Pieces{"the", "-", "final", "--", "countdown"}));
}

TEST(PreTokenizer, SplitInvertAndRegex) {
  // Inverted, the pieces between delimiters are the "matches": Removed drops them and keeps
  // each delimiter occurrence as its own piece.
  EXPECT_EQ(pre_tokenize(split("-", "Removed", true), "a-b--c"), (Pieces{"-", "-", "-"}));
  EXPECT_EQ(pre_tokenize(split("-", "Contiguous", true), "a-b--c"), (Pieces{"a", "-", "b", "--", "c"}));
  const nlohmann::json re = {{"type", "Split"}, {"pattern", {{"Regex", R"(\s+)"}}}, {"behavior", "Removed"}};
  EXPECT_EQ(pre_tokenize(re, "  hello \t world\n"), (Pieces{"hello", "world"}));
  EXPECT_EQ(pre_tokenize(re, ""), Pieces{});
}

TEST(PreTokenizer, Digits) {  // HF documentation example
  EXPECT_EQ(pre_tokenize({{"type", "Digits"}, {"individual_digits", true}}, "Call 123 please"),
            (Pieces{"Call ", "1", "2", "3", " please"}));
  EXPECT_EQ(pre_tokenize({{"type", "Digits"}, {"individual_digits", false}}, "Call 123 please"),
            (Pieces{"Call ", "123", " please"}));
}

TEST(PreTokenizer, ByteLevelGpt2Split) {
  const std::string g = "\xC4\xA0";  // Ġ
  // HF documentation example for ByteLevel.
  EXPECT_EQ(pre_tokenize({{"type", "ByteLevel"}, {"add_prefix_space", false}}, "Hello my friend, how is your day going?"),
            (Pieces{"Hello", g + "my", g + "friend", ",", g + "how", g + "is", g + "your", g + "day", g + "going", "?"}));
  EXPECT_EQ(pre_tokenize({{"type", "ByteLevel"}, {"add_prefix_space", true}}, "Hello"), (Pieces{g + "Hello"}));
  EXPECT_EQ(pre_tokenize({{"type", "ByteLevel"}, {"add_prefix_space", true}}, " Hello"), (Pieces{g + "Hello"}));
  // \s+(?!\S) leaves the last space to the word that follows.
  EXPECT_EQ(pre_tokenize({{"type", "ByteLevel"}, {"add_prefix_space", false}}, "a   b"), (Pieces{"a", g + g, g + "b"}));
  EXPECT_EQ(pre_tokenize({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}, "a b"),
            (Pieces{"a" + g + "b"}));
}

TEST(PreTokenizer, SequenceAppliesEachStepToEveryPiece) {
  const nlohmann::json seq = {{"type", "Sequence"},
                              {"pretokenizers",
                               {{{"type", "Digits"}, {"individual_digits", true}},
                                {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  EXPECT_EQ(pre_tokenize(seq, "x 12"), (Pieces{"x\xC4\xA0", "1", "2"}));
}

TEST(Normalizer, NfcComposesAndSequenceChains) {
  auto nfc = make_normalizer({{"type", "NFC"}}, "t.json");
  EXPECT_EQ(nfc->normalize("e\xCC\x81"), "\xC3\xA9");  // e + combining acute -> é
  auto nfd = make_normalizer({{"type", "Sequence"}, {"normalizers", {{{"type", "NFKC"}}, {{"type", "NFD"}}}}}, "t.json");
  EXPECT_EQ(nfd->normalize("\xEF\xAC\x81\xC3\xA9"), "fie\xCC\x81");  // ﬁ ligature, é
  EXPECT_EQ(make_normalizer({{"type", "Sequence"}, {"normalizers", nlohmann::json::array()}}, "t.json"), nullptr);
  EXPECT_EQ(make_normalizer(nullptr, "t.json"), nullptr);
}

std::unique_ptr<Tokenizer> load(const TempTokenizerDir& dir, const nlohmann::json& tok,
                                const nlohmann::json& config = nullptr) {
  dir.write_json("tokenizer.json", tok);
  if (!config.is_null()) dir.write_json("tokenizer_config.json", config);
  return Tokenizer::from_dir(dir.path());
}

TEST(Bpe, MergesApplyByRankThenLeftmost) {
  TempTokenizerDir dir;
  // Rank order, not position: "b c" (rank 0) wins over "a b" (rank 1) in "abcd".
  auto tok = load(dir, toy_tokenizer({{"b", "c"}, {"a", "b"}, {"c", "d"}, {"a", "a"}}));
  const int32_t bc = *tok->token_to_id("bc"), aa = *tok->token_to_id("aa");
  EXPECT_EQ(tok->encode("abcd", false), (std::vector<int32_t>{'a', bc, 'd'}));
  // Equal ranks: leftmost first, so "aaa" is [aa, a] and never [a, aa].
  EXPECT_EQ(tok->encode("aaa", false), (std::vector<int32_t>{aa, 'a'}));
  EXPECT_EQ(tok->encode("aaaaa", false), (std::vector<int32_t>{aa, aa, 'a'}));
  EXPECT_EQ(tok->decode(tok->encode("abcd aaa", false), false), "abcd aaa");
}

TEST(Bpe, MergeChainsBuildWholeWords) {
  TempTokenizerDir dir;
  const std::string g = "\xC4\xA0";
  auto tok = load(dir, toy_tokenizer({{"l", "l"}, {"h", "e"}, {"he", "ll"}, {"hell", "o"}, {g, "w"}, {"o", "r"},
                                      {g + "w", "or"}, {g + "wor", "l"}, {g + "worl", "d"}}));
  EXPECT_EQ(tok->encode("hello world", false),
            (std::vector<int32_t>{*tok->token_to_id("hello"), *tok->token_to_id(g + "world")}));
  EXPECT_EQ(tok->id_to_token(*tok->token_to_id(g + "world")), g + "world");
  EXPECT_EQ(tok->token_bytes(*tok->token_to_id(g + "world")), " world");
}

TEST(Bpe, MergesAsPairsEqualMergesAsStrings) {
  TempTokenizerDir a, b;
  auto as_strings = toy_tokenizer({{"b", "c"}, {"a", "bc"}});
  auto as_pairs = as_strings;
  as_pairs["model"]["merges"] = nlohmann::json::array({{"b", "c"}, {"a", "bc"}});
  auto t1 = load(a, as_strings), t2 = load(b, as_pairs);
  EXPECT_EQ(t1->encode("abc xbc", false), t2->encode("abc xbc", false));
  EXPECT_EQ(t1->encode("abc", false), (std::vector<int32_t>{*t1->token_to_id("abc")}));
}

TEST(Bpe, IgnoreMergesEmitsWholeVocabWords) {
  TempTokenizerDir a, b;
  auto json = toy_tokenizer({{"b", "c"}});
  json["model"]["vocab"]["abcd"] = 1000;  // reachable by no merge
  auto merging = load(a, json);
  EXPECT_EQ(merging->encode("abcd", false), (std::vector<int32_t>{'a', *merging->token_to_id("bc"), 'd'}));
  json["model"]["ignore_merges"] = true;
  auto ignoring = load(b, json);
  EXPECT_EQ(ignoring->encode("abcd", false), (std::vector<int32_t>{1000}));
  EXPECT_EQ(ignoring->encode("abcde", false), (std::vector<int32_t>{'a', *ignoring->token_to_id("bc"), 'd', 'e'}));
}

// The textbook definition of BPE encoding, quadratic and obviously right: repeatedly merge the
// adjacent pair of lowest rank, the leftmost one among equals.
std::vector<std::string> naive_bpe(const std::string& word, const std::vector<std::pair<std::string, std::string>>& merges) {
  std::vector<std::string> sym;
  for (char c : word) sym.emplace_back(1, c);
  for (;;) {
    size_t best_rank = merges.size(), best_pos = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      for (size_t r = 0; r < best_rank; ++r) {
        if (merges[r].first == sym[i] && merges[r].second == sym[i + 1]) {
          best_rank = r;
          best_pos = i;
          break;
        }
      }
    }
    if (best_rank == merges.size()) return sym;
    sym[best_pos] += sym[best_pos + 1];
    sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(best_pos) + 1);
  }
}

TEST(Bpe, PriorityQueueMergeEqualsTextbookBpe) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    // Random merges over a three-letter alphabet, so that chains and conflicts are frequent.
    std::vector<std::string> tokens = {"a", "b", "c"};
    std::vector<std::pair<std::string, std::string>> merges;
    for (int m = 0; m < 12; ++m) {
      const auto& l = tokens[rng() % tokens.size()];
      const auto& r = tokens[rng() % tokens.size()];
      if (std::find(merges.begin(), merges.end(), std::make_pair(l, r)) != merges.end()) continue;
      merges.emplace_back(l, r);
      if (std::find(tokens.begin(), tokens.end(), l + r) == tokens.end()) tokens.push_back(l + r);
    }
    const auto json = toy_tokenizer(merges);
    BpeModel model(json["model"], "toy.json");
    for (int w = 0; w < 30; ++w) {
      std::string word;
      for (size_t n = 1 + rng() % 14; n > 0; --n) word.push_back(static_cast<char>('a' + rng() % 3));
      std::vector<int32_t> got;
      model.tokenize(word, got);
      std::vector<std::string> got_tokens;
      for (int32_t id : got) got_tokens.push_back(*model.id_to_token(id));
      EXPECT_EQ(got_tokens, naive_bpe(word, merges)) << word;
    }
  }
}

nlohmann::json with_added(nlohmann::json tok, const nlohmann::json& added) {
  tok["added_tokens"] = added;
  return tok;
}

std::vector<int32_t> ids(std::initializer_list<std::variant<int32_t, std::string>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) {
    if (std::holds_alternative<int32_t>(p)) {
      out.push_back(std::get<int32_t>(p));
    } else {
      for (unsigned char c : std::get<std::string>(p)) out.push_back(c);
    }
  }
  return out;
}

TEST(AddedTokens, MatchedBeforePreTokenizationLongestFirst) {
  TempTokenizerDir dir;
  auto tok = load(dir, with_added(toy_tokenizer({}), {testing::added_token(300, "<|a|>"),
                                                      testing::added_token(301, "<|a|><|b|>"),
                                                      testing::added_token(302, "<|b|>", false)}));
  EXPECT_EQ(tok->encode("x<|a|><|b|>y<|b|>", false), ids({"x", 301, "y", 302}));
  EXPECT_EQ(tok->encode("<|a|> <|b|>", false), ids({300, std::string("\x20", 1), 302}));
  EXPECT_TRUE(tok->is_special(300));
  EXPECT_FALSE(tok->is_special(302));
  EXPECT_EQ(tok->vocab_size(), 303);
  EXPECT_EQ(tok->decode({300, 'x', 302}, false), "<|a|>x<|b|>");
  EXPECT_EQ(tok->decode({300, 'x', 302}, true), "x<|b|>");  // only special tokens are skipped
}

// The cases of HF tokenizers' added_vocabulary tests.
TEST(AddedTokens, LstripRstripSingleWord) {
  TempTokenizerDir dir;
  auto t = toy_tokenizer({});
  auto mask = testing::added_token(300, "<mask>", false);
  mask["single_word"] = true;
  auto tok = load(dir, with_added(t, nlohmann::json::array({mask})));
  // Left, in the middle, not a single word on the left or right, end of sentence.
  EXPECT_EQ(tok->encode("<mask> My name <mask> A<mask> <mask>ony <mask>", false),
            ids({300, " My name ", 300, " A<mask> <mask>ony ", 300}));
  // Punctuation is not a word character, a combining mark is.
  EXPECT_EQ(tok->encode("<mask>, <mask>- \xE2\x97\x8C\xCC\xB0<mask>", false),
            ids({300, ", ", 300, "- \xE2\x97\x8C\xCC\xB0<mask>"}));

  TempTokenizerDir dir2;
  mask["lstrip"] = true;
  mask["rstrip"] = true;
  auto strip = load(dir2, with_added(t, nlohmann::json::array({mask})));
  // Spaces around are absorbed by the token; a \t counts, the space already taken does not repeat.
  EXPECT_EQ(strip->encode("Hi <mask> there\t<mask>\t<mask>\xE2\x80\x80", false),
            ids({"Hi", 300, "there", 300, 300}));
}

TEST(AddedTokens, NormalizedTokensMatchTheNormalizedText) {
  auto t = toy_tokenizer({});
  t["normalizer"] = {{"type", "NFC"}};
  auto raw = testing::added_token(300, "\xC3\xA9", false);  // é, matched on the raw text
  auto norm = raw;
  norm["normalized"] = true;
  const std::string decomposed = "e\xCC\x81";
  TempTokenizerDir a, b;
  auto raw_tok = load(a, with_added(t, nlohmann::json::array({raw})));
  auto norm_tok = load(b, with_added(t, nlohmann::json::array({norm})));
  EXPECT_EQ(norm_tok->encode("x" + decomposed, false), ids({"x", 300}));
  EXPECT_EQ(raw_tok->encode("x" + decomposed, false), ids({"x\xC3\xA9"}));  // normalized, then BPE'd as bytes
  EXPECT_EQ(raw_tok->encode("x\xC3\xA9", false), ids({"x", 300}));
}

TEST(PostProcessor, TemplateProcessingWrapsTheSequence) {
  auto t = with_added(toy_tokenizer({}), {testing::added_token(300, "<s>"), testing::added_token(301, "</s>")});
  t["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}},
        {{"type", "TemplateProcessing"},
         {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                     {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
         {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {300}}, {"tokens", {"<s>"}}}},
                             {"</s>", {{"id", "</s>"}, {"ids", {301}}, {"tokens", {"</s>"}}}}}}}}}};
  TempTokenizerDir dir;
  auto tok = load(dir, t, {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  EXPECT_EQ(tok->encode("hi", true), ids({300, "hi", 301}));
  EXPECT_EQ(tok->encode("hi", false), ids({"hi"}));
  EXPECT_EQ(tok->encode("", true), ids({300, 301}));
  EXPECT_TRUE(tok->add_bos_token());
  EXPECT_EQ(tok->bos_token_id(), 300);
  EXPECT_EQ(tok->eos_token_id(), 301);

  // add_bos_token / add_eos_token in tokenizer_config.json replace the post-processor, as in transformers.
  TempTokenizerDir dir2;
  auto tok2 = load(dir2, t, {{"bos_token", "<s>"}, {"eos_token", {{"content", "</s>"}}}, {"add_bos_token", false},
                             {"add_eos_token", true}});
  EXPECT_EQ(tok2->encode("hi", true), ids({"hi", 301}));
  EXPECT_FALSE(tok2->add_bos_token());
}

TEST(Config, NamedSpecialTokensAreRegistered) {
  TempTokenizerDir dir;
  auto t = with_added(toy_tokenizer({}), nlohmann::json::array({testing::added_token(256, "<|end|>", false)}));
  dir.write("chat_template.jinja", "{{ messages }}");
  auto tok = load(dir, t,
                  {{"bos_token", {{"__type", "AddedToken"}, {"content", "<|start|>"}, {"normalized", false}}},
                   {"eos_token", "<|end|>"},
                   {"pad_token", nullptr},
                   {"add_bos_token", true},
                   {"additional_special_tokens", {"<|tool|>"}},
                   {"chat_template", "ignored: the .jinja file wins"}});
  // <|start|> and <|tool|> were not in tokenizer.json: they get the next ids after the vocab.
  EXPECT_EQ(tok->bos_token_id(), 257);
  EXPECT_EQ(tok->token_to_id("<|tool|>"), 258);
  EXPECT_EQ(tok->vocab_size(), 259);
  EXPECT_TRUE(tok->is_special(256));  // named as eos, so special although tokenizer.json said not
  EXPECT_TRUE(tok->is_special(257));
  EXPECT_EQ(tok->encode("a<|tool|>", true), ids({257, "a", 258}));
  EXPECT_EQ(tok->decode(ids({257, "a", 258, 256}), true), "a");
  EXPECT_EQ(tok->chat_template(), "{{ messages }}");
}

TEST(Config, AddedTokensDecoderAndExtraSpecialTokensMap) {
  TempTokenizerDir dir;
  auto tok = load(dir, toy_tokenizer({}),
                  {{"added_tokens_decoder",
                    {{"256", {{"content", "<tool>"}, {"special", false}, {"normalized", false}}},
                     {"257", {{"content", "<sys>"}, {"special", true}, {"normalized", false}}}}},
                   {"extra_special_tokens", {{"image_token", "<image>"}}}});
  EXPECT_EQ(tok->token_to_id("<tool>"), 256);
  EXPECT_EQ(tok->token_to_id("<sys>"), 257);
  EXPECT_EQ(tok->token_to_id("<image>"), 258);
  EXPECT_FALSE(tok->is_special(256));
  EXPECT_TRUE(tok->is_special(257));
  EXPECT_TRUE(tok->is_special(258));
  EXPECT_EQ(tok->encode("<image>x<tool>", false), ids({258, "x", 256}));
}

TEST(Config, SplitSpecialTokensEncodesThemAsText) {
  TempTokenizerDir dir;
  auto tok = load(dir, with_added(toy_tokenizer({}), {testing::added_token(256, "<x>"), testing::added_token(257, "<y>", false)}),
                  {{"split_special_tokens", true}});
  EXPECT_EQ(tok->encode("<x><y>", false), ids({"<x>", 257}));
}

TEST(Config, ChatTemplateListPicksDefault) {
  TempTokenizerDir dir;
  auto tok = load(dir, toy_tokenizer({}),
                  {{"chat_template", {{{"name", "tool_use"}, {"template", "T"}}, {{"name", "default"}, {"template", "D"}}}}});
  EXPECT_EQ(tok->chat_template(), "D");
  EXPECT_EQ(tok->bos_token(), "");
  EXPECT_EQ(tok->bos_token_id(), std::nullopt);
  EXPECT_FALSE(tok->add_bos_token());
}

TEST(Encode, InvalidUtf8InputIsReplacedNotRejected) {
  TempTokenizerDir dir;
  auto tok = load(dir, toy_tokenizer({}));
  EXPECT_EQ(tok->encode("a\xFF" "b", false), ids({"a\xEF\xBF\xBD" "b"}));
}

}  // namespace
}  // namespace specula
