#include "tokenizer/jinja/parser.h"

#include <initializer_list>

#include "core/error.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/expression_parser.h"
#include "tokenizer/jinja/lexer.h"

namespace specula::jinja {
namespace {

// Statements ({% if %}, {% for %}, {% set %}, {% macro %}, ...) and the template data between them.
class Parser : private ExpressionParser {
 public:
  explicit Parser(std::vector<Token> tokens) : ExpressionParser(std::move(tokens)) {}

  Body parse() {
    Body body = subparse({});
    if (cur().type != TokenType::Eof) fail_tag(cur().value, cur().line);
    return body;
  }

 private:
  [[noreturn]] void fail_tag(const std::string& name, int line) const {
    static const char* kJinjaTags[] = {"block", "extends", "include",    "import",
                                       "from",  "call",    "autoescape", "do"};
    for (const char* t : kJinjaTags)
      if (name == t) unsupported(fmt::format("tag '{}'", name), line);
    if (name.rfind("end", 0) == 0 || name == "else" || name == "elif")
      fail(fmt::format("unexpected tag '{}'", name), line);
    unsupported(fmt::format("tag '{}'", name), line);
  }  // ---- statements ----
  // Parses template data, output and statements until a `{% name %}` with name in `end_tags`; the
  // stream is then at that name (after its `{%`).
  Body subparse(std::initializer_list<const char*> end_tags) {
    Nesting nesting(*this);
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
      fail(
          fmt::format("unexpected end of template, expected {} to close the '{}' opened at line {}",
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
    if (cur().type == TokenType::Name && look().type == TokenType::Operator &&
        look().value == ".") {
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

  int loop_depth_ = 0;
  std::vector<std::pair<std::string, int>> open_tags_;
};

}  // namespace

Body parse_template(const std::string& source) { return Parser(tokenize(source)).parse(); }

}  // namespace specula::jinja
