// The token cursor shared by the statement and expression parsers, with jinja2-style messages.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/lexer.h"

namespace specula::jinja {

class TokenStream {
 public:
  explicit TokenStream(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

 protected:
  // Expressions and blocks nest at most this deep (brackets, chained operators, filters and
  // subscripts, tags inside tags): parsing, rendering and freeing the tree each recurse once per
  // level on the caller's stack, which no template may exhaust.
  static constexpr int kMaxNesting = 256;
  // Adds levels for as long as it lives: one at construction when `levels` is 1, one per deepen().
  class Nesting {
   public:
    explicit Nesting(TokenStream& s, int levels = 1) : s_(s) {
      for (int i = 0; i < levels; ++i) deepen();
    }
    ~Nesting() { s_.nesting_ -= added_; }
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;
    void deepen() {
      ++added_;
      if (++s_.nesting_ > kMaxNesting)
        s_.fail(fmt::format("expressions and blocks nest deeper than {} levels", kMaxNesting), s_.cur().line);
    }

   private:
    TokenStream& s_;
    int added_ = 0;
  };

  const Token& cur() const { return toks_[pos_]; }
  const Token& look() const { return toks_[std::min(pos_ + 1, toks_.size() - 1)]; }
  const Token& advance() { return toks_[pos_ < toks_.size() - 1 ? pos_++ : pos_]; }
  bool is_op(const char* op) const {
    return cur().type == TokenType::Operator && cur().value == op;
  }
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
      case TokenType::Data:
        return "template data";
      case TokenType::BlockBegin:
        return "'{%'";
      case TokenType::BlockEnd:
        return "end of statement block";
      case TokenType::VarBegin:
        return "'{{'";
      case TokenType::VarEnd:
        return "end of print statement";
      case TokenType::Eof:
        return "end of template";
      case TokenType::String:
        return "string";
      case TokenType::Integer:
      case TokenType::Float:
        return "number";
      default:
        return "'" + t.value + "'";
    }
  }

  [[noreturn]] void fail(const std::string& what, int line) const {
    throw Error(fmt::format("chat template syntax error at line {}: {}", line, what));
  }
  [[noreturn]] void unsupported(const std::string& what, int line) const {
    throw Error(fmt::format("unsupported {} at line {}", what, line));
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

  int nesting_ = 0;  // levels open at the cursor (Nesting)
  std::vector<Token> toks_;
  size_t pos_ = 0;
};

}  // namespace specula::jinja
