// jinja2's builtin tests (`x is defined`, `x is string`, ...) with Python's type rules: a bool is
// a number and an integer-like value, a dict is a sequence, Undefined is iterable.
#include <algorithm>
#include <array>

#include "core/error.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/pystr.h"

namespace specula::jinja {
namespace {

constexpr std::array kTests = {
    "odd",     "even",   "divisibleby", "defined",  "undefined", "filter", "test",    "none",
    "boolean", "false",  "true",        "integer",  "float",     "lower",  "upper",   "string",
    "mapping", "number", "sequence",    "iterable", "callable",  "sameas", "escaped", "in",
    "==",      "eq",     "equalto",     "!=",       "ne",        ">",      "gt",      "greaterthan",
    "ge",      ">=",     "<",           "lt",       "lessthan",  "<=",     "le"};

const Value& one_arg(std::string_view test, const CallArgs& args,
                     const std::vector<std::optional<Value>>& a) {
  if (!a[0]) throw Error(fmt::format("test '{}' takes one argument", test));
  (void)args;
  return *a[0];
}

int64_t as_int_for(std::string_view test, const Value& v) {
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_int() && !v.is_bool())
    throw Error(fmt::format("test '{}' needs an integer, got {}", test, type_name(v)));
  return v.to_int();
}

}  // namespace

bool is_test(std::string_view name) {
  return std::find(kTests.begin(), kTests.end(), name) != kTests.end();
}

bool apply_test(Env& env, std::string_view name, const Value& v, const CallArgs& args) {
  (void)env;
  if (name == "defined" || name == "undefined" || name == "none" || name == "boolean" ||
      name == "false" || name == "true" || name == "integer" || name == "float" ||
      name == "string" || name == "mapping" || name == "number" || name == "sequence" ||
      name == "iterable" || name == "callable" || name == "escaped" || name == "lower" ||
      name == "upper" || name == "odd" || name == "even" || name == "filter" || name == "test") {
    bind_args(name, args, {});
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "boolean") return v.is_bool();
    if (name == "false") return v.is_bool() && !v.as_bool();
    if (name == "true") return v.is_bool() && v.as_bool();
    if (name == "integer") return v.is_int();
    if (name == "float") return v.is_float();
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.is_dict();
    if (name == "number") return v.is_number();
    if (name == "sequence")  // has len() and __getitem__
      return v.is_undefined() || v.is_string() || v.is_dict() || (v.is_seq() && !v.is_generator());
    if (name == "iterable") return v.is_undefined() || v.is_string() || v.is_dict() || v.is_seq();
    if (name == "callable") return v.is_callable();
    if (name == "escaped") return false;
    if (name == "filter") return v.is_string() && is_filter(v.str());
    if (name == "test") return v.is_string() && is_test(v.str());
    if (name == "lower") return pystr::is_lower(to_str(v));
    if (name == "upper") return pystr::is_upper(to_str(v));
    // value % 2 == 1 (or == 0), as jinja2 computes it: floats are fine, strings are an error.
    Value rem = binary_op("%", v, Value(2));
    return equal(rem, Value(name == "odd" ? 1 : 0));
  }
  auto a = bind_args(name, args, {"other"});
  const Value& other = one_arg(name, args, a);
  if (name == "divisibleby") {
    int64_t d = as_int_for(name, other);
    if (d == 0) throw Error("integer modulo by zero");
    return as_int_for(name, v) % d == 0;
  }
  if (name == "sameas") return v.same_object(other);
  if (name == "in") return contains(other, v);
  if (name == "==" || name == "eq" || name == "equalto") return equal(v, other);
  if (name == "!=" || name == "ne") return !equal(v, other);
  if (name == ">" || name == "gt" || name == "greaterthan") return less(other, v);
  if (name == ">=" || name == "ge") return !less(v, other);
  if (name == "<" || name == "lt" || name == "lessthan") return less(v, other);
  if (name == "<=" || name == "le") return !less(other, v);
  throw Error(fmt::format("no test named '{}'", name));
}

}  // namespace specula::jinja
