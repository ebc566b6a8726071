// Characters of a JSON string body, as the bytes a model writes between the quotes. Shared by the
// JSON Schema converter (plain strings, length bounds) and regex patterns applied to JSON strings
// (RegexTarget::kJsonStringBody): a character is written raw where JSON allows it, `"` `\` and
// control characters only escaped; raw control characters never appear.
#pragma once

#include <string_view>

#include "structured_output/code_point_set.h"
#include "structured_output/grammar.h"

namespace specula {

// One character of `chars`, JSON-encoded: raw, or `\"` `\\` `\/` `\b` `\f` `\n` `\r` `\t` or
// `\u00XX` for the characters of `chars` that need (or allow) them.
Symbol json_string_char(GrammarBuilder& b, const CodePointSet& chars, std::string_view hint = "jchar");

// Any one character of a JSON string body, every escape JSON allows included (`\uXXXX` for any
// XXXX): what a string with no other constraint accepts. One rule per builder, reused.
Symbol json_any_string_char(GrammarBuilder& b);

}  // namespace specula
