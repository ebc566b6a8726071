// Digit-range grammars: exact integer ranges, and bounded numbers that never admit a value out of
// range, checked exhaustively on small domains.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "structured_output/grammar_automaton.h"
#include "structured_output/number_range.h"

namespace specula {
namespace {

Grammar int_grammar(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  GrammarBuilder b;
  Symbol s = integer_range(b, lo, hi);
  return b.build(b.add("root", {{s}}));
}

TEST(IntegerRange, ExactOnSmallDomains) {
  const std::optional<int64_t> ends[] = {std::nullopt, -1000, -101, -100, -99, -10, -9, -1, 0, 1, 9, 10, 11, 99, 100, 101, 999, 1000, 1234};
  for (auto lo : ends) {
    for (auto hi : ends) {
      if (lo && hi && *lo > *hi) continue;
      Grammar g = int_grammar(lo, hi);
      for (int v = -1300; v <= 1300; ++v) {
        const bool in = (!lo || v >= *lo) && (!hi || v <= *hi);
        ASSERT_EQ(grammar_matches(g, std::to_string(v)), in)
            << (lo ? std::to_string(*lo) : "-inf") << ".." << (hi ? std::to_string(*hi) : "inf") << " " << v;
      }
      EXPECT_FALSE(grammar_matches(g, "-0"));
      EXPECT_FALSE(grammar_matches(g, "007"));
    }
  }
}

TEST(IntegerRange, LargeAndClampedBounds) {
  Grammar g = int_grammar(123456789012LL, 123456799999LL);
  EXPECT_TRUE(grammar_matches(g, "123456789012"));
  EXPECT_TRUE(grammar_matches(g, "123456790000"));
  EXPECT_FALSE(grammar_matches(g, "123456789011"));
  EXPECT_FALSE(grammar_matches(g, "123456800000"));
  // Bounds beyond 10^18 - 1 move inward: nothing outside the schema's range is produced.
  Grammar wide = int_grammar(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  EXPECT_TRUE(grammar_matches(wide, "999999999999999999"));
  EXPECT_FALSE(grammar_matches(wide, "1000000000000000000"));
  EXPECT_TRUE(grammar_matches(wide, "-999999999999999999"));
  Grammar above = int_grammar(5, std::nullopt);
  EXPECT_TRUE(grammar_matches(above, "123456789012345678901234567890"));  // unbounded stays unbounded
  GrammarBuilder b;
  EXPECT_THROW(integer_range(b, 5, 4), Error);
}

TEST(NumberRange, WrittenWithoutExponentAndInRange) {
  GrammarBuilder b;
  Symbol s = number_range(b, NumberBound{-1, true}, NumberBound{2.5, false});
  Grammar g = b.build(b.add("root", {{s}}));
  for (const char* ok : {"0", "-0.5", "-0.999", "2", "1.99", "0.0"}) EXPECT_TRUE(grammar_matches(g, ok)) << ok;
  for (const char* bad : {"-1", "-1.0", "3", "2.6", "2.4" /* rounded inward */, "1e0", "-2", "01"}) EXPECT_FALSE(grammar_matches(g, bad)) << bad;
}

}  // namespace
}  // namespace specula
