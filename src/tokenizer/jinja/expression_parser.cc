#include "tokenizer/jinja/expression_parser.h"

#include "tokenizer/jinja/builtins.h"

namespace specula::jinja {

bool ExpressionParser::is_tuple_end(std::initializer_list<const char*> extra) const {
  if (cur().type == TokenType::VarEnd || cur().type == TokenType::BlockEnd || is_op(")"))
    return true;
  for (const char* e : extra)
    if (is_name(e)) return true;
  return false;
}

ExprPtr ExpressionParser::parse_tuple(bool no_condexpr,
                                      std::initializer_list<const char*> extra_end,
                                      bool explicit_parens) {
  int line = cur().line;
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  while (true) {
    if (!items.empty()) expect_op(",");
    if (is_tuple_end(extra_end)) break;
    items.push_back(no_condexpr ? parse_or() : parse_expression());
    if (is_op(","))
      is_tuple = true;
    else
      break;
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items[0]);
    if (!explicit_parens) fail("expected an expression, got " + describe(cur()), cur().line);
  }
  auto t = node(Expr::Kind::Tuple, line);
  t->args = std::move(items);
  return t;
}

ExprPtr ExpressionParser::parse_expression() {
  Nesting nesting(*this);
  int line = cur().line;
  ExprPtr e = parse_or();
  while (skip_name("if")) {
    nesting.deepen();
    auto c = node(Expr::Kind::Cond, line);
    c->b = parse_or();
    if (skip_name("else")) c->c = parse_expression();
    c->a = std::move(e);
    e = std::move(c);
    line = cur().line;
  }
  return e;
}

ExprPtr ExpressionParser::parse_or() {
  Nesting nesting(*this, 0);
  ExprPtr left = parse_and();
  while (is_name("or")) {
    nesting.deepen();
    auto n = node(Expr::Kind::Or, advance().line);
    n->a = std::move(left);
    n->b = parse_and();
    left = std::move(n);
  }
  return left;
}

ExprPtr ExpressionParser::parse_and() {
  Nesting nesting(*this, 0);
  ExprPtr left = parse_not();
  while (is_name("and")) {
    nesting.deepen();
    auto n = node(Expr::Kind::And, advance().line);
    n->a = std::move(left);
    n->b = parse_not();
    left = std::move(n);
  }
  return left;
}

ExprPtr ExpressionParser::parse_not() {
  if (is_name("not")) {
    Nesting nesting(*this);
    auto n = node(Expr::Kind::Not, advance().line);
    n->a = parse_not();
    return n;
  }
  return parse_compare();
}

ExprPtr ExpressionParser::parse_compare() {
  int line = cur().line;
  ExprPtr first = parse_math1();
  std::vector<std::string> ops;
  std::vector<ExprPtr> operands;
  while (true) {
    if (cur().type == TokenType::Operator &&
        (cur().value == "==" || cur().value == "!=" || cur().value == "<" || cur().value == "<=" ||
         cur().value == ">" || cur().value == ">=")) {
      ops.push_back(advance().value);
    } else if (is_name("in")) {
      advance();
      ops.push_back("in");
    } else if (is_name("not") && look().type == TokenType::Name && look().value == "in") {
      advance();
      advance();
      ops.push_back("notin");
    } else {
      break;
    }
    operands.push_back(parse_math1());
  }
  if (ops.empty()) return first;
  auto n = node(Expr::Kind::Compare, line);
  n->args.push_back(std::move(first));
  for (auto& o : operands) n->args.push_back(std::move(o));
  n->ops = std::move(ops);
  return n;
}

ExprPtr ExpressionParser::binary(const std::string& op, ExprPtr a, ExprPtr b, int line) {
  auto n = node(Expr::Kind::Binary, line);
  n->name = op;
  n->a = std::move(a);
  n->b = std::move(b);
  return n;
}

ExprPtr ExpressionParser::parse_math1() {
  Nesting nesting(*this, 0);
  ExprPtr left = parse_concat();
  while (is_op("+") || is_op("-")) {
    nesting.deepen();
    const Token& t = advance();
    left = binary(t.value, std::move(left), parse_concat(), t.line);
  }
  return left;
}

ExprPtr ExpressionParser::parse_concat() {
  int line = cur().line;
  ExprPtr first = parse_math2();
  if (!is_op("~")) return first;
  auto n = node(Expr::Kind::Concat, line);
  n->args.push_back(std::move(first));
  while (skip_op("~")) n->args.push_back(parse_math2());
  return n;
}

