// Methods of str, dict and list that templates call (`message.content.strip()`, `d.items()`),
// with Python's semantics. Mutating methods exist but fail as transformers' immutable sandbox makes
// them fail.
#include <algorithm>
#include <array>

#include "core/error.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/pystr.h"

namespace specula::jinja {
namespace {

constexpr std::array kStrMethods = {
    "strip",      "lstrip",   "rstrip",  "split",        "rsplit",       "splitlines",
    "startswith", "endswith", "upper",   "lower",        "title",        "capitalize",
    "swapcase",   "replace",  "find",    "rfind",        "index",        "rindex",
    "count",      "join",     "format",  "isdigit",      "isalpha",      "isalnum",
    "isspace",    "islower",  "isupper", "removeprefix", "removesuffix", "partition",
    "rpartition", "center",   "ljust",   "rjust"};
constexpr std::array kDictMethods = {"items", "keys", "values", "get"};
constexpr std::array kListMethods = {"index", "count"};
constexpr std::array kUnsafeDictMethods = {"pop", "popitem", "setdefault", "update", "clear"};
constexpr std::array kUnsafeListMethods = {"append", "extend",  "insert", "pop",
                                           "remove", "reverse", "sort",   "clear"};
// Attributes of jinja2's loop object that are called.
constexpr std::array kLoopMethods = {"cycle", "changed"};

template <size_t N>
bool in(const std::array<const char*, N>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

const std::string& arg_str(const Value& v, std::string_view method) {
  if (!v.is_string())
    throw Error(fmt::format("str.{}() argument must be str, not {}", method, type_name(v)));
  return v.str();
}

std::optional<std::string> opt_chars(const std::optional<Value>& v, std::string_view method) {
  if (!v || v->is_none()) return std::nullopt;
  return arg_str(*v, method);
}

int64_t opt_int(const std::optional<Value>& v, int64_t def) {
  if (!v || v->is_none()) return def;
  if (!v->is_int() && !v->is_bool()) throw Error("an integer is required, got " + type_name(*v));
  return v->to_int();
}

bool affix_match(const std::string& s, const Value& affix, bool prefix, std::string_view method) {
  auto one = [&](const Value& a) {
    const std::string& x = arg_str(a, method);
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0
                  : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_seq() && affix.seq().kind == SeqKind::Tuple) {
    for (const auto& a : affix.seq().items)
      if (one(a)) return true;
    return false;
  }
  return one(affix);
}

Value str_list(std::vector<std::string> parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (auto& p : parts) out.emplace_back(std::move(p));
  return Value::list(std::move(out));
}

// str.format: {} / {0} / {name} fields with optional !r / !s; format specs are not supported.
std::string str_format(const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}')
        ++i;
      else
        throw Error("Single '}' encountered in format string");
      out.push_back('}');
      continue;
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    size_t close = fmt.find('}', i);
    if (close == std::string::npos) throw Error("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    i = close;
    char conv = 0;
    if (auto bang = field.find('!'); bang != std::string::npos) {
      conv = bang + 1 < field.size() ? field[bang + 1] : 0;
      field.resize(bang);
    }
    if (field.find(':') != std::string::npos)
      throw Error("format specs in str.format() are not supported in chat templates");
    const Value* v = nullptr;
    if (field.empty()) {
      if (auto_index >= args.positional.size())
        throw Error("Replacement index out of range for positional args tuple");
      v = &args.positional[auto_index++];
    } else if (std::all_of(field.begin(), field.end(), ::isdigit)) {
      size_t idx = std::stoul(field);
      if (idx >= args.positional.size())
        throw Error("Replacement index out of range for positional args tuple");
      v = &args.positional[idx];
    } else {
      for (const auto& [k, val] : args.keyword)
        if (k == field) v = &val;
      if (!v) throw Error(fmt::format("KeyError: '{}' in str.format()", field));
    }
    out += conv == 'r' ? to_repr(*v) : to_str(*v);
  }
  return out;
}

Value pad(const std::string& s, const std::optional<Value>& width_arg,
          const std::optional<Value>& fill_arg, int where /* -1 ljust, 0 center, 1 rjust */) {
  int64_t width = opt_int(width_arg, 0);
  std::string fill = fill_arg ? arg_str(*fill_arg, "pad") : " ";
  int64_t len = static_cast<int64_t>(pystr::length(s));
  if (width <= len) return Value(s);
  int64_t total = width - len;
  int64_t left = where < 0 ? 0 : where > 0 ? total : total / 2 + (total & width & 1);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < total - left; ++i) out += fill;
  return Value(std::move(out));
}

Value call_str_method(const std::string& s, std::string_view name, const CallArgs& args) {
  std::string fn = "str." + std::string(name);
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    auto a = bind_args(fn, args, {"chars"});
    auto side = name == "strip"    ? pystr::Side::Both
                : name == "lstrip" ? pystr::Side::Left
                                   : pystr::Side::Right;
    return Value(pystr::strip(s, opt_chars(a[0], name), side));
  }
  if (name == "split" || name == "rsplit") {
    auto a = bind_args(fn, args, {"sep", "maxsplit"});
    auto sep = opt_chars(a[0], name);
    if (sep && sep->empty()) throw Error("empty separator");
    return str_list(pystr::split(s, sep, opt_int(a[1], -1), name == "rsplit"));
  }
  if (name == "splitlines") {
    auto a = bind_args(fn, args, {"keepends"});
    return str_list(pystr::splitlines(s, a[0] && truthy(*a[0])));
  }
  if (name == "startswith" || name == "endswith") {
    auto a = bind_args(fn, args, {"affix"});
    if (!a[0]) throw Error(fn + "() takes at least 1 argument (0 given)");
    return Value(affix_match(s, *a[0], name == "startswith", name));
  }
  if (name == "upper") return Value(pystr::upper(s));
  if (name == "lower") return Value(pystr::lower(s));
  if (name == "title") return Value(pystr::title(s));
  if (name == "capitalize") return Value(pystr::capitalize(s));
  if (name == "swapcase") return Value(pystr::swapcase(s));
  if (name == "isdigit") return Value(pystr::is_digit(s));
  if (name == "isalpha") return Value(pystr::is_alpha(s));
  if (name == "isalnum") return Value(pystr::is_alnum(s));
  if (name == "isspace") return Value(pystr::is_all_space(s));
  if (name == "islower") return Value(pystr::is_lower(s));
  if (name == "isupper") return Value(pystr::is_upper(s));
  if (name == "replace") {
    auto a = bind_args(fn, args, {"old", "new", "count"});
    if (!a[0] || !a[1]) throw Error("str.replace() takes at least 2 arguments");
    return Value(pystr::replace(s, arg_str(*a[0], name), arg_str(*a[1], name), opt_int(a[2], -1)));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    auto a = bind_args(fn, args, {"sub"});
    if (!a[0]) throw Error(fn + "() takes at least 1 argument (0 given)");
    int64_t at = pystr::find(s, arg_str(*a[0], name), name[0] == 'r');
    if (at < 0 && (name == "index" || name == "rindex")) throw Error("substring not found");
    return Value(at);
  }
  if (name == "count") {
    auto a = bind_args(fn, args, {"sub"});
    if (!a[0]) throw Error("str.count() takes at least 1 argument (0 given)");
    return Value(pystr::count(s, arg_str(*a[0], name)));
  }
  if (name == "join") {
    auto a = bind_args(fn, args, {"iterable"});
    if (!a[0]) throw Error("str.join() takes exactly one argument (0 given)");
    std::string out;
    bool first = true;
    for (const auto& item : iterate(*a[0])) {
      if (!item.is_string())
        throw Error(fmt::format("sequence item: expected str instance, {} found", type_name(item)));
      if (!first) out += s;
      first = false;
      out += item.str();
    }
    return Value(std::move(out));
  }
  if (name == "format") return Value(str_format(s, args));
  if (name == "removeprefix" || name == "removesuffix") {
    auto a = bind_args(fn, args, {"affix"});
    if (!a[0]) throw Error(fn + "() takes exactly one argument (0 given)");
    const std::string& x = arg_str(*a[0], name);
    if (name == "removeprefix")
      return Value(s.compare(0, x.size(), x) == 0 && x.size() <= s.size() ? s.substr(x.size()) : s);
    bool ends = x.size() <= s.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
    return Value(ends && !x.empty() ? s.substr(0, s.size() - x.size()) : s);
  }
  if (name == "partition" || name == "rpartition") {
    auto a = bind_args(fn, args, {"sep"});
    if (!a[0]) throw Error(fn + "() takes exactly one argument (0 given)");
    const std::string& sep = arg_str(*a[0], name);
    if (sep.empty()) throw Error("empty separator");
    size_t at = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (at == std::string::npos)
      return name == "partition" ? Value::tuple({Value(s), Value(""), Value("")})
                                 : Value::tuple({Value(""), Value(""), Value(s)});
    return Value::tuple({Value(s.substr(0, at)), Value(sep), Value(s.substr(at + sep.size()))});
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    auto a = bind_args(fn, args, {"width", "fillchar"});
    return pad(s, a[0], a[1], name == "ljust" ? -1 : name == "center" ? 0 : 1);
  }
  throw Error(fmt::format("'str' object has no attribute '{}'", name));
}

