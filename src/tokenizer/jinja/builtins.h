// The filters, tests, globals and methods the interpreter provides, as jinja2 and transformers
// define them. The parser consults the name lists to reject unknown ones at compile time.
#pragma once

#include <functional>
#include <optional>
#include <string_view>

#include "tokenizer/jinja/value.h"

namespace specula::jinja {

// What builtins need from the interpreter: jinja2's getattr/getitem rules (map(attribute=...),
// selectattr), and filters/tests by name (map('upper'), select('defined')).
class Env {
 public:
  virtual ~Env() = default;
  virtual Value getattr(const Value& obj, std::string_view name) = 0;
  virtual Value getitem(const Value& obj, const Value& key) = 0;
  virtual Value call_filter(std::string_view name, const Value& v, const CallArgs& args,
                            int line) = 0;
  virtual bool call_test(std::string_view name, const Value& v, const CallArgs& args, int line) = 0;
};

bool is_filter(std::string_view name);
bool is_test(std::string_view name);
// Any method name of str, dict or list the interpreter implements (or knows to be unsafe).
bool is_method_name(std::string_view name);

Value apply_filter(Env& env, std::string_view name, const Value& v, const CallArgs& args);
bool apply_test(Env& env, std::string_view name, const Value& v, const CallArgs& args);
// The bound method `obj.name`, or an Undefined when `obj` has no such method.
Value get_method(const Value& obj, std::string_view name);

// Python-semantics helpers shared by the interpreter and the builtins.
size_t py_len(const Value& v);               // len(); an error for values without one
std::vector<Value> iterate(const Value& v);  // iter(): list items, dict keys, str chars
Value py_getitem(const Value& obj, const Value& key, bool* found);  // obj[key] without fallbacks
bool contains(const Value& container, const Value& item);           // `item in container`
Value binary_op(std::string_view op, const Value& a, const Value& b);
std::string py_format(const std::string& fmt, const Value& args);  // str % args (%s %d %r %%)

// Argument binding for builtins: binds positional then keyword args to `names`; missing ones are
// nullopt; unknown or surplus arguments are an error naming `fn`.
std::vector<std::optional<Value>> bind_args(std::string_view fn, const CallArgs& args,
                                            std::initializer_list<std::string_view> names);

}  // namespace specula::jinja