ExprPtr ExpressionParser::parse_math2() {
  Nesting nesting(*this, 0);
  ExprPtr left = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    nesting.deepen();
    const Token& t = advance();
    left = binary(t.value, std::move(left), parse_pow(), t.line);
  }
  return left;
}

ExprPtr ExpressionParser::parse_pow() {
  Nesting nesting(*this, 0);
  ExprPtr left = parse_unary(true);
  while (is_op("**")) {
    nesting.deepen();
    const Token& t = advance();
    left = binary("**", std::move(left), parse_unary(true), t.line);
  }
  return left;
}

ExprPtr ExpressionParser::parse_unary(bool with_filter) {
  Nesting nesting(*this);
  ExprPtr n;
  if (is_op("-") || is_op("+")) {
    const Token& t = advance();
    n = node(t.value == "-" ? Expr::Kind::Neg : Expr::Kind::Pos, t.line);
    n->a = parse_unary(false);
  } else {
    n = parse_primary();
  }
  n = parse_postfix(std::move(n));
  if (with_filter) n = parse_filter_expr(std::move(n));
  return n;
}

ExprPtr ExpressionParser::parse_primary() {
  const Token& t = cur();
  if (t.type == TokenType::Name) {
    advance();
    auto n = node(Expr::Kind::Literal, t.line);
    if (t.value == "true" || t.value == "True")
      n->literal = Value(true);
    else if (t.value == "false" || t.value == "False")
      n->literal = Value(false);
    else if (t.value == "none" || t.value == "None")
      n->literal = Value::none();
    else {
      n->kind = Expr::Kind::Name;
      n->name = t.value;
    }
    return n;
  }
  if (t.type == TokenType::String) {
    auto n = node(Expr::Kind::Literal, t.line);
    std::string s;
    while (cur().type == TokenType::String) s += advance().value;  // adjacent literals join
    n->literal = Value(std::move(s));
    return n;
  }
  if (t.type == TokenType::Integer || t.type == TokenType::Float) {
    auto n = node(Expr::Kind::Literal, t.line);
    n->literal = t.type == TokenType::Integer ? Value(t.int_value) : Value(t.float_value);
    advance();
    return n;
  }
  if (is_op("(")) {
    advance();
    ExprPtr inner = parse_tuple(false, {}, true);
    expect_op(")");
    return inner;
  }
  if (is_op("[")) {
    auto n = node(Expr::Kind::List, advance().line);
    while (!is_op("]")) {
      if (!n->args.empty()) expect_op(",");
      if (is_op("]")) break;
      n->args.push_back(parse_expression());
    }
    expect_op("]");
    return n;
  }
  if (is_op("{")) {
    auto n = node(Expr::Kind::Dict, advance().line);
    while (!is_op("}")) {
      if (!n->args.empty()) expect_op(",");
      if (is_op("}")) break;
      n->args.push_back(parse_expression());
      expect_op(":");
      n->args.push_back(parse_expression());
    }
    expect_op("}");
    return n;
  }
  fail("unexpected " + describe(t), t.line);
}

ExprPtr ExpressionParser::parse_postfix(ExprPtr n) {
  Nesting nesting(*this, 0);
  while (true) {
    if (is_op(".") || is_op("[")) {
      nesting.deepen();
      n = parse_subscript(std::move(n));
    } else if (is_op("(")) {
      nesting.deepen();
      n = parse_call(std::move(n));
    } else {
      return n;
    }
  }
}

ExprPtr ExpressionParser::parse_filter_expr(ExprPtr n) {
  Nesting nesting(*this, 0);
  while (true) {
    if (is_op("|")) {
      nesting.deepen();
      advance();
      n = parse_filter_call(std::move(n));
    } else if (is_name("is")) {
      nesting.deepen();
      n = parse_test(std::move(n));
    } else if (is_op("(")) {
      nesting.deepen();
      n = parse_call(std::move(n));
    } else {
      return n;
    }
  }
}

