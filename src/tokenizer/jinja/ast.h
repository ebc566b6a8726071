// The syntax tree the parser builds and the interpreter walks. One node struct per family keeps
// the tree easy to print and walk; each kind documents which fields it uses.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace specula::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Expr {
  enum class Kind {
    Literal,  // literal
    Name,     // name
    GetAttr,  // a.name
    GetItem,  // a[b]
    Slice,    // a[b:c:d], each of b/c/d may be null
    Call,     // a(args..., kwargs...)
    Filter,   // a | name(args..., kwargs...); a is null inside {% filter %} / {% set x | f %}
    Test,     // a is [not] name(args..., kwargs...)
    Not,      // not a
    Neg,      // -a
    Pos,      // +a
    Binary,   // a <name> b, name in + - * / // % **
    And,      // a and b
    Or,       // a or b
    Concat,   // args[0] ~ args[1] ~ ...
    Compare,  // args[0] ops[0] args[1] ops[1] args[2] ...  (ops: == != < <= > >= in notin)
    Cond,     // a if b else c (c may be null)
    List,     // [args...]
    Tuple,    // (args...)
    Dict,     // {args[0]: args[1], args[2]: args[3], ...}
  };
  Kind kind;
  int line = 0;
  Value literal;
  std::string name;
  ExprPtr a, b, c, d;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
};

struct Stmt {
  enum class Kind {
    Text,         // text
    Output,       // {{ expr }}, or {% print values... %}
    If,           // branches (cond, body)..., else_body
    For,          // for targets in expr [if cond]: body, else_body
    Set,          // set targets = expr, or set ns_name.ns_attr = expr
    SetBlock,     // set targets[0] [| filters]: body (rendered, then filtered)
    Macro,        // macro name(params = defaults): body
    With,         // with targets = values: body
    FilterBlock,  // filter filters: body
    Scope,        // a body rendered in its own scope (transformers' {% generation %})
    Break,
    Continue,
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<std::string> targets;
  bool unpack = false;  // targets came from a tuple (`for k, v in ...`, `set a, b = ...`)
  std::string ns_name, ns_attr;
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // one per param; null where the param has no default
  std::vector<ExprPtr> values;    // With, print
  std::vector<ExprPtr> filters;   // SetBlock / FilterBlock: Filter nodes with a null operand
};

}  // namespace specula::jinja