Value call_dict_method(const Value& d, std::string_view name, const CallArgs& args) {
  std::string fn = "dict." + std::string(name);
  const auto& entries = d.dict_data().entries;
  if (name == "get") {
    auto a = bind_args(fn, args, {"key", "default"});
    if (!a[0]) throw Error("get expected at least 1 argument, got 0");
    if (a[0]->is_string())
      if (const Value* v = d.dict_data().find(a[0]->str())) return *v;
    return a[1] ? *a[1] : Value::none();
  }
  bind_args(fn, args, {});
  std::vector<Value> out;
  out.reserve(entries.size());
  for (const auto& [k, v] : entries) {
    if (name == "items")
      out.push_back(Value::tuple({Value(k), v}));
    else if (name == "keys")
      out.emplace_back(k);
    else
      out.push_back(v);
  }
  return Value::list(std::move(out));
}

Value call_list_method(const Value& l, std::string_view name, const CallArgs& args) {
  std::string fn = "list." + std::string(name);
  auto a = bind_args(fn, args, {"value"});
  if (!a[0]) throw Error(fn + "() takes exactly one argument (0 given)");
  const auto& items = l.seq().items;
  if (name == "count")
    return Value(static_cast<int64_t>(std::count_if(
        items.begin(), items.end(), [&](const Value& v) { return equal(v, *a[0]); })));
  for (size_t i = 0; i < items.size(); ++i)
    if (equal(items[i], *a[0])) return Value(static_cast<int64_t>(i));
  throw Error(fmt::format("{} is not in list", to_repr(*a[0])));
}

