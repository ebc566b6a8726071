// EBNF grammars as users send them: llama.cpp's GBNF and the EBNF of vLLM / xgrammar, parsed into
// a Grammar. One syntax covers both:
//
//   rule-name ::= alternative | alternative      (`=` is accepted for `::=`)
//   "literal" 'literal'   escapes \n \r \t \\ \" \' \xHH \uHHHH \UHHHHHHHH
//   [a-z_] [^"\\]         code point classes, the same escapes, plus \] \[ \- \^
//   .                     any one code point
//   ( ... )  x*  x+  x?  x{m}  x{m,}  x{m,n}
//   # comment to the end of the line
//
// Whitespace and newlines are insignificant, so alternatives may span lines; a rule ends where
// `name ::=` starts the next one. Rule names are letters, digits, `-` and `_`. Errors are
// specula::Error with line:column and what was expected there; an undefined rule is named with
// where it was first used; left recursion is reported by GrammarBuilder::build.
#pragma once

#include <string_view>

#include "structured_output/grammar.h"

namespace specula {

// Repetition counts above this are rejected ({m,n} unrolls into m + (n - m) copies).
inline constexpr int kMaxEbnfRepeat = 10000;
// Groups nested deeper than this are rejected: the parser recurses once per level.
inline constexpr int kMaxEbnfNesting = 256;

Grammar parse_ebnf(std::string_view text, std::string_view root = "root");

}  // namespace specula
