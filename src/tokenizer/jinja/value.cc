#include "tokenizer/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "core/error.h"
#include "tokenizer/jinja/pystr.h"

namespace specula::jinja {

const Value* DictData::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void DictData::set(std::string key, Value value) {
  for (auto& [k, v] : entries) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

Value Value::list(std::vector<Value> items, SeqKind kind) {
  auto data = std::make_shared<ListData>();
  data->items = std::move(items);
  data->kind = kind;
  return Value(Storage(std::shared_ptr<const ListData>(std::move(data))));
}

Value Value::dict(DictData data) {
  return Value(
      Storage(std::shared_ptr<const DictData>(std::make_shared<DictData>(std::move(data)))));
}

Value Value::ns(DictData attrs) {
  auto data = std::make_shared<NamespaceData>();
  data->attrs = std::move(attrs);
  return Value(Storage(std::move(data)));
}

Value Value::callable(std::string name, std::function<Value(const CallArgs&)> fn) {
  auto data = std::make_shared<CallableData>();
  data->name = std::move(name);
  data->fn = std::move(fn);
  return Value(Storage(std::shared_ptr<const CallableData>(std::move(data))));
}

double Value::to_double() const {
  if (is_float()) return as_float();
  return static_cast<double>(to_int());
}

bool Value::same_object(const Value& o) const {
  if (kind() != o.kind()) return false;
  switch (kind()) {
    case Kind::Undefined:
      return false;
    case Kind::None:
      return true;
    case Kind::Bool:
      return as_bool() == o.as_bool();
    case Kind::Int:  // CPython caches small ints; larger ones are distinct objects
      return as_int() == o.as_int() && as_int() >= -5 && as_int() <= 256;
    case Kind::Float:
    case Kind::String:
      return false;
    case Kind::Seq:
      return &seq() == &o.seq();
    case Kind::Dict:
      return &dict_data() == &o.dict_data();
    case Kind::Namespace:
      return &ns_data() == &o.ns_data();
    case Kind::Callable:
      return &fn() == &o.fn();
  }
  return false;
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None:
      return false;
    case Value::Kind::Bool:
      return v.as_bool();
    case Value::Kind::Int:
      return v.as_int() != 0;
    case Value::Kind::Float:
      return v.as_float() != 0.0;
    case Value::Kind::String:
      return !v.str().empty();
    case Value::Kind::Seq:
      return v.is_generator() || !v.seq().items.empty();
    case Value::Kind::Dict:
      return !v.dict_data().entries.empty();
    case Value::Kind::Namespace:
    case Value::Kind::Callable:
      return true;
  }
  return false;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_double() == b.to_double();
    return a.to_int() == b.to_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None:
      return true;
    case Value::Kind::String:
      return a.str() == b.str();
    case Value::Kind::Seq: {
      const auto& x = a.seq();
      const auto& y = b.seq();
      if (x.kind == SeqKind::Generator || y.kind == SeqKind::Generator) return &x == &y;
      if (x.kind != y.kind || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!equal(x.items[i], y.items[i])) return false;
      return true;
    }
    case Value::Kind::Dict: {
      const auto& x = a.dict_data().entries;
      const auto& y = b.dict_data();
      if (x.size() != y.entries.size()) return false;
      for (const auto& [k, v] : x) {
        const Value* other = y.find(k);
        if (!other || !equal(v, *other)) return false;
      }
      return true;
    }
    default:
      return a.same_object(b);
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_double() < b.to_double();
    return a.to_int() < b.to_int();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 order == code point order
  if (a.is_seq() && b.is_seq() && a.seq().kind == b.seq().kind &&
      a.seq().kind != SeqKind::Generator) {
    const auto& x = a.seq().items;
    const auto& y = b.seq().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equal(x[i], y[i])) continue;
      return less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  throw Error(fmt::format("'<' not supported between instances of '{}' and '{}'", type_name(a),
                          type_name(b)));
}

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return "Undefined";
    case Value::Kind::None:
      return "NoneType";
    case Value::Kind::Bool:
      return "bool";
    case Value::Kind::Int:
      return "int";
    case Value::Kind::Float:
      return "float";
    case Value::Kind::String:
      return "str";
    case Value::Kind::Seq:
      return v.seq().kind == SeqKind::List    ? "list"
             : v.seq().kind == SeqKind::Tuple ? "tuple"
                                              : "generator";
    case Value::Kind::Dict:
      return "dict";
    case Value::Kind::Namespace:
      return "Namespace";
    case Value::Kind::Callable:
      return "function";
  }
  return "object";
}

std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  return type_name(v) + " object";
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0.0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: fixed notation while the decimal point
  // position is in (-4, 16], exponent notation (at least two exponent digits) otherwise.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string out;
  size_t pos = 0;
  if (sci[0] == '-') out.push_back('-'), pos = 1;
  size_t e = sci.find('e');
  std::string digits;
  for (size_t i = pos; i < e; ++i)
    if (sci[i] != '.') digits.push_back(sci[i]);
  int exp10 = std::stoi(sci.substr(e + 1));
  int decpt = exp10 + 1;
  int n = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(-decpt, '0') + digits;
    } else if (decpt >= n) {
      out += digits + std::string(decpt - n, '0') + ".0";
    } else {
      out += digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
  } else {
    out += digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    int x = decpt - 1;
    out += fmt::format("e{}{:02d}", x < 0 ? '-' : '+', std::abs(x));
  }
  return out;
}

