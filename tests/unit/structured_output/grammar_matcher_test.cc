#include "structured_output/grammar_matcher.h"

#include <gtest/gtest.h>

#include <random>

#include "unit/structured_output/doubled_optionals.h"

namespace specula {
namespace {

// root ::= "{" "\"a\"" ":" [0-9]+ "}"  over a vocabulary of single bytes, pieces and junk.
Grammar small_object() {
  GrammarBuilder b;
  Sequence s = b.literal("{\"a\":");
  s.push_back(b.plus({b.bytes(ByteSet::range('0', '9'))}));
  Sequence close = b.literal("}");
  s.insert(s.end(), close.begin(), close.end());
  return b.build(b.add("root", {s}));
}

std::vector<std::optional<std::string>> small_vocab() {
  std::vector<std::optional<std::string>> v;
  for (const char* t : {"{", "}", "\"", "a", ":", "0", "1", "9", "12", "{\"", "{\"a", "\"a\":", "\":", "1}", "}}", "b",
                        "x", " ", "a\"", "99}", "\xe4\xb8"})
    v.emplace_back(t);
  v.emplace_back(std::nullopt);  // 21: a special token (never allowed by bytes)
  v.emplace_back("");            // 22: eos, no bytes
  return v;
}

constexpr int32_t kEos = 22;

std::vector<int32_t> allowed_ids(GrammarMatcher& m, int64_t words) {
  std::vector<uint32_t> mask(static_cast<size_t>(words));
  m.fill_next_token_mask(mask);
  std::vector<int32_t> ids;
  for (int32_t t = 0; t < static_cast<int32_t>(words * 32); ++t)
    if (mask[t >> 5] >> (t & 31) & 1) ids.push_back(t);
  return ids;
}

TEST(GrammarMatcher, MaskEqualsBruteForceAlongRandomPaths) {
  auto vocab = std::make_shared<TokenVocabulary>(small_vocab());
  auto compiled = std::make_shared<CompiledGrammar>(small_object(), vocab);
  GrammarAutomaton reference(small_object());
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    GrammarMatcher m(compiled, {kEos});
    std::string text;
    for (int step = 0; step < 12 && !m.terminated(); ++step) {
      // Brute force: a token is allowed iff text + its bytes is still a prefix of a match.
      std::vector<int32_t> expect;
      auto s = reference.advance(reference.initial(), text);
      for (int32_t t = 0; t < vocab->size(); ++t) {
        std::string_view b = vocab->token_bytes(t);
        if (t == kEos ? reference.accepting(s) : !b.empty() && reference.advance(s, b) != GrammarAutomaton::kDead)
          expect.push_back(t);
      }
      std::vector<int32_t> got = allowed_ids(m, vocab->mask_words());
      ASSERT_EQ(got, expect) << "after '" << text << "'";
      for (int32_t t = 0; t < vocab->size(); ++t)
        EXPECT_EQ(m.allows(t), std::find(expect.begin(), expect.end(), t) != expect.end()) << t;
      int32_t pick = expect[rng() % expect.size()];
      ASSERT_TRUE(m.accept_token(pick));
      if (pick != kEos) text += vocab->token_bytes(pick);
    }
  }
}

TEST(GrammarMatcher, EndTokenOnlyWhereAccepting) {
  auto vocab = std::make_shared<TokenVocabulary>(small_vocab());
  GrammarMatcher m(std::make_shared<CompiledGrammar>(small_object(), vocab), {kEos});
  EXPECT_FALSE(m.allows(kEos));
  for (int32_t t : {10, 2, 4, 8}) ASSERT_TRUE(m.accept_token(t));  // {"a  "  :  12
  EXPECT_FALSE(m.allows(kEos));
  EXPECT_FALSE(m.accept_token(16));  // x
  EXPECT_EQ(m.num_accepted(), 4);
  ASSERT_TRUE(m.accept_token(1));   // }
  EXPECT_TRUE(m.accepting());
  EXPECT_EQ(allowed_ids(m, vocab->mask_words()), std::vector<int32_t>{kEos});
  ASSERT_TRUE(m.accept_token(kEos));
  EXPECT_TRUE(m.terminated());
  EXPECT_EQ(allowed_ids(m, vocab->mask_words()), std::vector<int32_t>{kEos});
  // A request that ignores eos goes on: end tokens only, each accepted.
  EXPECT_FALSE(m.accept_token(6));
  ASSERT_TRUE(m.accept_token(kEos));
  EXPECT_TRUE(m.terminated());
  m.rollback(1);
  m.rollback(2);
  EXPECT_FALSE(m.terminated());
  EXPECT_EQ(m.num_accepted(), 4);
  EXPECT_TRUE(m.allows(19));  // 99}
}

TEST(GrammarMatcher, AGrammarBeyondTheAutomatonsBoundFailsTheMatcherNotItsCaller) {
  // Longer than any token, the prefix keeps the first masks clear of the ambiguity after it.
  auto vocab = std::make_shared<TokenVocabulary>(small_vocab());
  GrammarMatcher m(std::make_shared<CompiledGrammar>(testing::doubled_optionals(40, "{{{{{{"), vocab), {kEos});
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(allowed_ids(m, vocab->mask_words()), std::vector<int32_t>{0});
    ASSERT_TRUE(m.accept_token(0));  // {
  }
  EXPECT_FALSE(m.failed());
  // The next mask reaches the ambiguity: end tokens only, and the matcher says why.
  EXPECT_EQ(allowed_ids(m, vocab->mask_words()), std::vector<int32_t>{kEos});
  ASSERT_TRUE(m.failed());
  EXPECT_NE(m.error().find("parse frames"), std::string::npos) << m.error();
  // Whatever the step sampled meanwhile is taken in (drafts too): the engine ends the request.
  EXPECT_TRUE(m.accept_token(16));
  const std::vector<int32_t> drafts = {0, 3};
  std::vector<uint32_t> masks(3 * static_cast<size_t>(vocab->mask_words()));
  EXPECT_EQ(m.fill_draft_masks(drafts, masks), 2);
  EXPECT_FALSE(m.accepting());
  m.rollback(1);
  EXPECT_TRUE(m.failed());
}

TEST(GrammarMatcher, DraftMasksStopAtTheFirstForbiddenDraft) {
  auto vocab = std::make_shared<TokenVocabulary>(small_vocab());
  GrammarMatcher m(std::make_shared<CompiledGrammar>(small_object(), vocab), {kEos});
  const std::vector<int32_t> drafts = {10, 2, 16, 6};  // {"a  "  x  1: x is forbidden
  const size_t words = static_cast<size_t>(vocab->mask_words());
  std::vector<uint32_t> masks(5 * words, 0xdeadbeef);  // rows 3 and 4 repeat row 2
  EXPECT_EQ(m.fill_draft_masks(drafts, masks), 2);
  EXPECT_EQ(m.num_accepted(), 0);
  // Row 2 (after {"a") allows : and not x.
  auto bit = [&](int row, int32_t t) { return masks[row * words + (t >> 5)] >> (t & 31) & 1; };
  EXPECT_TRUE(bit(2, 4));
  EXPECT_FALSE(bit(2, 16));
  EXPECT_TRUE(bit(0, 0));
  EXPECT_FALSE(bit(0, 1));
  for (size_t w = 0; w < words; ++w) {
    EXPECT_EQ(masks[3 * words + w], masks[2 * words + w]);
    EXPECT_EQ(masks[4 * words + w], masks[2 * words + w]);
  }
}

}  // namespace
}  // namespace specula
