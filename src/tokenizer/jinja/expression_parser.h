// Expressions with jinja2's grammar and precedence (loosest first): conditional, or, and, not,
// comparisons and `in`, + -, ~, * / // %, **, unary - +, then primaries with postfix subscripts,
// calls, filters (`|`) and tests (`is`). Filters, tests and method calls the interpreter does not
// implement are rejected here, at compile time.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "tokenizer/jinja/token_stream.h"

namespace specula::jinja {

class ExpressionParser : protected TokenStream {
 public:
  using TokenStream::TokenStream;

 protected:
  bool is_tuple_end(std::initializer_list<const char*> extra) const;
  // A comma-separated list becomes a Tuple (jinja2's parse_tuple); `no_condexpr` stops at `if`.
  ExprPtr parse_tuple(bool no_condexpr, std::initializer_list<const char*> extra_end,
                      bool explicit_parens = false);
  ExprPtr parse_expression();  // with inline `a if b else c`
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b, int line);
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_postfix(ExprPtr n);
  ExprPtr parse_filter_expr(ExprPtr n);
  ExprPtr parse_subscript(ExprPtr obj);
  ExprPtr parse_subscribed();
  void parse_call_args(Expr& n);
  ExprPtr parse_call(ExprPtr callee);
  ExprPtr parse_filter_call(ExprPtr operand);
  ExprPtr parse_test(ExprPtr operand);
};

}  // namespace specula::jinja
