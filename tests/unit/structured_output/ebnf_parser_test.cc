// EBNF / GBNF front end: the syntax forms users send, checked through the language they accept,
// and errors with line:column.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "structured_output/ebnf_parser.h"
#include "structured_output/grammar_automaton.h"

namespace specula {
namespace {

void expect_language(std::string_view ebnf, std::vector<std::string> accepted, std::vector<std::string> rejected) {
  Grammar g = parse_ebnf(ebnf);
  for (const std::string& s : accepted) EXPECT_TRUE(grammar_matches(g, s)) << ebnf << "\nshould match '" << s << "'";
  for (const std::string& s : rejected) EXPECT_FALSE(grammar_matches(g, s)) << ebnf << "\nshould not match '" << s << "'";
}

std::string error_of(std::string_view ebnf, std::string_view root = "root") {
  try {
    parse_ebnf(ebnf, root);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(EbnfParser, LiteralsAlternativesAndRules) {
  expect_language(R"(root ::= "yes" | "no")", {"yes", "no"}, {"", "yesno", "maybe"});
  expect_language("root ::= greeting \" \" name\ngreeting ::= \"hi\" | \"hello\"\nname ::= [a-z]+",
                  {"hi bob", "hello x"}, {"hi", "hello Bob", "hey bob"});
  expect_language(R"(root = 'single' "double")", {"singledouble"}, {"single"});
}

TEST(EbnfParser, MultiLineAlternativesAndComments) {
  expect_language(R"(# a comment line
root ::= a    # trailing comment
       | b
       | (
           "c"
           "d"
         )
a ::= "a"
b ::=
  "b"
)",
                  {"a", "b", "cd"}, {"c", "ab", ""});
}

TEST(EbnfParser, GroupsAndRepetition) {
  expect_language(R"(root ::= ("ab" | "c")* "!")", {"!", "ab!", "cabc!"}, {"a!", "ab"});
  expect_language(R"(root ::= "x"+ "y"? "z")", {"xz", "xxyz"}, {"z", "xyyz"});
  expect_language(R"(root ::= [0-9]{3})", {"123"}, {"12", "1234"});
  expect_language(R"(root ::= [0-9]{2,})", {"12", "12345"}, {"1"});
  expect_language(R"(root ::= [0-9]{1,3})", {"1", "123"}, {"", "1234"});
  expect_language(R"(root ::= ("a" "b"){ 2 , 3 })", {"abab", "ababab"}, {"ab", "abababab"});
}

TEST(EbnfParser, StringEscapes) {
  expect_language(R"(root ::= "\n\t\r\\\"\x41\u00e9\U0001F600'")", {"\n\t\r\\\"Aé😀'"}, {"ntr"});
  expect_language(R"(root ::= "é😀")", {"é😀"}, {"e"});
  expect_language(R"(root ::= "" "a" "")", {"a"}, {""});
}

TEST(EbnfParser, CharacterClassesAndDot) {
  expect_language(R"(root ::= [a-zA-Z_] [a-zA-Z0-9_-]*)", {"a", "_x-1", "Z9"}, {"1a", "", "a b"});
  expect_language(R"(root ::= [^"\\\n]+)", {"abc", "é"}, {"a\"", "a\\", "\n"});
  expect_language(R"(root ::= [\]\[\-\^]+)", {"][-^"}, {"a"});
  expect_language(R"(root ::= [\x00-\x1f\u00e9])", {"\x01", "é"}, {"a"});
  expect_language(R"(root ::= . .)", {"ab", "é😀", "\n\n"}, {"a", "abc"});
  Grammar g = parse_ebnf(R"(root ::= [^a])");
  EXPECT_FALSE(grammar_matches(g, "\xc3"));
  EXPECT_TRUE(grammar_allows_prefix(g, "\xc3"));
}