Value unsafe_method(const Value& obj, std::string_view name) {
  std::string type = type_name(obj);
  std::string n(name);
  return Value::callable(type + "." + n, [type, n](const CallArgs&) -> Value {
    throw Error(fmt::format("access to attribute '{}' of '{}' object is unsafe.", n, type));
  });
}

}  // namespace

bool is_method_name(std::string_view name) {
  return in(kStrMethods, name) || in(kDictMethods, name) || in(kListMethods, name) ||
         in(kUnsafeDictMethods, name) || in(kUnsafeListMethods, name) || in(kLoopMethods, name);
}

Value get_method(const Value& obj, std::string_view name) {
  std::string n(name);
  if (obj.is_string() && in(kStrMethods, name)) {
    std::string s = obj.str();
    return Value::callable("str." + n,
                           [s, n](const CallArgs& args) { return call_str_method(s, n, args); });
  }
  if (obj.is_dict()) {
    if (in(kDictMethods, name))
      return Value::callable(
          "dict." + n, [obj, n](const CallArgs& args) { return call_dict_method(obj, n, args); });
    if (in(kUnsafeDictMethods, name)) return unsafe_method(obj, name);
  }
  if (obj.is_seq() && obj.seq().kind != SeqKind::Generator) {
    if (in(kListMethods, name))
      return Value::callable(
          "list." + n, [obj, n](const CallArgs& args) { return call_list_method(obj, n, args); });
    if (obj.seq().kind == SeqKind::List && in(kUnsafeListMethods, name))
      return unsafe_method(obj, name);
  }
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_type_repr(obj), name));
}

}  // namespace specula::jinja
