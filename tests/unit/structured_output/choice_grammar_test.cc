// Choice front end: exactly one of the strings, prefixes shared, bytes taken literally.
#include <gtest/gtest.h>

#include "core/error.h"
#include "structured_output/choice_grammar.h"
#include "structured_output/grammar_automaton.h"

namespace specula {
namespace {

TEST(ChoiceGrammar, ExactlyOneChoice) {
  Grammar g = choice_grammar({"positive", "pos", "neg*", "", "naïve"});
  for (const char* s : {"positive", "pos", "neg*", "", "naïve"}) EXPECT_TRUE(grammar_matches(g, s)) << s;
  for (const char* s : {"posi", "negg", "positivepos", " pos", "naive"}) EXPECT_FALSE(grammar_matches(g, s)) << s;
  EXPECT_TRUE(grammar_allows_prefix(g, "posit"));
  EXPECT_FALSE(grammar_allows_prefix(g, "x"));
}

TEST(ChoiceGrammar, EmptyListIsAnError) {
  EXPECT_THROW(choice_grammar({}), Error);
}

}  // namespace
}  // namespace specula
