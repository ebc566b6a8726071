// Python semantics for the operations templates apply to values: len(), iteration, indexing,
// `in`, arithmetic, str % args, and argument binding for the builtins.
#include <cmath>

#include "core/error.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/pystr.h"

namespace specula::jinja {

size_t py_len(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return 0;  // jinja2's Undefined has len() 0
    case Value::Kind::String:
      return pystr::length(v.str());
    case Value::Kind::Seq:
      if (!v.is_generator()) return v.seq().items.size();
      break;
    case Value::Kind::Dict:
      return v.dict_data().entries.size();
    default:
      break;
  }
  throw Error(fmt::format("object of type '{}' has no len()", type_name(v)));
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return {};
    case Value::Kind::Seq:
      return v.seq().items;
    case Value::Kind::Dict: {
      std::vector<Value> keys;
      for (const auto& [k, _] : v.dict_data().entries) keys.emplace_back(k);
      return keys;
    }
    case Value::Kind::String: {
      std::vector<Value> chars;
      for (char32_t c : pystr::decode(v.str())) {
        std::string s;
        pystr::append_utf8(s, c);
        chars.emplace_back(std::move(s));
      }
      return chars;
    }
    default:
      throw Error(fmt::format("'{}' object is not iterable", type_name(v)));
  }
}

Value py_getitem(const Value& obj, const Value& key, bool* found) {
  *found = false;
  if ((obj.is_seq() && !obj.is_generator()) || obj.is_string()) {
    if (!key.is_int() && !key.is_bool()) return Value();
    int64_t n = static_cast<int64_t>(py_len(obj));
    int64_t i = key.to_int();
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value();
    *found = true;
    if (obj.is_seq()) return obj.seq().items[static_cast<size_t>(i)];
    if (obj.str().size() == static_cast<size_t>(n))
      return Value(obj.str().substr(static_cast<size_t>(i), 1));
    std::string s;
    pystr::append_utf8(s, pystr::decode(obj.str())[static_cast<size_t>(i)]);
    return Value(std::move(s));
  }
  if (obj.is_dict() && key.is_string()) {
    if (const Value* v = obj.dict_data().find(key.str())) {
      *found = true;
      return *v;
    }
  }
  return Value();
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::Undefined:
      return false;  // iterates as empty
    case Value::Kind::String:
      if (!item.is_string())
        throw Error(
            fmt::format("'in <string>' requires string as left operand, not {}", type_name(item)));
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::Seq:
      for (const auto& v : container.seq().items)
        if (equal(v, item)) return true;
      return false;
    case Value::Kind::Dict:
      if ((item.is_seq() && item.seq().kind != SeqKind::Tuple) || item.is_dict() ||
          item.is_namespace())
        throw Error(fmt::format("unhashable type: '{}'", type_name(item)));
      return item.is_string() && container.dict_data().find(item.str()) != nullptr;
    default:
      throw Error(fmt::format("argument of type '{}' is not iterable", type_name(container)));
  }
}

namespace {

[[noreturn]] void bad_operands(std::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (op == "+" && a.is_string())
    throw Error(fmt::format("can only concatenate str (not \"{}\") to str", type_name(b)));
  throw Error(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a),
                          type_name(b)));
}

// Python ints are unbounded; ours are 64-bit, so overflow is an error rather than a wrong answer.
enum class IntOp { Add, Sub, Mul };
int64_t checked(IntOp op, int64_t a, int64_t b) {
  int64_t r = 0;
  bool overflow = op == IntOp::Add   ? __builtin_add_overflow(a, b, &r)
                  : op == IntOp::Sub ? __builtin_sub_overflow(a, b, &r)
                                     : __builtin_mul_overflow(a, b, &r);
  if (overflow) throw Error("integer overflow in chat template arithmetic");
  return r;
}

Value repeat(const Value& seq, int64_t n) {
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value(std::move(out));
  }
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i)
    out.insert(out.end(), seq.seq().items.begin(), seq.seq().items.end());
  return Value::list(std::move(out), seq.seq().kind);
}

}  // namespace