ExprPtr ExpressionParser::parse_subscript(ExprPtr obj) {
  const Token& t = advance();
  if (t.value == ".") {
    const Token& attr = cur();
    if (attr.type == TokenType::Name) {
      advance();
      auto n = node(Expr::Kind::GetAttr, t.line);
      n->a = std::move(obj);
      n->name = attr.value;
      return n;
    }
    if (attr.type != TokenType::Integer) fail("expected name or number", attr.line);
    advance();
    auto n = node(Expr::Kind::GetItem, t.line);
    n->a = std::move(obj);
    n->b = node(Expr::Kind::Literal, attr.line);
    n->b->literal = Value(attr.int_value);
    return n;
  }
  // `[`: one subscript (an index or a slice), or several forming a tuple key.
  std::vector<ExprPtr> subs;
  while (!is_op("]")) {
    if (!subs.empty()) expect_op(",");
    subs.push_back(parse_subscribed());
  }
  expect_op("]");
  if (subs.empty()) fail("expected subscript expression", t.line);
  if (subs.size() == 1 && subs[0]->kind == Expr::Kind::Slice) {
    subs[0]->a = std::move(obj);
    return std::move(subs[0]);
  }
  auto n = node(Expr::Kind::GetItem, t.line);
  n->a = std::move(obj);
  if (subs.size() == 1) {
    n->b = std::move(subs[0]);
  } else {
    for (auto& s : subs)
      if (s->kind == Expr::Kind::Slice) unsupported("multi-dimensional slice", t.line);
    n->b = node(Expr::Kind::Tuple, t.line);
    n->b->args = std::move(subs);
  }
  return n;
}

// An index expression or a slice `start:stop:step` (each part optional). A slice comes back as
// a Slice node whose operand `a` the caller fills in.

ExprPtr ExpressionParser::parse_subscribed() {
  int line = cur().line;
  ExprPtr start;
  if (!is_op(":")) {
    start = parse_expression();
    if (!is_op(":")) return start;
  }
  advance();  // ':'
  auto n = node(Expr::Kind::Slice, line);
  n->b = std::move(start);
  if (!is_op(":") && !is_op("]") && !is_op(",")) n->c = parse_expression();
  if (skip_op(":")) {
    if (!is_op("]") && !is_op(",")) n->d = parse_expression();
  }
  return n;
}

void ExpressionParser::parse_call_args(Expr& n) {
  expect_op("(");
  bool need_comma = false;
  while (!is_op(")")) {
    if (need_comma) {
      expect_op(",");
      if (is_op(")")) break;
    }
    if (is_op("*") || is_op("**")) unsupported("'*args' / '**kwargs' in a call", cur().line);
    if (cur().type == TokenType::Name && look().type == TokenType::Operator &&
        look().value == "=") {
      std::string key = advance().value;
      advance();
      n.kwargs.emplace_back(std::move(key), parse_expression());
    } else {
      if (!n.kwargs.empty()) fail("positional argument follows keyword argument", cur().line);
      n.args.push_back(parse_expression());
    }
    need_comma = true;
  }
  expect_op(")");
}

ExprPtr ExpressionParser::parse_call(ExprPtr callee) {
  auto n = node(Expr::Kind::Call, cur().line);
  // A method call on a value must be one the interpreter implements; reject others now rather
  // than mid-render. (Free function names resolve at run time, as jinja2 does.)
  if (callee->kind == Expr::Kind::GetAttr && !is_method_name(callee->name))
    unsupported(fmt::format("method '{}'", callee->name), n->line);
  n->a = std::move(callee);
  parse_call_args(*n);
  return n;
}

ExprPtr ExpressionParser::parse_filter_call(ExprPtr operand) {
  int line = cur().line;
  std::string name = expect_name();
  while (skip_op(".")) name += "." + expect_name();
  if (!is_filter(name)) unsupported(fmt::format("filter '{}'", name), line);
  auto n = node(Expr::Kind::Filter, line);
  n->name = name;
  n->a = std::move(operand);
  if (is_op("(")) parse_call_args(*n);
  return n;
}

ExprPtr ExpressionParser::parse_test(ExprPtr operand) {
  int line = advance().line;  // 'is'
  bool negated = skip_name("not");
  std::string name = expect_name();
  while (skip_op(".")) name += "." + expect_name();
  if (!is_test(name)) unsupported(fmt::format("test '{}'", name), line);
  auto n = node(Expr::Kind::Test, line);
  n->name = name;
  n->negated = negated;
  n->a = std::move(operand);
  if (is_op("(")) {
    parse_call_args(*n);
  } else if ((cur().type == TokenType::Name || cur().type == TokenType::String ||
              cur().type == TokenType::Integer || cur().type == TokenType::Float || is_op("[") ||
              is_op("{")) &&
             !is_name("else") && !is_name("or") && !is_name("and")) {
    // jinja2 takes one argument without parentheses: `x is divisibleby 3`.
    if (is_name("is")) fail("you cannot chain multiple tests with 'is'", cur().line);
    n->args.push_back(parse_postfix(parse_primary()));
  }
  return n;
}

}  // namespace specula::jinja
