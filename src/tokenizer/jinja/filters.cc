// jinja2's builtin filters, plus transformers' tojson (json.dumps with ensure_ascii=False and
// indent / separators / sort_keys exposed). Filters that return generators in jinja2 (map, select,
// reject, selectattr, rejectattr, unique, reverse of a list) return Generator sequences here so
// that
// `|length` on them fails and they are truthy, as in Python.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/pystr.h"

namespace specula::jinja {
namespace {

constexpr std::array kFilters = {
    "abs",      "attr",   "capitalize", "center",     "count",      "d",        "default",
    "dictsort", "e",      "escape",     "first",      "float",      "format",   "indent",
    "int",      "items",  "join",       "last",       "length",     "list",     "lower",
    "map",      "max",    "min",        "reject",     "rejectattr", "replace",  "reverse",
    "round",    "safe",   "select",     "selectattr", "sort",       "string",   "sum",
    "title",    "tojson", "trim",       "unique",     "upper",      "wordcount"};

std::string soft_str(const Value& v) { return to_str(v); }

int64_t int_arg(const std::optional<Value>& v, int64_t def, std::string_view what) {
  if (!v) return def;
  if (!v->is_int() && !v->is_bool())
    throw Error(fmt::format("{} must be an integer, not {}", what, type_name(*v)));
  return v->to_int();
}

bool bool_arg(const std::optional<Value>& v, bool def) { return v ? truthy(*v) : def; }

Value generator(std::vector<Value> items) {
  return Value::list(std::move(items), SeqKind::Generator);
}

// jinja2's make_attrgetter: "a.b.0" walks getitem with digits as ints.
Value get_attribute_path(Env& env, const Value& item, const Value& attribute,
                         const std::optional<Value>& def) {
  Value cur = item;
  std::vector<Value> parts;
  if (attribute.is_string()) {
    for (auto& p : pystr::split(attribute.str(), std::string("."), -1, false)) {
      bool digits = !p.empty() && std::all_of(p.begin(), p.end(), ::isdigit);
      parts.push_back(digits ? Value(static_cast<int64_t>(std::stoll(p))) : Value(p));
    }
  } else {
    parts.push_back(attribute);
  }
  for (const auto& part : parts) {
    cur = env.getitem(cur, part);
    if (def && !def->is_none() && cur.is_undefined()) cur = *def;
  }
  return cur;
}

Value ignore_case(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(pystr::lower(v.str()));
  return v;
}

std::vector<Value> sorted_by(std::vector<Value> items,
                             const std::function<Value(const Value&)>& key, bool reverse) {
  std::vector<std::pair<Value, Value>> keyed;
  keyed.reserve(items.size());
  for (auto& it : items) keyed.emplace_back(key(it), std::move(it));
  // Python's sort is stable, and reverse=True keeps equal items in their original order.
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? less(b.first, a.first) : less(a.first, b.first);
  });
  std::vector<Value> out;
  for (auto& [k, v] : keyed) out.push_back(std::move(v));
  return out;
}

Value do_tojson(const Value& v, const CallArgs& args) {
  auto a = bind_args("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions o;
  o.ensure_ascii = bool_arg(a[0], false);
  if (a[1] && !a[1]->is_none()) {
    o.has_indent = true;
    if (a[1]->is_string())
      o.indent = a[1]->str();
    else
      o.indent =
          std::string(static_cast<size_t>(std::max<int64_t>(0, int_arg(a[1], 0, "indent"))), ' ');
    o.item_separator = ",";  // json.dumps drops the space after ',' when indenting
  }
  if (a[2] && !a[2]->is_none()) {
    auto parts = iterate(*a[2]);
    if (parts.size() != 2 || !parts[0].is_string() || !parts[1].is_string())
      throw Error("tojson: separators must be an (item_separator, key_separator) pair of strings");
    o.item_separator = parts[0].str();
    o.key_separator = parts[1].str();
  }
  o.sort_keys = bool_arg(a[3], false);
  return Value(json_dumps(v, o));
}

Value do_indent(const Value& v, const CallArgs& args) {
  auto a = bind_args("indent", args, {"width", "first", "blank"});
  std::string indention =
      a[0] && a[0]->is_string()
          ? a[0]->str()
          : std::string(static_cast<size_t>(std::max<int64_t>(0, int_arg(a[0], 4, "width"))), ' ');
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_string())  // jinja2 does `s += "\n"`, which only works on a str
    throw Error(fmt::format("unsupported operand type(s) for +=: '{}' and 'str'", type_name(v)));
  std::string s = v.str() + "\n";  // the quirk that makes splitlines() keep a last blank line
  auto lines = pystr::splitlines(s, false);
  std::string rv;
  if (bool_arg(a[2], false)) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + indention : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i)
      rv += "\n" + (lines[i].empty() ? "" : indention + lines[i]);
  }
  if (bool_arg(a[1], false)) rv = indention + rv;
  return Value(std::move(rv));
}

