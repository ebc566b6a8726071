// The values a chat template computes with, modelled on the Python objects jinja2 sees when
// transformers renders a template: None, bool, int, float, str, list/tuple, dict
// (insertion-ordered), jinja2's Undefined, namespace() objects, generators (what map/select/...
// return) and callables.
//
// Lists and dicts are immutable once built (the sandbox transformers uses forbids mutating them),
// so they are shared by pointer and copying a Value is cheap. A namespace is the one mutable
// object.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace specula::jinja {

class Value;

// jinja2's Undefined: prints as "", is falsy, iterates as empty; most other uses raise an error
// carrying `message` (e.g. "'dict object' has no attribute 'content'").
struct Undefined {
  std::string message;
};
struct None {};

enum class SeqKind { List, Tuple, Generator };
struct ListData {
  std::vector<Value> items;
  // Tuples print as (a, b) and compare unequal to lists; generators have no len(), are always
  // truthy and print as a generator object, as in Python.
  SeqKind kind = SeqKind::List;
};

struct DictData {
  std::vector<std::pair<std::string, Value>> entries;  // insertion order, as Python dicts keep it
  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);  // replaces an existing key in place
};

struct NamespaceData {
  DictData attrs;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct CallableData {
  std::string name;  // for messages: "str.strip", "range", a macro's name
  std::function<Value(const CallArgs&)> fn;
};

class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, Seq, Dict, Namespace, Callable };

  Value() : v_(Undefined{}) {}
  static Value undefined(std::string message) { return Value(Undefined{std::move(message)}); }
  static Value none() { return Value(None{}); }
  Value(bool b) : v_(b) {}
  Value(int64_t i) : v_(i) {}
  Value(int i) : v_(static_cast<int64_t>(i)) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  static Value list(std::vector<Value> items, SeqKind kind = SeqKind::List);
  static Value tuple(std::vector<Value> items) { return list(std::move(items), SeqKind::Tuple); }
  static Value dict(DictData data);
  static Value ns(DictData attrs);
  static Value callable(std::string name, std::function<Value(const CallArgs&)> fn);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::Undefined; }
  bool is_none() const { return kind() == Kind::None; }
  bool is_bool() const { return kind() == Kind::Bool; }
  bool is_int() const { return kind() == Kind::Int; }
  bool is_float() const { return kind() == Kind::Float; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // Python: bool is an int
  bool is_string() const { return kind() == Kind::String; }
  bool is_seq() const { return kind() == Kind::Seq; }
  bool is_dict() const { return kind() == Kind::Dict; }
  bool is_namespace() const { return kind() == Kind::Namespace; }
  bool is_callable() const { return kind() == Kind::Callable; }
  bool is_generator() const { return is_seq() && seq().kind == SeqKind::Generator; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  const std::string& str() const { return std::get<std::string>(v_); }
  const ListData& seq() const { return *std::get<std::shared_ptr<const ListData>>(v_); }
  const DictData& dict_data() const { return *std::get<std::shared_ptr<const DictData>>(v_); }
  NamespaceData& ns_data() const { return *std::get<std::shared_ptr<NamespaceData>>(v_); }
  const CallableData& fn() const { return *std::get<std::shared_ptr<const CallableData>>(v_); }
  const std::string& undefined_message() const { return std::get<Undefined>(v_).message; }
  // Identity, as Python's `is` (jinja2's `sameas` test).
  bool same_object(const Value& other) const;

  // An int view of a bool/int (Python arithmetic treats True as 1); a double view of any number.
  int64_t to_int() const { return is_bool() ? (as_bool() ? 1 : 0) : as_int(); }
  double to_double() const;

 private:
  using Storage = std::variant<Undefined, None, bool, int64_t, double, std::string,
                               std::shared_ptr<const ListData>, std::shared_ptr<const DictData>,
                               std::shared_ptr<NamespaceData>, std::shared_ptr<const CallableData>>;
  explicit Value(Storage v) : v_(std::move(v)) {}
  Storage v_;
};

// Python truthiness (Undefined is falsy, a generator is always truthy).
bool truthy(const Value& v);
// Python ==, with 1 == 1.0 == True and list != tuple.
bool equal(const Value& a, const Value& b);
// Python <, for numbers, strings (code point order) and sequences; other pairs are an error.
bool less(const Value& a, const Value& b);
// Python's type name as its error messages write it ("str", "dict", "NoneType", ...).
std::string type_name(const Value& v);
// jinja2's object_type_repr, used in undefined messages ("dict object", "None").
std::string object_type_repr(const Value& v);

// str(v) as jinja2 prints a value: None -> "None", True -> "True", floats as Python repr, lists
// and dicts in Python repr. Undefined -> "".
std::string to_str(const Value& v);
// repr(v).
std::string to_repr(const Value& v);
// Python's float repr (shortest round-trip digits, Python's switch to exponent notation).
std::string float_repr(double d);

struct JsonDumpOptions {
  std::string indent;  // used when has_indent
  bool has_indent = false;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// json.dumps(v, ...) with Python's formatting; an error for values JSON cannot hold.
std::string json_dumps(const Value& v, const JsonDumpOptions& options);

// Converts the render context; keeps the key order of ordered_json objects.
Value from_json(const nlohmann::ordered_json& j);

// Throws the specula::Error an Undefined raises when it is used ("'x' is undefined").
[[noreturn]] void fail_undefined(const Value& v);

}  // namespace specula::jinja
