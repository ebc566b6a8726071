#include "structured_output/grammar_automaton.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "unit/structured_output/doubled_optionals.h"

namespace specula {
namespace {

// list ::= "[" (item ("," item)*)? "]" ; item ::= [a-z]+ | list
Grammar nested_lists() {
  GrammarBuilder b;
  uint32_t list = b.declare("list");
  uint32_t item = b.declare("item");
  Sequence comma_item = b.literal(",");
  comma_item.push_back(GrammarBuilder::ref(item));
  Sequence items{GrammarBuilder::ref(item), b.star(comma_item)};
  Sequence body = b.literal("[");
  body.push_back(b.optional(items));
  Sequence close = b.literal("]");
  body.insert(body.end(), close.begin(), close.end());
  b.define(list, {body});
  b.define(item, {{b.plus({b.bytes(ByteSet::range('a', 'z'))})}, {GrammarBuilder::ref(list)}});
  return b.build(list);
}

TEST(GrammarAutomaton, MatchesNestedRecursion) {
  Grammar g = nested_lists();
  for (const char* ok : {"[]", "[a]", "[ab,c]", "[[a],[b,[c]],d]", "[[[[[[]]]]]]"}) EXPECT_TRUE(grammar_matches(g, ok)) << ok;
  for (const char* bad : {"", "[", "[a,]", "[,a]", "[A]", "[a]]", "[[a]"}) EXPECT_FALSE(grammar_matches(g, bad)) << bad;
  EXPECT_TRUE(grammar_allows_prefix(g, "[[a],[b"));
  EXPECT_FALSE(grammar_allows_prefix(g, "[[a]]x"));
}

TEST(GrammarAutomaton, StatesAreSharedAcrossEqualSituations) {
  GrammarAutomaton a(nested_lists());
  auto s1 = a.advance(a.initial(), "[abc");
  auto s2 = a.advance(a.initial(), "[x");
  EXPECT_EQ(s1, s2);  // inside the first item's letters either way
  EXPECT_NE(a.advance(a.initial(), "[[x"), s1);
  EXPECT_TRUE(a.can_continue(s1));
  EXPECT_FALSE(a.accepting(s1));
  auto done = a.advance(a.initial(), "[a]");
  EXPECT_TRUE(a.accepting(done));
  EXPECT_FALSE(a.can_continue(done));
  EXPECT_EQ(a.advance(done, 'x'), GrammarAutomaton::kDead);
}

TEST(GrammarAutomaton, LongRepetitionKeepsOneState) {
  GrammarBuilder b;
  uint32_t root = b.add("root", {{b.star({b.bytes(ByteSet::range('a', 'b'))})}});
  GrammarAutomaton a(b.build(root));
  auto s = a.advance(a.initial(), std::string(10000, 'a'));
  EXPECT_TRUE(a.accepting(s));
  EXPECT_LE(a.num_states(), 4u);
}

TEST(GrammarAutomaton, AmbiguousAlternativesRunTogether) {
  // root ::= "ab" "c" | "a" [b-z]+ ; both alternatives live after "ab".
  GrammarBuilder b;
  Sequence first = b.literal("abc");
  Sequence second = b.literal("a");
  second.push_back(b.plus({b.bytes(ByteSet::range('b', 'z'))}));
  uint32_t root = b.add("root", {first, second});
  Grammar g = b.build(root);
  EXPECT_TRUE(grammar_matches(g, "abc"));
  EXPECT_TRUE(grammar_matches(g, "abz"));
  EXPECT_TRUE(grammar_matches(g, "ab"));
  EXPECT_FALSE(grammar_matches(g, "a"));
}

TEST(GrammarAutomaton, CodePointsEncodeUtf8Ranges) {
  GrammarBuilder b;
  // Greek lowercase, CJK, an emoji range, and ASCII digits.
  Symbol cls = b.code_points({{0x3b1, 0x3c9}, {0x4e00, 0x9fff}, {0x1f600, 0x1f64f}, {'0', '9'}}, false);
  uint32_t root = b.add("root", {{b.plus({cls})}});
  Grammar g = b.build(root);
  EXPECT_TRUE(grammar_matches(g, "\xce\xb1\xcf\x89"));        // αω
  EXPECT_TRUE(grammar_matches(g, "\xe4\xb8\x80\xe9\xbf\xbf"));  // 一 and U+9FFF
  EXPECT_TRUE(grammar_matches(g, "\xf0\x9f\x98\x80" "7"));      // 😀7
  EXPECT_FALSE(grammar_matches(g, "\xce\xb0"));                 // U+03B0, just below
  EXPECT_FALSE(grammar_matches(g, "a"));
  EXPECT_FALSE(grammar_matches(g, "\xe4\xb8"));                 // a cut character
  GrammarBuilder nb;
  Symbol not_quote = nb.code_points({{'"', '"'}}, true);
  Grammar ng = nb.build(nb.add("root", {{nb.star({not_quote})}}));
  EXPECT_TRUE(grammar_matches(ng, "h\xc3\xa9llo \xf4\x8f\xbf\xbf"));  // é and U+10FFFF
  EXPECT_FALSE(grammar_matches(ng, "a\"b"));
  EXPECT_FALSE(grammar_matches(ng, "\xed\xa0\x80"));  // an encoded surrogate
  EXPECT_FALSE(grammar_matches(ng, "\xc0\xaf"));      // overlong
}

TEST(GrammarAutomaton, RepeatBounds) {
  GrammarBuilder b;
  Symbol digits = b.repeat({b.bytes(ByteSet::range('0', '9'))}, 2, 4);
  Grammar g = b.build(b.add("root", {{digits}}));
  EXPECT_FALSE(grammar_matches(g, "1"));
  EXPECT_TRUE(grammar_matches(g, "12"));
  EXPECT_TRUE(grammar_matches(g, "1234"));
  EXPECT_FALSE(grammar_matches(g, "12345"));
}

TEST(GrammarAutomaton, FollowsAmbiguityWithinItsBound) {
  Grammar g = testing::doubled_optionals(8, "");  // 256 stacks a position
  EXPECT_TRUE(grammar_matches(g, ""));
  EXPECT_TRUE(grammar_matches(g, std::string(256, 'q')));
  EXPECT_FALSE(grammar_matches(g, std::string(257, 'q')));
}

TEST(GrammarAutomaton, RefusesAmbiguityBeyondItsBound) {
  // 2^40 stacks: refused after kMaxFramesPerPosition frames, without a call chain that deep
  // (recursion overflowed the stack here).
  try {
    GrammarAutomaton a(testing::doubled_optionals(40, ""));
    FAIL() << "no GrammarLimitError";
  } catch (const GrammarLimitError& e) {
    EXPECT_NE(std::string(e.what()).find("more than 16384 parse frames"), std::string::npos) << e.what();
  }
  // Reached mid-input: the byte that gets there throws; the automaton goes on answering the rest.
  GrammarAutomaton a(testing::doubled_optionals(40, "ab"));
  const GrammarAutomaton::StateId s = a.advance(a.initial(), 'a');
  EXPECT_THROW(a.advance(s, 'b'), GrammarLimitError);
  EXPECT_THROW(a.advance(s, 'b'), GrammarLimitError);  // not cached as a transition
  EXPECT_EQ(a.advance(s, 'x'), GrammarAutomaton::kDead);
  EXPECT_FALSE(a.accepting(s));
}

TEST(GrammarBuilder, RejectsLeftRecursionAndUndefinedRules) {
  {
    GrammarBuilder b;
    uint32_t e = b.declare("expr");
    Sequence rec{GrammarBuilder::ref(e)};
    Sequence plus = b.literal("+1");
    rec.insert(rec.end(), plus.begin(), plus.end());
    b.define(e, {rec, b.literal("1")});
    try {
      b.build(e);
      FAIL();
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("'expr' is left-recursive"), std::string::npos) << err.what();
    }
  }
  {
    GrammarBuilder b;
    uint32_t x = b.declare("value");
    uint32_t root = b.add("root", {{GrammarBuilder::ref(x)}});
    EXPECT_THROW(b.build(root), Error);
  }
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

TEST(GrammarBuilder, LongRepeatsBuildInLinearTime) {
  // 10000 optional links from one hint: a name search per declaration made this cubic.
  GrammarBuilder b;
  Symbol many = b.repeat({b.bytes(ByteSet::range('a', 'z'))}, 0, 10000);
  Grammar g = b.build(b.add("root", {{many}}));
  EXPECT_GT(g.num_rules(), 10000u);
  EXPECT_TRUE(grammar_matches(g, std::string(10000, 'q')));
  EXPECT_FALSE(grammar_matches(g, std::string(10001, 'q')));
}

}  // namespace
}  // namespace specula