Value do_int(const Value& v, const CallArgs& args) {
  auto a = bind_args("int", args, {"default", "base"});
  Value def = a[0] ? *a[0] : Value(0);
  int64_t base = int_arg(a[1], 10, "base");
  if (v.is_undefined()) fail_undefined(v);  // int(Undefined) raises; do_int does not catch it
  if (v.is_int()) return v;
  if (v.is_bool()) return Value(v.to_int());
  if (v.is_float())
    return std::isfinite(v.as_float()) ? Value(static_cast<int64_t>(v.as_float())) : def;
  if (v.is_string()) {
    std::string s = pystr::strip(v.str(), std::nullopt, pystr::Side::Both);
    std::string digits;
    for (char c : s)
      if (c != '_') digits.push_back(c);
    if (!digits.empty()) {
      char* end = nullptr;
      errno = 0;
      long long r = std::strtoll(digits.c_str(), &end, static_cast<int>(base));
      if (*end == '\0' && errno == 0) return Value(static_cast<int64_t>(r));
      end = nullptr;
      double d = std::strtod(s.c_str(), &end);  // "42.23"|int gives 42
      if (end && *end == '\0' && std::isfinite(d)) return Value(static_cast<int64_t>(d));
    }
  }
  return def;
}

Value do_float(const Value& v, const CallArgs& args) {
  auto a = bind_args("float", args, {"default"});
  Value def = a[0] ? *a[0] : Value(0.0);
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_number()) return Value(v.to_double());
  if (v.is_string()) {
    std::string s = pystr::strip(v.str(), std::nullopt, pystr::Side::Both);
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == '\0') return Value(d);
  }
  return def;
}

Value do_round(const Value& v, const CallArgs& args) {
  auto a = bind_args("round", args, {"precision", "method"});
  int64_t precision = int_arg(a[0], 0, "precision");
  std::string method = a[1] ? to_str(*a[1]) : "common";
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_number())
    throw Error(fmt::format("type {} doesn't define __round__ method", type_name(v)));
  if (!v.is_float() && method == "common" && precision >= 0)
    return Value(v.to_int());  // int.__round__
  double x = v.to_double();
  if (method == "common") {
    // Python's round() is correctly rounded (half to even on the exact binary value); printf's
    // %.Nf rounds the exact value the same way.
    if (precision < 0) {
      double p = std::pow(10.0, static_cast<double>(-precision));
      return Value(std::nearbyint(x / p) * p);
    }
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(std::min<int64_t>(precision, 300)), x);
    return Value(std::strtod(buf, nullptr));
  }
  double p = std::pow(10.0, static_cast<double>(precision));
  if (method == "floor") return Value(std::floor(x * p) / p);
  if (method == "ceil") return Value(std::ceil(x * p) / p);
  throw Error("round: method must be common, ceil or floor");
}

Value do_escape(const Value& v) {
  std::string out;
  for (char c : soft_str(v)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return Value(std::move(out));
}

Value do_map(Env& env, const Value& v, const CallArgs& args) {
  std::vector<Value> out;
  if (!truthy(v)) return generator({});
  bool by_attr = args.positional.empty();
  for (const auto& [k, _] : args.keyword) by_attr = by_attr && (k == "attribute" || k == "default");
  if (args.positional.empty() && !args.keyword.empty() && by_attr) {
    auto a = bind_args("map", args, {"attribute", "default"});
    if (!a[0]) throw Error("map requires a filter argument");
    for (const auto& item : iterate(v)) out.push_back(get_attribute_path(env, item, *a[0], a[1]));
    return generator(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is_string())
    throw Error("map requires a filter argument");
  CallArgs rest{std::vector<Value>(args.positional.begin() + 1, args.positional.end()),
                args.keyword};
  for (const auto& item : iterate(v))
    out.push_back(env.call_filter(args.positional[0].str(), item, rest, 0));
  return generator(std::move(out));
}

Value select_or_reject(Env& env, const Value& v, const CallArgs& args, bool select, bool by_attr) {
  if (!truthy(v)) return generator({});
  size_t off = by_attr ? 1 : 0;
  if (by_attr && args.positional.empty()) throw Error("Missing parameter for attribute name");
  std::vector<Value> out;
  for (const auto& item : iterate(v)) {
    Value x = by_attr ? get_attribute_path(env, item, args.positional[0], std::nullopt) : item;
    bool ok;
    if (args.positional.size() > off) {
      if (!args.positional[off].is_string()) throw Error("test name must be a string");
      CallArgs rest{std::vector<Value>(args.positional.begin() + static_cast<long>(off) + 1,
                                       args.positional.end()),
                    args.keyword};
      ok = env.call_test(args.positional[off].str(), x, rest, 0);
    } else {
      ok = truthy(x);
    }
    if (ok == select) out.push_back(item);
  }
  return generator(std::move(out));
}

Value min_max(Env& env, const Value& v, const CallArgs& args, bool is_max) {
  auto a = bind_args(is_max ? "max" : "min", args, {"case_sensitive", "attribute"});
  auto items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  bool cs = bool_arg(a[0], false);
  auto key = [&](const Value& x) {
    return ignore_case(a[1] ? get_attribute_path(env, x, *a[1], std::nullopt) : x, cs);
  };
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    if (is_max ? less(best_key, k) : less(k, best_key)) best = i, best_key = k;
  }
  return items[best];
}

}  // namespace