TEST(EbnfParser, RuleNamesWithDashesAndRecursion) {
  const char* json_like = R"(
root      ::= value
value     ::= object | array | number
object    ::= "{" ( pair ( "," pair )* )? "}"
pair      ::= "k" ":" value
array     ::= "[" ( value ( "," value )* )? "]"
number    ::= [0-9]+
)";
  expect_language(json_like, {"1", "[]", "[1,[2,{}]]", "{k:{k:[3]}}"}, {"[1,]", "{k}", "[[]"});
  expect_language("root ::= my-rule_2\nmy-rule_2 ::= \"ok\"", {"ok"}, {"no"});
}

TEST(EbnfParser, AnotherRootName) {
  Grammar g = parse_ebnf("expr ::= term (\"+\" term)*\nterm ::= [0-9]", "expr");
  EXPECT_TRUE(grammar_matches(g, "1+2+3"));
  EXPECT_FALSE(grammar_matches(g, "1+"));
  EXPECT_TRUE(grammar_allows_prefix(g, "1+"));
}

TEST(EbnfParser, ErrorsHaveLineAndColumn) {
  EXPECT_EQ(error_of("root ::= \"a\" | missing"), "grammar: undefined rule 'missing' used at 1:16");
  EXPECT_NE(error_of("a ::= \"a\"").find("no rule named 'root'"), std::string::npos);
  EXPECT_EQ(error_of("root ::= \"a\"\nroot ::= \"b\""), "grammar: rule 'root' is defined twice at 2:1");
  EXPECT_NE(error_of("root ::= \"abc").find("unterminated string literal at 1:10"), std::string::npos);
  EXPECT_NE(error_of("root ::= [abc").find("unterminated character class at 1:10"), std::string::npos);
  EXPECT_NE(error_of("root ::= (\"a\"").find("expected ')'"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\")").find("unmatched ')' at 1:13"), std::string::npos);
  EXPECT_NE(error_of("root \"a\"").find("expected '::=' after the rule name 'root' at 1:5"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"\\q\"").find("unknown escape '\\q' at 1:11"), std::string::npos);
  EXPECT_NE(error_of("root ::=\n  \"a\" @").find("at 2:7"), std::string::npos) << error_of("root ::=\n  \"a\" @");
  EXPECT_NE(error_of("root ::= [z-a]").find("out of order"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{3,1}").find("maximum is below"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{20000}").find("above 10000"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\" (= \"b\")").find("lookahead"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"\\ud800\"").find("not a Unicode scalar value"), std::string::npos);
}

TEST(EbnfParser, DeepGroupsAndLongRuleChains) {
  // Groups recurse once per level in the parser: 10^5 of them overflowed the stack.
  const std::string deep = "root ::= " + std::string(100000, '(') + "\"a\"" + std::string(100000, ')');
  EXPECT_NE(error_of(deep).find("groups nest deeper than 256 levels at 1:266"), std::string::npos) << error_of(deep);
  EXPECT_TRUE(grammar_matches(parse_ebnf("root ::= " + std::string(256, '(') + "\"a\"" + std::string(256, ')')), "a"));
  // 10^5 rules, each calling the next first: the builder's checks run without recursion and in
  // linear time (a pass per change took two minutes at 5 x 10^4); a chain closing into a cycle is
  // left recursion, reported as such.
  const int n = 100000;
  std::string chain = "root ::= r0\n";
  for (int i = 0; i < n; ++i) chain += fmt::format("r{} ::= r{} \"a\"\n", i, i + 1);
  Grammar g = parse_ebnf(chain + fmt::format("r{} ::= \"b\"\n", n));
  EXPECT_EQ(g.num_rules(), static_cast<size_t>(n + 2));
  EXPECT_NE(error_of(chain + fmt::format("r{} ::= r0 | \"b\"\n", n)).find("left-recursive"), std::string::npos);
}

TEST(EbnfParser, LeftRecursionIsReportedByTheBuilder) {
  std::string e = error_of("root ::= root \"a\" | \"b\"");
  EXPECT_NE(e.find("left-recursive"), std::string::npos) << e;
  e = error_of("root ::= x\nx ::= y \"a\"\ny ::= \"\" | x");
  EXPECT_NE(e.find("left-recursive"), std::string::npos) << e;
}

}  // namespace
}  // namespace specula