namespace {

void append_str(std::string& out, const Value& v, bool as_repr);

void append_seq(std::string& out, const ListData& data) {
  if (data.kind == SeqKind::Generator) {
    out += "<generator object>";
    return;
  }
  bool tuple = data.kind == SeqKind::Tuple;
  out.push_back(tuple ? '(' : '[');
  for (size_t i = 0; i < data.items.size(); ++i) {
    if (i) out += ", ";
    append_str(out, data.items[i], true);
  }
  if (tuple && data.items.size() == 1) out.push_back(',');
  out.push_back(tuple ? ')' : ']');
}

void append_dict(std::string& out, const DictData& data) {
  out.push_back('{');
  bool first = true;
  for (const auto& [k, v] : data.entries) {
    if (!first) out += ", ";
    first = false;
    out += pystr::repr(k);
    out += ": ";
    append_str(out, v, true);
  }
  out.push_back('}');
}

void append_str(std::string& out, const Value& v, bool as_repr) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      if (as_repr) out += "Undefined";
      return;
    case Value::Kind::None:
      out += "None";
      return;
    case Value::Kind::Bool:
      out += v.as_bool() ? "True" : "False";
      return;
    case Value::Kind::Int:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::Float:
      out += float_repr(v.as_float());
      return;
    case Value::Kind::String:
      if (as_repr)
        out += pystr::repr(v.str());
      else
        out += v.str();
      return;
    case Value::Kind::Seq:
      append_seq(out, v.seq());
      return;
    case Value::Kind::Dict:
      append_dict(out, v.dict_data());
      return;
    case Value::Kind::Namespace:
      out += "<Namespace ";
      append_dict(out, v.ns_data().attrs);
      out += ">";
      return;
    case Value::Kind::Callable:
      out += "<function " + v.fn().name + ">";
      return;
  }
}

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  for (char32_t c : pystr::decode(s)) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c > 0x7e)) {
          if (c >= 0x10000) {  // a UTF-16 surrogate pair, as json.dumps writes it
            char32_t v = c - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
          } else {
            out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
          }
        } else {
          pystr::append_utf8(out, c);
        }
    }
  }
  out.push_back('"');
}

void dump(std::string& out, const Value& v, const JsonDumpOptions& o, int level) {
  auto newline = [&](int lvl) {
    out.push_back('\n');
    for (int i = 0; i < lvl; ++i) out += o.indent;
  };
  // With an indent, items go one per line and Python drops the space after the comma.
  const std::string& item_sep = o.item_separator;
  switch (v.kind()) {
    case Value::Kind::None:
      out += "null";
      return;
    case Value::Kind::Bool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::Int:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::Float: {
      double d = v.as_float();
      if (std::isnan(d))
        out += "NaN";
      else if (std::isinf(d))
        out += d > 0 ? "Infinity" : "-Infinity";
      else
        out += float_repr(d);
      return;
    }
    case Value::Kind::String:
      json_string(out, v.str(), o.ensure_ascii);
      return;
    case Value::Kind::Seq: {
      if (v.is_generator()) throw Error("Object of type generator is not JSON serializable");
      const auto& items = v.seq().items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        if (o.has_indent) newline(level + 1);
        dump(out, items[i], o, level + 1);
      }
      if (o.has_indent) newline(level);
      out.push_back(']');
      return;
    }
    case Value::Kind::Dict: {
      const auto& entries = v.dict_data().entries;
      if (entries.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> order;
      for (const auto& e : entries) order.push_back(&e);
      if (o.sort_keys)
        std::stable_sort(order.begin(), order.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      out.push_back('{');
      for (size_t i = 0; i < order.size(); ++i) {
        if (i) out += item_sep;
        if (o.has_indent) newline(level + 1);
        json_string(out, order[i]->first, o.ensure_ascii);
        out += o.key_separator;
        dump(out, order[i]->second, o, level + 1);
      }
      if (o.has_indent) newline(level);
      out.push_back('}');
      return;
    }
    default:
      throw Error(fmt::format("Object of type {} is not JSON serializable", type_name(v)));
  }
}

}  // namespace

std::string to_str(const Value& v) {
  if (v.is_string()) return v.str();
  std::string out;
  append_str(out, v, false);
  return out;
}

std::string to_repr(const Value& v) {
  std::string out;
  append_str(out, v, true);
  return out;
}

std::string json_dumps(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  dump(out, v, options, 0);
  return out;
}

Value from_json(const nlohmann::ordered_json& j) {
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null:
      return Value::none();
    case T::boolean:
      return Value(j.get<bool>());
    case T::number_integer:
      return Value(j.get<int64_t>());
    case T::number_unsigned: {
      auto u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<int64_t>(u));
      return Value(static_cast<double>(u));
    }
    case T::number_float:
      return Value(j.get<double>());
    case T::string:
      return Value(j.get<std::string>());
    case T::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return Value::list(std::move(items));
    }
    case T::object: {
      DictData d;
      d.entries.reserve(j.size());
      for (const auto& [k, e] : j.items()) d.entries.emplace_back(k, from_json(e));
      return Value::dict(std::move(d));
    }
    default:
      throw Error("chat template context: unsupported JSON value (binary or discarded)");
  }
}

void fail_undefined(const Value& v) { throw Error(v.undefined_message()); }

}  // namespace specula::jinja