bool is_filter(std::string_view name) {
  return std::find(kFilters.begin(), kFilters.end(), name) != kFilters.end();
}

Value apply_filter(Env& env, std::string_view name, const Value& v, const CallArgs& args) {
  auto none = [&](std::string_view fn) { bind_args(fn, args, {}); };
  if (name == "tojson") return do_tojson(v, args);
  if (name == "trim") {
    auto a = bind_args("trim", args, {"chars"});
    std::optional<std::string> chars;
    if (a[0] && !a[0]->is_none()) chars = soft_str(*a[0]);
    return Value(pystr::strip(soft_str(v), chars, pystr::Side::Both));
  }
  if (name == "length" || name == "count") {
    none(name);
    return Value(static_cast<int64_t>(py_len(v)));
  }
  if (name == "default" || name == "d") {
    auto a = bind_args("default", args, {"default_value", "boolean"});
    if (v.is_undefined() || (bool_arg(a[1], false) && !truthy(v))) return a[0] ? *a[0] : Value("");
    return v;
  }
  if (name == "join") {
    auto a = bind_args("join", args, {"d", "attribute"});
    std::string sep = a[0] ? soft_str(*a[0]) : "";
    std::string out;
    bool first = true;
    for (const auto& item : iterate(v)) {
      if (!first) out += sep;
      first = false;
      out += soft_str(a[1] ? get_attribute_path(env, item, *a[1], std::nullopt) : item);
    }
    return Value(std::move(out));
  }
  if (name == "upper") {
    none(name);
    return Value(pystr::upper(soft_str(v)));
  }
  if (name == "lower") {
    none(name);
    return Value(pystr::lower(soft_str(v)));
  }
  if (name == "capitalize") {
    none(name);
    return Value(pystr::capitalize(soft_str(v)));
  }
  if (name == "title") {
    none(name);
    // jinja2 capitalises each word after runs of whitespace, '-', '(', '{', '[' or '<'.
    std::string out;
    bool word_start = true;
    for (char32_t c : pystr::decode(soft_str(v))) {
      bool sep = pystr::is_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
      std::string ch;
      pystr::append_utf8(ch, c);
      out += sep ? ch : word_start ? pystr::upper(ch) : pystr::lower(ch);
      word_start = sep;
    }
    return Value(std::move(out));
  }
  if (name == "first") {
    none(name);
    auto items = iterate(v);
    return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
  }
  if (name == "last") {
    none(name);
    if (v.is_generator()) throw Error("'generator' object is not reversible");
    auto items = iterate(v);
    return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
  }
  if (name == "list") {
    none(name);
    return Value::list(iterate(v));
  }
  if (name == "string") {
    none(name);
    return Value(soft_str(v));
  }
  if (name == "safe") {
    none(name);
    return v.is_string() ? v : Value(soft_str(v));
  }
  if (name == "e" || name == "escape") {
    none(name);
    return do_escape(v);
  }
  if (name == "int") return do_int(v, args);
  if (name == "float") return do_float(v, args);
  if (name == "round") return do_round(v, args);
  if (name == "abs") {
    none(name);
    if (v.is_float()) return Value(std::fabs(v.as_float()));
    if (v.is_int() || v.is_bool()) return Value(static_cast<int64_t>(std::llabs(v.to_int())));
    throw Error(fmt::format("bad operand type for abs(): '{}'", type_name(v)));
  }
  if (name == "items") {
    none(name);
    if (v.is_undefined()) return generator({});
    if (!v.is_dict()) throw Error("Can only get item pairs from a mapping.");
    std::vector<Value> out;
    for (const auto& [k, x] : v.dict_data().entries) out.push_back(Value::tuple({Value(k), x}));
    return generator(std::move(out));
  }
  if (name == "replace") {
    auto a = bind_args("replace", args, {"old", "new", "count"});
    if (!a[0] || !a[1]) throw Error("replace() requires 'old' and 'new'");
    int64_t count = a[2] && !a[2]->is_none() ? int_arg(a[2], -1, "count") : -1;
    return Value(pystr::replace(soft_str(v), soft_str(*a[0]), soft_str(*a[1]), count));
  }
  if (name == "indent") return do_indent(v, args);
  if (name == "center") {
    auto a = bind_args("center", args, {"width"});
    std::string s = soft_str(v);
    int64_t width = int_arg(a[0], 80, "width");
    int64_t len = static_cast<int64_t>(pystr::length(s));
    if (width <= len) return Value(s);
    int64_t total = width - len, left = total / 2 + (total & width & 1);
    return Value(std::string(static_cast<size_t>(left), ' ') + s +
                 std::string(static_cast<size_t>(total - left), ' '));
  }
  if (name == "format") {
    if (!args.keyword.empty()) throw Error("format filter: keyword arguments are not supported");
    return Value(py_format(soft_str(v), Value::tuple(args.positional)));
  }
  if (name == "wordcount") {
    none(name);
    int64_t n = 0;
    bool in_word = false;
    for (char32_t c : pystr::decode(soft_str(v))) {
      std::string ch;
      pystr::append_utf8(ch, c);
      bool w = c == '_' || pystr::is_alnum(ch);
      if (w && !in_word) ++n;
      in_word = w;
    }
    return Value(n);
  }
  if (name == "reverse") {
    none(name);
    if (v.is_string()) {
      auto cps = pystr::decode(v.str());
      std::reverse(cps.begin(), cps.end());
      return Value(pystr::encode(cps));
    }
    auto items = iterate(v);
    std::reverse(items.begin(), items.end());
    return generator(std::move(items));
  }
  if (name == "sort") {
    auto a = bind_args("sort", args, {"reverse", "case_sensitive", "attribute"});
    bool cs = bool_arg(a[1], false);
    return Value::list(sorted_by(
        iterate(v),
        [&](const Value& x) {
          return ignore_case(a[2] ? get_attribute_path(env, x, *a[2], std::nullopt) : x, cs);
        },
        bool_arg(a[0], false)));
  }
  if (name == "dictsort") {
    auto a = bind_args("dictsort", args, {"case_sensitive", "by", "reverse"});
    if (!v.is_dict()) throw Error("dictsort: value must be a mapping");
    std::string by = a[1] ? to_str(*a[1]) : "key";
    if (by != "key" && by != "value")
      throw Error("You can only sort by either \"key\" or \"value\"");
    size_t pos = by == "key" ? 0 : 1;
    std::vector<Value> pairs;
    for (const auto& [k, x] : v.dict_data().entries) pairs.push_back(Value::tuple({Value(k), x}));
    bool cs = bool_arg(a[0], false);
    return Value::list(sorted_by(
        std::move(pairs), [&](const Value& p) { return ignore_case(p.seq().items[pos], cs); },
        bool_arg(a[2], false)));
  }
  if (name == "unique") {
    auto a = bind_args("unique", args, {"case_sensitive", "attribute"});
    bool cs = bool_arg(a[0], false);
    std::vector<Value> seen, out;
    for (const auto& item : iterate(v)) {
      Value key = ignore_case(a[1] ? get_attribute_path(env, item, *a[1], std::nullopt) : item, cs);
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); })) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return generator(std::move(out));
  }
  if (name == "min" || name == "max") return min_max(env, v, args, name == "max");
  if (name == "sum") {
    auto a = bind_args("sum", args, {"attribute", "start"});
    Value total = a[1] ? *a[1] : Value(0);
    for (const auto& item : iterate(v))
      total =
          binary_op("+", total, a[0] ? get_attribute_path(env, item, *a[0], std::nullopt) : item);
    return total;
  }
  if (name == "attr") {
    auto a = bind_args("attr", args, {"name"});
    if (!a[0] || !a[0]->is_string()) throw Error("attr filter needs an attribute name");
    return env.getattr(v, a[0]->str());
  }
  if (name == "map") return do_map(env, v, args);
  if (name == "select") return select_or_reject(env, v, args, true, false);
  if (name == "reject") return select_or_reject(env, v, args, false, false);
  if (name == "selectattr") return select_or_reject(env, v, args, true, true);
  if (name == "rejectattr") return select_or_reject(env, v, args, false, true);
  throw Error(fmt::format("no filter named '{}'", name));
}

}  // namespace specula::jinja
