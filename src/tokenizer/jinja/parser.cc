#include "tokenizer/jinja/parser.h"

#include <initializer_list>

#include "core/error.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/lexer.h"

namespace specula::jinja {
namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Body parse() {
    Body body = subparse({});
    if (cur().type != TokenType::Eof) fail_tag(cur().value, cur().line);
    return body;
  }

 private:
  // ---- token stream ----
  const Token& cur() const { return toks_[pos_]; }
  const Token& look() const { return toks_[std::min(pos_ + 1, toks_.size() - 1)]; }
  const Token& advance() { return toks_[pos_ < toks_.size() - 1 ? pos_++ : pos_]; }
  bool is_op(const char* op) const { return cur().type == TokenType::Operator && cur().value == op; }
  bool is_name(const char* n) const { return cur().type == TokenType::Name && cur().value == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    advance();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::Data: return "template data";
      case TokenType::BlockBegin: return "'{%'";
      case TokenType::BlockEnd: return "end of statement block";
      case TokenType::VarBegin: return "'{{'";
      case TokenType::VarEnd: return "end of print statement";
      case TokenType::Eof: return "end of template";
      case TokenType::String: return "string";
      case TokenType::Integer:
      case TokenType::Float: return "number";
      default: return "'" + t.value + "'";
    }
  }

  [[noreturn]] void fail(const std::string& what, int line) const {
    throw Error(fmt::format("chat template syntax error at line {}: {}", line, what));
  }
  [[noreturn]] void unsupported(const std::string& what, int line) const {
    throw Error(fmt::format("unsupported {} at line {}", what, line));
  }
  [[noreturn]] void fail_tag(const std::string& name, int line) const {
    static const char* kJinjaTags[] = {"block", "extends", "include", "import", "from", "call",
                                       "autoescape", "do"};
    for (const char* t : kJinjaTags)
      if (name == t) unsupported(fmt::format("tag '{}'", name), line);
    if (name.rfind("end", 0) == 0 || name == "else" || name == "elif")
      fail(fmt::format("unexpected tag '{}'", name), line);
    unsupported(fmt::format("tag '{}'", name), line);
  }

  void expect_op(const char* op) {
    if (!skip_op(op)) fail(fmt::format("expected '{}', got {}", op, describe(cur())), cur().line);
  }
  std::string expect_name() {
    if (cur().type != TokenType::Name) fail("expected a name, got " + describe(cur()), cur().line);
    return advance().value;
  }
  void expect_block_end() {
    if (cur().type != TokenType::BlockEnd)
      fail("expected end of statement block, got " + describe(cur()), cur().line);
    advance();
  }

  ExprPtr node(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // ---- statements ----
  // Parses template data, output and statements until a `{% name %}` with name in `end_tags`; the
  // stream is then at that name (after its `{%`).
  Body subparse(std::initializer_list<const char*> end_tags) {
    Body body;
    while (cur().type != TokenType::Eof) {
      const Token& t = cur();
      if (t.type == TokenType::Data) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Text;
        s->line = t.line;
        s->text = t.value;
        body.push_back(std::move(s));
        advance();
      } else if (t.type == TokenType::VarBegin) {
        advance();
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Output;
        s->line = t.line;
        s->expr = parse_tuple(false, {});
        if (cur().type != TokenType::VarEnd)
          fail("expected end of print statement, got " + describe(cur()), cur().line);
        advance();
        body.push_back(std::move(s));
      } else if (t.type == TokenType::BlockBegin) {
        advance();
        for (const char* end : end_tags)
          if (is_name(end)) return body;
        body.push_back(parse_statement());
      } else {
        fail("unexpected " + describe(t), t.line);
      }
    }
    if (end_tags.size() > 0) {
      std::string want;
      for (const char* e : end_tags) want += (want.empty() ? "'" : " or '") + std::string(e) + "'";
      fail(fmt::format("unexpected end of template, expected {} to close the '{}' opened at line {}",
                       want, open_tags_.back().first, open_tags_.back().second),
           cur().line);
    }
    return body;
  }

  // Parses a body ending at one of `end_tags` after the current statement's `%}`.
  Body parse_body(std::initializer_list<const char*> end_tags) {
    expect_block_end();
    return subparse(end_tags);
  }
  void end_tag(const char* name) {  // consumes `name %}` after subparse stopped at it
    advance();
    (void)name;
    expect_block_end();
  }

  StmtPtr parse_statement() {
    const Token& t = cur();
    if (t.type != TokenType::Name) fail("tag name expected", t.line);
    std::string tag = t.value;
    int line = t.line;
    auto s = std::make_unique<Stmt>();
    s->line = line;
    open_tags_.emplace_back(tag, line);
    advance();
    if (tag == "if") {
      parse_if(*s);
    } else if (tag == "for") {
      parse_for(*s);
    } else if (tag == "set") {
      parse_set(*s);
    } else if (tag == "macro") {
      parse_macro(*s);
    } else if (tag == "with") {
      parse_with(*s);
    } else if (tag == "filter") {
      s->kind = Stmt::Kind::FilterBlock;
      s->filters = parse_filter_chain(true);
      s->body = parse_body({"endfilter"});
      end_tag("endfilter");
    } else if (tag == "generation") {  // transformers' AssistantTracker: renders its body
      s->kind = Stmt::Kind::Scope;
      s->body = parse_body({"endgeneration"});
      end_tag("endgeneration");
    } else if (tag == "print") {  // {% print a, b %} prints each expression in turn
      s->kind = Stmt::Kind::Output;
      while (cur().type != TokenType::BlockEnd) {
        if (!s->values.empty()) expect_op(",");
        s->values.push_back(parse_expression());
      }
      expect_block_end();
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail(fmt::format("'{}' outside of a loop", tag), line);
      s->kind = tag == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue;
      expect_block_end();
    } else {
      open_tags_.pop_back();
      fail_tag(tag, line);
    }
    open_tags_.pop_back();
    return s;
  }

  void parse_if(Stmt& s) {
    s.kind = Stmt::Kind::If;
    while (true) {
      ExprPtr cond = parse_tuple(true, {});
      Body body = parse_body({"elif", "else", "endif"});
      s.branches.emplace_back(std::move(cond), std::move(body));
      std::string which = advance().value;
      if (which == "elif") continue;
      if (which == "else") {
        s.else_body = parse_body({"endif"});
        end_tag("endif");
      } else {
        expect_block_end();
      }
      break;
    }
  }

  void parse_for(Stmt& s) {
    s.kind = Stmt::Kind::For;
    parse_targets(s, {"in"});
    if (!skip_name("in")) fail("expected 'in', got " + describe(cur()), cur().line);
    s.expr = parse_tuple(true, {"recursive"});
    if (skip_name("if")) s.cond = parse_expression();
    if (is_name("recursive")) unsupported("recursive for loop", cur().line);
    ++loop_depth_;
    s.body = parse_body({"endfor", "else"});
    --loop_depth_;
    if (advance().value == "else") {
      int saved = loop_depth_;
      loop_depth_ = 0;  // `break` in a for's else block is outside the loop
      s.else_body = parse_body({"endfor"});
      loop_depth_ = saved;
      end_tag("endfor");
    } else {
      expect_block_end();
    }
  }

  // Assignment targets: a name or names separated by commas (optionally parenthesised).
  void parse_targets(Stmt& s, std::initializer_list<const char*> end_names) {
    bool paren = skip_op("(");
    while (true) {
      s.targets.push_back(expect_name());
      if (!skip_op(",")) break;
      s.unpack = true;
      bool at_end = cur().type == TokenType::BlockEnd || is_op("=") || is_op(")");
      for (const char* e : end_names) at_end = at_end || is_name(e);
      if (at_end) break;
    }
    if (paren) {
      expect_op(")");
      s.unpack = true;
    }
  }

  void parse_set(Stmt& s) {
    if (cur().type == TokenType::Name && look().type == TokenType::Operator && look().value == ".") {
      s.kind = Stmt::Kind::Set;
      s.ns_name = advance().value;
      advance();
      s.ns_attr = expect_name();
      expect_op("=");
      s.expr = parse_tuple(false, {});
      expect_block_end();
      return;
    }
    parse_targets(s, {});
    if (skip_op("=")) {
      s.kind = Stmt::Kind::Set;
      s.expr = parse_tuple(false, {});
      expect_block_end();
      return;
    }
    if (s.unpack) fail("a {% set %} block needs a single name", s.line);
    s.kind = Stmt::Kind::SetBlock;
    if (is_op("|")) s.filters = parse_filter_chain(false);
    s.body = parse_body({"endset"});
    end_tag("endset");
  }

  void parse_macro(Stmt& s) {
    s.kind = Stmt::Kind::Macro;
    s.name = expect_name();
    expect_op("(");
    bool any_default = false;
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      if (is_op(")")) break;
      s.params.push_back(expect_name());
      if (skip_op("=")) {
        s.defaults.push_back(parse_expression());
        any_default = true;
      } else {
        if (any_default) fail("non-default argument follows default argument", cur().line);
        s.defaults.push_back(nullptr);
      }
    }
    expect_op(")");
    int saved = loop_depth_;
    loop_depth_ = 0;
    s.body = parse_body({"endmacro"});
    loop_depth_ = saved;
    end_tag("endmacro");
  }

  void parse_with(Stmt& s) {
    s.kind = Stmt::Kind::With;
    while (cur().type != TokenType::BlockEnd) {
      if (!s.targets.empty()) expect_op(",");
      s.targets.push_back(expect_name());
      expect_op("=");
      s.values.push_back(parse_expression());
    }
    s.body = parse_body({"endwith"});
    end_tag("endwith");
  }

  // `| f(args) | g` (or `f(args) | g` when `inline_first`): Filter nodes with no operand.
  std::vector<ExprPtr> parse_filter_chain(bool inline_first) {
    std::vector<ExprPtr> out;
    bool first = inline_first;
    while (first || is_op("|")) {
      if (!first) advance();
      first = false;
      out.push_back(parse_filter_call(nullptr));
    }
    return out;
  }

  // ---- expressions (jinja2's precedence, loosest first) ----
  bool is_tuple_end(std::initializer_list<const char*> extra) const {
    if (cur().type == TokenType::VarEnd || cur().type == TokenType::BlockEnd || is_op(")"))
      return true;
    for (const char* e : extra)
      if (is_name(e)) return true;
    return false;
  }

  ExprPtr parse_tuple(bool no_condexpr, std::initializer_list<const char*> extra_end,
                      bool explicit_parens = false) {
    int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(no_condexpr ? parse_or() : parse_expression());
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail("expected an expression, got " + describe(cur()), cur().line);
    }
    auto t = node(Expr::Kind::Tuple, line);
    t->args = std::move(items);
    return t;
  }

  ExprPtr parse_expression() {
    int line = cur().line;
    ExprPtr e = parse_or();
    while (skip_name("if")) {
      auto c = node(Expr::Kind::Cond, line);
      c->b = parse_or();
      if (skip_name("else")) c->c = parse_expression();
      c->a = std::move(e);
      e = std::move(c);
      line = cur().line;
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      auto n = node(Expr::Kind::Or, advance().line);
      n->a = std::move(left);
      n->b = parse_and();
      left = std::move(n);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      auto n = node(Expr::Kind::And, advance().line);
      n->a = std::move(left);
      n->b = parse_not();
      left = std::move(n);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      auto n = node(Expr::Kind::Not, advance().line);
      n->a = parse_not();
      return n;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr first = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> operands;
    while (true) {
      if (cur().type == TokenType::Operator &&
          (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
           cur().value == "<=" || cur().value == ">" || cur().value == ">=")) {
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

  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b, int line) {
    auto n = node(Expr::Kind::Binary, line);
    n->name = op;
    n->a = std::move(a);
    n->b = std::move(b);
    return n;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = advance();
      left = binary(t.value, std::move(left), parse_concat(), t.line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    int line = cur().line;
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    auto n = node(Expr::Kind::Concat, line);
    n->args.push_back(std::move(first));
    while (skip_op("~")) n->args.push_back(parse_math2());
    return n;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = advance();
      left = binary(t.value, std::move(left), parse_pow(), t.line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const Token& t = advance();
      left = binary("**", std::move(left), parse_unary(true), t.line);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
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

  ExprPtr parse_primary() {
    const Token& t = cur();
    if (t.type == TokenType::Name) {
      advance();
      auto n = node(Expr::Kind::Literal, t.line);
      if (t.value == "true" || t.value == "True") n->literal = Value(true);
      else if (t.value == "false" || t.value == "False") n->literal = Value(false);
      else if (t.value == "none" || t.value == "None") n->literal = Value::none();
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

  ExprPtr parse_postfix(ExprPtr n) {
    while (true) {
      if (is_op(".") || is_op("[")) n = parse_subscript(std::move(n));
      else if (is_op("(")) n = parse_call(std::move(n));
      else return n;
    }
  }

  ExprPtr parse_filter_expr(ExprPtr n) {
    while (true) {
      if (is_op("|")) {
        advance();
        n = parse_filter_call(std::move(n));
      } else if (is_name("is")) {
        n = parse_test(std::move(n));
      } else if (is_op("(")) {
        n = parse_call(std::move(n));
      } else {
        return n;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
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
  ExprPtr parse_subscribed() {
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

  void parse_call_args(Expr& n) {
    expect_op("(");
    bool need_comma = false;
    while (!is_op(")")) {
      if (need_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**")) unsupported("'*args' / '**kwargs' in a call", cur().line);
      if (cur().type == TokenType::Name && look().type == TokenType::Operator && look().value == "=") {
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

  ExprPtr parse_call(ExprPtr callee) {
    auto n = node(Expr::Kind::Call, cur().line);
    // A method call on a value must be one the interpreter implements; reject others now rather
    // than mid-render. (Free function names resolve at run time, as jinja2 does.)
    if (callee->kind == Expr::Kind::GetAttr && !is_method_name(callee->name))
      unsupported(fmt::format("method '{}'", callee->name), n->line);
    n->a = std::move(callee);
    parse_call_args(*n);
    return n;
  }

  ExprPtr parse_filter_call(ExprPtr operand) {
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

  ExprPtr parse_test(ExprPtr operand) {
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

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
  std::vector<std::pair<std::string, int>> open_tags_;
};

}  // namespace

Body parse_template(const std::string& source) { return Parser(tokenize(source)).parse(); }

}  // namespace specula::jinja