Value binary_op(std::string_view op, const Value& a, const Value& b) {
  bool ints = (a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool());
  bool nums = a.is_number() && b.is_number();
  if (op == "+") {
    if (ints) return Value(checked(IntOp::Add, a.to_int(), b.to_int()));
    if (nums) return Value(a.to_double() + b.to_double());
    if (a.is_string() && b.is_string()) return Value(a.str() + b.str());
    if (a.is_seq() && b.is_seq() && a.seq().kind == b.seq().kind && !a.is_generator()) {
      std::vector<Value> items = a.seq().items;
      items.insert(items.end(), b.seq().items.begin(), b.seq().items.end());
      return Value::list(std::move(items), a.seq().kind);
    }
  } else if (op == "-") {
    if (ints) return Value(checked(IntOp::Sub, a.to_int(), b.to_int()));
    if (nums) return Value(a.to_double() - b.to_double());
  } else if (op == "*") {
    if (ints) return Value(checked(IntOp::Mul, a.to_int(), b.to_int()));
    if (nums) return Value(a.to_double() * b.to_double());
    auto seqlike = [](const Value& v) {
      return v.is_string() || (v.is_seq() && !v.is_generator());
    };
    if (seqlike(a) && (b.is_int() || b.is_bool())) return repeat(a, b.to_int());
    if (seqlike(b) && (a.is_int() || a.is_bool())) return repeat(b, a.to_int());
  } else if (op == "/") {
    if (nums) {
      if (b.to_double() == 0.0) throw Error("division by zero");
      return Value(a.to_double() / b.to_double());
    }
  } else if (op == "//" || op == "%") {
    if (ints) {
      int64_t x = a.to_int(), y = b.to_int();
      if (y == 0)
        throw Error(op == "//" ? "integer division or modulo by zero" : "integer modulo by zero");
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) q -= 1, r += y;  // Python floors toward -inf
      return op == "//" ? Value(q) : Value(r);
    }
    if (nums) {
      // CPython's float_divmod, so that results match to the last bit.
      double x = a.to_double(), y = b.to_double();
      if (y == 0.0) throw Error("float division by zero");
      double mod = std::fmod(x, y);
      double div = (x - mod) / y;
      if (mod != 0.0) {
        if ((y < 0) != (mod < 0)) mod += y, div -= 1.0;
      } else {
        mod = std::copysign(0.0, y);
      }
      if (op == "%") return Value(mod);
      double floordiv;
      if (div != 0.0) {
        floordiv = std::floor(div);
        if (div - floordiv > 0.5) floordiv += 1.0;
      } else {
        floordiv = std::copysign(0.0, x / y);
      }
      return Value(floordiv);
    }
    if (op == "%" && a.is_string()) return Value(py_format(a.str(), b));
  } else if (op == "**") {
    if (ints && b.to_int() >= 0) {
      int64_t base = a.to_int(), r = 1;
      for (int64_t e = b.to_int(); e > 0; e >>= 1) {  // square-and-multiply
        if (e & 1) r = checked(IntOp::Mul, r, base);
        if (e > 1) base = checked(IntOp::Mul, base, base);
      }
      return Value(r);
    }
    if (nums) return Value(std::pow(a.to_double(), b.to_double()));
  }
  bad_operands(op, a, b);
}

std::string py_format(const std::string& fmt, const Value& args) {
  std::vector<Value> values;
  if (args.is_seq() && args.seq().kind == SeqKind::Tuple)
    values = args.seq().items;
  else
    values.push_back(args);
  // Python checks for unused arguments only when they are not mapping-like (anything with
  // __getitem__ but a tuple or str): 'abc' % [1] is 'abc', 'abc' % 1 is an error.
  bool mapping_like =
      args.is_dict() || args.is_undefined() || (args.is_seq() && args.seq().kind == SeqKind::List);
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    if (++i >= fmt.size()) throw Error("incomplete format");
    char spec = fmt[i];
    if (spec == '%') {
      out.push_back('%');
      continue;
    }
    if (next >= values.size()) throw Error("not enough arguments for format string");
    const Value& v = values[next++];
    if (spec == 's')
      out += to_str(v);
    else if (spec == 'r')
      out += to_repr(v);
    else if ((spec == 'd' || spec == 'i') && v.is_number())
      out += std::to_string(v.is_float() ? static_cast<int64_t>(v.as_float()) : v.to_int());
    else
      throw Error(fmt::format("unsupported format character '{}' in chat template", spec));
  }
  if (next < values.size() && !mapping_like)
    throw Error("not all arguments converted during string formatting");
  return out;
}

std::vector<std::optional<Value>> bind_args(std::string_view fn, const CallArgs& args,
                                            std::initializer_list<std::string_view> names) {
  std::vector<std::optional<Value>> out(names.size());
  if (args.positional.size() > names.size())
    throw Error(fmt::format("{}() takes at most {} argument(s) ({} given)", fn, names.size(),
                            args.positional.size()));
  for (size_t i = 0; i < args.positional.size(); ++i) out[i] = args.positional[i];
  for (const auto& [key, value] : args.keyword) {
    size_t i = 0;
    for (auto n : names) {
      if (n == key) break;
      ++i;
    }
    if (i == names.size())
      throw Error(fmt::format("{}() got an unexpected keyword argument '{}'", fn, key));
    if (out[i]) throw Error(fmt::format("{}() got multiple values for argument '{}'", fn, key));
    out[i] = value;
  }
  return out;
}

}  // namespace specula::jinja
