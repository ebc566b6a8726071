// Regex front end: whole-output matching of the PCRE / JSON Schema `pattern` subset, its JSON
// string form, and errors naming the unsupported construct and its offset.
#include <gtest/gtest.h>

#include <random>
#include <regex>
#include <string>
#include <vector>

#include "core/error.h"
#include "structured_output/grammar_automaton.h"
#include "structured_output/regex_to_grammar.h"

namespace specula {
namespace {

void expect_language(std::string_view pattern, std::vector<std::string> accepted, std::vector<std::string> rejected) {
  Grammar g = regex_to_grammar(pattern);
  for (const std::string& s : accepted) EXPECT_TRUE(grammar_matches(g, s)) << pattern << " should match '" << s << "'";
  for (const std::string& s : rejected) EXPECT_FALSE(grammar_matches(g, s)) << pattern << " should not match '" << s << "'";
}

std::string error_of(std::string_view pattern) {
  try {
    regex_to_grammar(pattern);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RegexToGrammar, LiteralsAndConcatenation) {
  expect_language("abc", {"abc"}, {"", "ab", "abcd", "abd"});
  expect_language("a\\.b\\*", {"a.b*"}, {"axb*", "a.b"});
  expect_language("héllo", {"héllo"}, {"hello"});
}

TEST(RegexToGrammar, AgreesWithStdRegexOnRandomStrings) {
  // Overlapping classes, `.` and nullable repeats: the automaton shares one transition among the
  // bytes a state's sets treat alike, which must never merge bytes that lead apart. std::regex
  // (ECMAScript) is the reference; a fresh automaton per pattern, strings drawn from a small
  // alphabet with a newline so that matches and near misses both occur.
  const char* patterns[] = {"([a-c]x|[b-d]y|.z)*", "(.?){0,6}[ab]", "([^a]|aa)*b?", "(a|[a-c][c-e]|\\n.)+",
                            "[a-e]{2,4}(x|y.)?"};
  const std::string alphabet = "abcdexyz\n";
  std::mt19937 rng(11);
  for (const char* pattern : patterns) {
    const std::regex reference(pattern);
    GrammarAutomaton a(regex_to_grammar(pattern));
    int matched = 0;
    for (int trial = 0; trial < 400; ++trial) {
      std::string text(rng() % 9, ' ');
      for (char& c : text) c = alphabet[rng() % alphabet.size()];
      const bool expect = std::regex_match(text, reference);
      matched += expect ? 1 : 0;
      EXPECT_EQ(a.accepting(a.advance(a.initial(), text)), expect) << pattern << " on '" << text << "'";
    }
    EXPECT_GT(matched, 0) << pattern;
  }
}

TEST(RegexToGrammar, AlternationAndGroups) {
  expect_language("cat|dog|", {"cat", "dog", ""}, {"ca", "catdog"});
  expect_language("(ab|cd)+e", {"abe", "cdabe", "ababcde"}, {"e", "abcd", "ace"});
  expect_language("(?:x|y)(?<name>z)(?P<other>w)", {"xzw", "yzw"}, {"zw", "xyzw"});
}

TEST(RegexToGrammar, Quantifiers) {
  expect_language("a*b+c?", {"b", "aab", "abbbc", "bc"}, {"", "a", "ac", "abcc"});
  expect_language("x{3}", {"xxx"}, {"xx", "xxxx"});
  expect_language("x{2,}", {"xx", "xxxxxxx"}, {"x", ""});
  expect_language("x{1,3}", {"x", "xx", "xxx"}, {"", "xxxx"});
  expect_language("x{,2}", {"", "x", "xx"}, {"xxx"});
  expect_language("a*?b+?c??", {"b", "aabbc"}, {"c"});  // lazy: same language
  expect_language("a{x}", {"a{x}"}, {"a"});             // not a quantifier: literal
}

TEST(RegexToGrammar, NullableBodiesUnderStarAreNotLeftRecursive) {
  expect_language("(a?)*", {"", "a", "aaaa"}, {"b"});
  expect_language("(a*b*)+c", {"c", "abc", "bbaac"}, {"ab"});
  expect_language("(|x)*y", {"y", "xxy"}, {"x"});
  expect_language("((a?)(b?))*", {"", "ab", "ba", "aab"}, {"c"});
}

TEST(RegexToGrammar, ClassesAndEscapes) {
  expect_language("[a-c]+", {"abcabc"}, {"", "abd"});
  expect_language("[^a-c]", {"d", "é", "\n"}, {"a", "", "dd"});
  expect_language("[]a]", {"]", "a"}, {"b"});
  expect_language("[a\\-z]", {"a", "-", "z"}, {"b"});
  expect_language("[\\d_]+", {"12_3"}, {"a"});
  expect_language("\\d\\w\\s", {"1a ", "9_\t"}, {"a1 ", "11a"});
  expect_language("\\D\\W\\S", {"a-x"}, {"1-x", "a_x", "a- "});
  expect_language("[[:alpha:][:digit:]]+", {"ab12"}, {"a-"});
  expect_language("\\x41\\u00e9\\u{1F600}\\x{42}", {"Aé😀B"}, {"Ae😀B"});
  expect_language("\\n\\t\\r\\f\\v\\0", {std::string("\n\t\r\f\v\0", 6)}, {"ntrfv0"});
  expect_language("[\\b]", {"\b"}, {"b"});
}

TEST(RegexToGrammar, DotIsAnyCodePointButNewline) {
  expect_language("a.c", {"abc", "a€c", "a😀c"}, {"a\nc", "ac", "abbc"});
  Grammar g = regex_to_grammar(".");
  EXPECT_FALSE(grammar_matches(g, "\xff"));  // not UTF-8
  EXPECT_TRUE(grammar_allows_prefix(g, "\xe2\x82"));  // inside a code point
}

TEST(RegexToGrammar, AnchorsOnlyAtTheEnds) {
  expect_language("^abc$", {"abc"}, {"abcd"});
  expect_language("^a|b$", {"a", "b"}, {"ab"});
  EXPECT_NE(error_of("a^b").find("'^'"), std::string::npos);
  EXPECT_NE(error_of("a$b").find("'$'"), std::string::npos);
  EXPECT_NE(error_of("(^a)").find("offset 1"), std::string::npos);
}

TEST(RegexToGrammar, PrefixesCanGrow) {
  Grammar g = regex_to_grammar("[0-9]{3}-[0-9]{4}");
  EXPECT_TRUE(grammar_allows_prefix(g, ""));
  EXPECT_TRUE(grammar_allows_prefix(g, "555-"));
  EXPECT_FALSE(grammar_allows_prefix(g, "55-"));
  EXPECT_TRUE(grammar_matches(g, "555-1234"));
}

TEST(RegexToGrammar, UnsupportedConstructsNameThemselvesAndTheirOffset) {
  EXPECT_NE(error_of("(a)\\1").find("backreferences are not supported at offset 3"), std::string::npos) << error_of("(a)\\1");
  EXPECT_NE(error_of("a(?=b)").find("lookahead assertions are not supported at offset 1"), std::string::npos);
  EXPECT_NE(error_of("a(?<!b)").find("lookbehind"), std::string::npos);
  EXPECT_NE(error_of("\\bword").find("word boundary"), std::string::npos);
  EXPECT_NE(error_of("(?i)abc").find("inline flags"), std::string::npos);
  EXPECT_NE(error_of("(?>a)").find("atomic"), std::string::npos);
  EXPECT_NE(error_of("a++").find("possessive"), std::string::npos);
  EXPECT_NE(error_of("\\p{L}").find("Unicode property"), std::string::npos);
  EXPECT_NE(error_of("(?P=n)").find("backreferences"), std::string::npos);
  EXPECT_NE(error_of("\\k<n>").find("backreferences"), std::string::npos);
  EXPECT_NE(error_of("*a").find("nothing to repeat at offset 0"), std::string::npos);
  EXPECT_NE(error_of("a**").find("quantifier"), std::string::npos);
  EXPECT_NE(error_of("(ab").find("missing ')'"), std::string::npos);
  EXPECT_NE(error_of("ab)").find("unmatched ')'"), std::string::npos);
  EXPECT_NE(error_of("[ab").find("missing ']'"), std::string::npos);
  EXPECT_NE(error_of("[z-a]").find("out of order"), std::string::npos);
  EXPECT_NE(error_of("a{5,2}").find("maximum is below"), std::string::npos);
  EXPECT_NE(error_of("a{20000}").find("above 10000"), std::string::npos);
  EXPECT_NE(error_of("(a{1000}){2000}").find("expands to more than"), std::string::npos);
  EXPECT_NE(error_of("\\q").find("unknown escape"), std::string::npos);
  EXPECT_NE(error_of("\\ud800").find("not a Unicode scalar value"), std::string::npos);
  // Parsing recurses once per group: 10^5 of them overflowed the stack.
  const std::string deep = std::string(100000, '(') + "a" + std::string(100000, ')');
  EXPECT_NE(error_of(deep).find("groups nest deeper than 256 levels at offset 256"), std::string::npos) << error_of(deep);
  EXPECT_TRUE(grammar_matches(regex_to_grammar(std::string(256, '(') + "a" + std::string(256, ')')), "a"));
}

TEST(RegexToGrammar, JsonStringBodyEscapesWhatJsonMust) {
  GrammarBuilder b;
  uint32_t body = add_regex_rule(b, "a\"b\\\\c[\\n/]", RegexTarget::kJsonStringBody);
  Sequence quoted = b.literal("\"");
  quoted.push_back(GrammarBuilder::ref(body));
  quoted.push_back(b.bytes(ByteSet::of('"')));
  Grammar g = b.build(b.add("root", {quoted}));
  EXPECT_TRUE(grammar_matches(g, R"("a\"b\\c\n")"));
  EXPECT_TRUE(grammar_matches(g, R"("a\"b\\c/")"));
  EXPECT_TRUE(grammar_matches(g, R"("a\"b\\c\/")"));
  EXPECT_FALSE(grammar_matches(g, "\"a\"b\\\\c/\""));  // raw quote
  EXPECT_FALSE(grammar_matches(g, "\"a\\\"b\\c/\""));  // raw backslash
  EXPECT_FALSE(grammar_matches(g, "\"a\\\"b\\\\c\n\""));  // raw newline
}

TEST(RegexToGrammar, JsonStringBodyOfANegatedClassEscapesControls) {
  GrammarBuilder b;
  uint32_t body = add_regex_rule(b, "[^a]*", RegexTarget::kJsonStringBody);
  Grammar g = b.build(body);
  EXPECT_TRUE(grammar_matches(g, "xyz\\u0001\\t\\\"é"));
  EXPECT_TRUE(grammar_matches(g, "\\u001F\\u001f"));
  EXPECT_FALSE(grammar_matches(g, "xa"));
  EXPECT_FALSE(grammar_matches(g, "\t"));
  EXPECT_FALSE(grammar_matches(g, "\\"));
}

}  // namespace
}  // namespace specula
