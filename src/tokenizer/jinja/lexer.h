// Splits a template into tokens the way jinja2's lexer does with trim_blocks=True and
// lstrip_blocks=True (the settings transformers renders chat templates with): whitespace control
// (`{%-`, `-%}`, `{{-`, `-}}`, `{%+`, `+%}`), the first newline after a block or comment removed,
// blanks before a block or comment tag at the start of a line removed, comments dropped, raw blocks
// kept verbatim, newlines normalised and one trailing newline dropped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace specula::jinja {

enum class TokenType {
  Data,        // template text, already whitespace-controlled
  BlockBegin,  // {%
  BlockEnd,    // %}
  VarBegin,    // {{
  VarEnd,      // }}
  Name,
  String,  // value: the unescaped string
  Integer,
  Float,
  Operator,  // value: the operator text ("+", "//", "(", ...)
  Eof,
};

struct Token {
  TokenType type;
  std::string value;
  int line = 1;
  int64_t int_value = 0;
  double float_value = 0.0;
};

// Throws specula::Error naming the line for malformed input (unterminated tag, string or comment,
// an unexpected character, unbalanced brackets).
std::vector<Token> tokenize(const std::string& source);

}  // namespace specula::jinja
