// The tree-walking interpreter: jinja2's scoping (each for-loop iteration, macro call, with and
// filter block gets its own scope; if/elif do not), the sandbox's getattr/getitem rules, and the
// globals transformers adds (raise_exception, strftime_now).
#include "tokenizer/jinja/template.h"

#include <ctime>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/parser.h"
#include "tokenizer/jinja/pystr.h"

namespace specula::jinja {
namespace {

// An error already carrying its line: rethrown as is by enclosing statements.
class RenderError : public Error {
 public:
  using Error::Error;
};

struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;

  Value* find(std::string_view name) {
    for (Scope* s = this; s; s = s->parent.get())
      for (auto& [k, v] : s->vars)
        if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, old] : vars) {
      if (k == name) {
        old = std::move(v);
        return;
      }
    }
    vars.emplace_back(name, std::move(v));
  }
};
using ScopePtr = std::shared_ptr<Scope>;

ScopePtr child(const ScopePtr& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

enum class Flow { Normal, Break, Continue };

constexpr int kMaxMacroDepth = 200;
constexpr int64_t kMaxRange = 100000;  // jinja2's sandbox refuses larger ranges

class Interpreter : public Env {
 public:
  std::string run(const Body& body, const Value& context) {
    auto root = std::make_shared<Scope>();
    if (!context.is_dict()) throw Error("chat template context must be a mapping");
    for (const auto& [k, v] : context.dict_data().entries) root->set(k, v);
    std::string out;
    exec(body, root, out);
    return out;
  }

  Value getattr(const Value& obj, std::string_view name) override {
    if (obj.is_undefined()) fail_undefined(obj);
    if (!name.empty() && name[0] == '_')
      return Value::undefined(
          fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, type_name(obj)));
    if (obj.is_dict()) {
      if (is_method_name(name)) {  // d.items is the method, as Python's getattr finds it first
        Value m = get_method(obj, name);
        if (!m.is_undefined()) return m;
      }
      if (const Value* v = obj.dict_data().find(name)) return *v;
      return Value::undefined(
          fmt::format("'{}' has no attribute '{}'", object_type_repr(obj), name));
    }
    if (obj.is_namespace()) {
      if (const Value* v = obj.ns_data().attrs.find(name)) return *v;
      return Value::undefined(
          fmt::format("'{}' has no attribute '{}'", object_type_repr(obj), name));
    }
    return get_method(obj, name);
  }

  Value getitem(const Value& obj, const Value& key) override {
    if (obj.is_undefined()) fail_undefined(obj);
    bool found = false;
    Value v = py_getitem(obj, key, &found);
    if (found) return v;
    if (key.is_string()) {  // obj['name'] falls back to obj.name (methods, namespace attributes)
      if (key.str().empty() || key.str()[0] != '_') {
        Value attr = obj.is_namespace() ? getattr(obj, key.str()) : get_method(obj, key.str());
        if (!attr.is_undefined()) return attr;
      }
      return Value::undefined(
          fmt::format("'{}' has no attribute '{}'", object_type_repr(obj), key.str()));
    }
    return Value::undefined(
        fmt::format("{} has no element {}", object_type_repr(obj), to_repr(key)));
  }

  Value call_filter(std::string_view name, const Value& v, const CallArgs& args,
                    int line) override {
    if (!is_filter(name)) throw Error(fmt::format("no filter named '{}'", name));
    (void)line;
    return apply_filter(*this, name, v, args);
  }

  bool call_test(std::string_view name, const Value& v, const CallArgs& args, int line) override {
    if (!is_test(name)) throw Error(fmt::format("no test named '{}'", name));
    (void)line;
    return apply_test(*this, name, v, args);
  }

 private:
  // ---- statements ----
  Flow exec(const Body& body, const ScopePtr& scope, std::string& out) {
    for (const auto& s : body) {
      Flow f = exec_stmt(*s, scope, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec_stmt(const Stmt& s, const ScopePtr& scope, std::string& out) {
    try {
      return exec_stmt_inner(s, scope, out);
    } catch (const TemplateRaise&) {
      throw;
    } catch (const RenderError&) {
      throw;
    } catch (const Error& e) {
      throw RenderError(fmt::format("chat template error at line {}: {}", s.line, e.what()));
    }
  }

  Flow exec_stmt_inner(const Stmt& s, const ScopePtr& scope, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::Text:
        out += s.text;
        return Flow::Normal;
      case Stmt::Kind::Output:
        if (s.expr) out += to_str(eval(*s.expr, scope));
        for (const auto& v : s.values) out += to_str(eval(*v, scope));
        return Flow::Normal;
      case Stmt::Kind::If:
        for (const auto& [cond, body] : s.branches)
          if (truthy(eval(*cond, scope))) return exec(body, scope, out);
        return exec(s.else_body, scope, out);
      case Stmt::Kind::For:
        exec_for(s, scope, out);
        return Flow::Normal;
      case Stmt::Kind::Set:
        exec_set(s, scope);
        return Flow::Normal;
      case Stmt::Kind::SetBlock: {
        std::string text;
        exec(s.body, child(scope), text);
        scope->set(s.targets[0], apply_filter_chain(s.filters, Value(std::move(text)), scope));
        return Flow::Normal;
      }
      case Stmt::Kind::FilterBlock: {
        std::string text;
        exec(s.body, child(scope), text);
        out += to_str(apply_filter_chain(s.filters, Value(std::move(text)), scope));
        return Flow::Normal;
      }
      case Stmt::Kind::Macro: {
        std::weak_ptr<Scope> defined_in = scope;
        const Stmt* macro = &s;
        scope->set(s.name, Value::callable(s.name, [this, macro, defined_in](const CallArgs& args) {
                     return call_macro(*macro, defined_in.lock(), args);
                   }));
        return Flow::Normal;
      }
      case Stmt::Kind::With: {
        auto inner = child(scope);
        for (size_t i = 0; i < s.targets.size(); ++i)
          inner->set(s.targets[i], eval(*s.values[i], scope));
        return exec(s.body, inner, out);
      }
      case Stmt::Kind::Scope:
        return exec(s.body, child(scope), out);
      case Stmt::Kind::Break:
        return Flow::Break;
      case Stmt::Kind::Continue:
        return Flow::Continue;
    }
    return Flow::Normal;
  }

  void bind_targets(const Stmt& s, const Value& v, Scope& scope) {
    if (!s.unpack) {
      scope.set(s.targets[0], v);
      return;
    }
    std::vector<Value> parts = iterate(v);
    if (parts.size() != s.targets.size())
      throw Error(parts.size() < s.targets.size()
                      ? fmt::format("not enough values to unpack (expected {}, got {})",
                                    s.targets.size(), parts.size())
                      : fmt::format("too many values to unpack (expected {})", s.targets.size()));
    for (size_t i = 0; i < parts.size(); ++i) scope.set(s.targets[i], parts[i]);
  }

  void exec_set(const Stmt& s, const ScopePtr& scope) {
    Value v = eval(*s.expr, scope);
    if (!s.ns_name.empty()) {
      Value* ns = scope->find(s.ns_name);
      if (!ns || !ns->is_namespace())
        throw Error(fmt::format("cannot assign attribute on non-namespace object '{}'", s.ns_name));
      ns->ns_data().attrs.set(s.ns_attr, std::move(v));
      return;
    }
    bind_targets(s, v, *scope);
  }

  void exec_for(const Stmt& s, const ScopePtr& scope, std::string& out) {
    Value iterable = eval(*s.expr, scope);
    std::vector<Value> items = iterate(iterable);
    if (s.cond) {  // `for x in xs if cond`: filtered before loop.length and friends are known
      std::vector<Value> kept;
      for (auto& item : items) {
        auto probe = child(scope);
        bind_targets(s, item, *probe);
        if (truthy(eval(*s.cond, probe))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    auto last_changed = std::make_shared<std::optional<Value>>();
    bool body_completed = false;
    for (int64_t i = 0; i < n; ++i) {
      auto iter_scope = child(scope);
      bind_targets(s, items[static_cast<size_t>(i)], *iter_scope);
      iter_scope->set("loop", loop_object(items, i, last_changed));
      Flow f = exec(s.body, iter_scope, out);
      if (f == Flow::Normal) body_completed = true;
      if (f == Flow::Break) break;
    }
    // jinja2 clears its "no iteration" flag at the end of the loop body, so `else` also runs when
    // every iteration left through break or continue; transformers renders with that behaviour.
    if (!body_completed) exec(s.else_body, child(scope), out);
  }

  static Value loop_object(const std::vector<Value>& items, int64_t i,
                           const std::shared_ptr<std::optional<Value>>& last_changed) {
    const int64_t n = static_cast<int64_t>(items.size());
    DictData d;
    d.entries.reserve(13);
    d.entries.emplace_back("index", Value(i + 1));
    d.entries.emplace_back("index0", Value(i));
    d.entries.emplace_back("revindex", Value(n - i));
    d.entries.emplace_back("revindex0", Value(n - i - 1));
    d.entries.emplace_back("first", Value(i == 0));
    d.entries.emplace_back("last", Value(i == n - 1));
    d.entries.emplace_back("length", Value(n));
    d.entries.emplace_back("depth", Value(1));
    d.entries.emplace_back("depth0", Value(0));
    d.entries.emplace_back("previtem", i > 0 ? items[static_cast<size_t>(i - 1)]
                                             : Value::undefined("there is no previous item"));
    d.entries.emplace_back("nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)]
                                                 : Value::undefined("there is no next item"));
    d.entries.emplace_back(
        "cycle", Value::callable("loop.cycle", [i](const CallArgs& args) {
          if (args.positional.empty()) throw Error("no items for cycling given");
          return args.positional[static_cast<size_t>(i) % args.positional.size()];
        }));
    d.entries.emplace_back("changed",
                           Value::callable("loop.changed", [last_changed](const CallArgs& args) {
                             Value now = Value::tuple(args.positional);
                             if (*last_changed && equal(**last_changed, now)) return Value(false);
                             *last_changed = now;
                             return Value(true);
                           }));
    return Value::dict(std::move(d));
  }

  Value call_macro(const Stmt& m, const ScopePtr& defined_in, const CallArgs& args) {
    if (!defined_in) throw Error(fmt::format("macro '{}' called after its scope ended", m.name));
    if (depth_ >= kMaxMacroDepth)
      throw Error(fmt::format("macro '{}': maximum recursion depth exceeded", m.name));
    auto scope = child(defined_in);
    std::vector<bool> bound(m.params.size(), false);
    std::vector<Value> extra_pos;
    for (size_t i = 0; i < args.positional.size(); ++i) {
      if (i < m.params.size()) {
        scope->set(m.params[i], args.positional[i]);
        bound[i] = true;
      } else {
        extra_pos.push_back(args.positional[i]);
      }
    }
    DictData extra_kw;
    for (const auto& [k, v] : args.keyword) {
      auto it = std::find(m.params.begin(), m.params.end(), k);
      if (it == m.params.end()) {
        extra_kw.set(k, v);
        continue;
      }
      size_t i = static_cast<size_t>(it - m.params.begin());
      if (bound[i])
        throw Error(fmt::format("macro '{}' got multiple values for argument '{}'", m.name, k));
      scope->set(k, v);
      bound[i] = true;
    }
    for (size_t i = 0; i < m.params.size(); ++i) {
      if (bound[i]) continue;
      scope->set(m.params[i], m.defaults[i] ? eval(*m.defaults[i], scope)
                                            : Value::undefined(fmt::format(
                                                  "parameter '{}' was not provided", m.params[i])));
    }
    scope->set("varargs", Value::tuple(std::move(extra_pos)));
    scope->set("kwargs", Value::dict(std::move(extra_kw)));
    std::string out;
    ++depth_;
    try {
      exec(m.body, scope, out);
    } catch (...) {
      --depth_;
      throw;
    }
    --depth_;
    return Value(std::move(out));
  }

  Value apply_filter_chain(const std::vector<ExprPtr>& filters, Value v, const ScopePtr& scope) {
    for (const auto& f : filters) v = call_filter(f->name, v, eval_args(*f, scope), f->line);
    return v;
  }

  // ---- expressions ----
  CallArgs eval_args(const Expr& e, const ScopePtr& scope) {
    CallArgs args;
    args.positional.reserve(e.args.size());
    for (const auto& a : e.args) args.positional.push_back(eval(*a, scope));
    for (const auto& [k, a] : e.kwargs) args.keyword.emplace_back(k, eval(*a, scope));
    return args;
  }

  Value lookup(const std::string& name, const ScopePtr& scope) {
    if (Value* v = scope->find(name)) return *v;
    Value g = global(name);
    if (!g.is_undefined()) return g;
    return Value::undefined(fmt::format("'{}' is undefined", name));
  }

  Value eval(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case Expr::Kind::Literal:
        return e.literal;
      case Expr::Kind::Name:
        return lookup(e.name, scope);
      case Expr::Kind::GetAttr:
        return getattr(eval(*e.a, scope), e.name);
      case Expr::Kind::GetItem: {
        Value obj = eval(*e.a, scope);
        return getitem(obj, eval(*e.b, scope));
      }
      case Expr::Kind::Slice:
        return eval_slice(e, scope);
      case Expr::Kind::Call: {
        Value callee = eval(*e.a, scope);
        CallArgs args = eval_args(e, scope);
        if (callee.is_callable()) return callee.fn().fn(args);
        if (callee.is_undefined()) fail_undefined(callee);
        throw Error(fmt::format("'{}' object is not callable", type_name(callee)));
      }
      case Expr::Kind::Filter:
        return call_filter(e.name, eval(*e.a, scope), eval_args(e, scope), e.line);
      case Expr::Kind::Test: {
        bool r = call_test(e.name, eval(*e.a, scope), eval_args(e, scope), e.line);
        return Value(e.negated ? !r : r);
      }
      case Expr::Kind::Not:
        return Value(!truthy(eval(*e.a, scope)));
      case Expr::Kind::Neg:
      case Expr::Kind::Pos: {
        Value v = eval(*e.a, scope);
        if (v.is_undefined()) fail_undefined(v);
        bool neg = e.kind == Expr::Kind::Neg;
        if (v.is_float()) return Value(neg ? -v.as_float() : v.as_float());
        if (v.is_int() || v.is_bool()) return Value(neg ? -v.to_int() : v.to_int());
        throw Error(
            fmt::format("bad operand type for unary {}: '{}'", neg ? '-' : '+', type_name(v)));
      }
      case Expr::Kind::Binary: {
        Value a = eval(*e.a, scope);
        return binary_op(e.name, a, eval(*e.b, scope));
      }
      case Expr::Kind::And: {
        Value a = eval(*e.a, scope);
        return truthy(a) ? eval(*e.b, scope) : a;
      }
      case Expr::Kind::Or: {
        Value a = eval(*e.a, scope);
        return truthy(a) ? a : eval(*e.b, scope);
      }
      case Expr::Kind::Concat: {
        std::string s;
        for (const auto& a : e.args) s += to_str(eval(*a, scope));
        return Value(std::move(s));
      }
      case Expr::Kind::Compare:
        return eval_compare(e, scope);
      case Expr::Kind::Cond:
        if (truthy(eval(*e.b, scope))) return eval(*e.a, scope);
        if (e.c) return eval(*e.c, scope);
        return Value::undefined(
            fmt::format("the inline if-expression on line {} evaluated to false and no else "
                        "section was defined.",
                        e.line));
      case Expr::Kind::List:
      case Expr::Kind::Tuple: {
        std::vector<Value> items;
        items.reserve(e.args.size());
        for (const auto& a : e.args) items.push_back(eval(*a, scope));
        return Value::list(std::move(items),
                           e.kind == Expr::Kind::Tuple ? SeqKind::Tuple : SeqKind::List);
      }
      case Expr::Kind::Dict: {
        DictData d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i], scope);
          if (!k.is_string()) throw Error("dict literals in chat templates must have string keys");
          d.set(k.str(), eval(*e.args[i + 1], scope));
        }
        return Value::dict(std::move(d));
      }
    }
    throw Error("internal error: unknown expression kind");
  }

  Value eval_compare(const Expr& e, const ScopePtr& scope) {
    Value left = eval(*e.args[0], scope);
    for (size_t i = 0; i < e.ops.size(); ++i) {
      Value right = eval(*e.args[i + 1], scope);
      const std::string& op = e.ops[i];
      bool r;
      if (op == "==")
        r = equal(left, right);
      else if (op == "!=")
        r = !equal(left, right);
      else if (op == "<")
        r = less(left, right);
      else if (op == ">")
        r = less(right, left);
      else if (op == "<=")
        r = less(left, right) || equal(left, right);
      else if (op == ">=")
        r = less(right, left) || equal(left, right);
      else if (op == "in")
        r = contains(right, left);
      else
        r = !contains(right, left);
      if (!r) return Value(false);
      left = std::move(right);
    }
    return Value(true);
  }

  Value eval_slice(const Expr& e, const ScopePtr& scope) {
    Value obj = eval(*e.a, scope);
    if (obj.is_undefined()) fail_undefined(obj);
    auto bound = [&](const ExprPtr& x, bool* ok) -> std::optional<int64_t> {
      if (!x) return std::nullopt;
      Value v = eval(*x, scope);
      if (v.is_none()) return std::nullopt;
      if (!v.is_int() && !v.is_bool()) *ok = false;
      return *ok ? std::optional<int64_t>(v.to_int()) : std::nullopt;
    };
    bool ok = true;
    auto start = bound(e.b, &ok);
    auto stop = bound(e.c, &ok);
    auto step_opt = bound(e.d, &ok);
    bool sliceable = obj.is_string() || (obj.is_seq() && !obj.is_generator());
    if (!ok || !sliceable)  // Python raises TypeError; jinja2's getitem turns that into Undefined
      return Value::undefined(fmt::format("{} has no element slice", object_type_repr(obj)));
    int64_t step = step_opt.value_or(1);
    if (step == 0) throw Error("slice step cannot be zero");
    int64_t n = static_cast<int64_t>(py_len(obj));
    auto clamp = [&](std::optional<int64_t> v, bool is_start) {
      int64_t lower = step < 0 ? -1 : 0, upper = step < 0 ? n - 1 : n;
      if (!v) return (is_start == (step < 0)) ? upper : lower;
      int64_t x = *v;
      if (x < 0) return std::max(x + n, lower);
      return std::min(x, upper);
    };
    int64_t from = clamp(start, true), to = clamp(stop, false);
    std::vector<int64_t> idx;
    for (int64_t i = from; step > 0 ? i < to : i > to; i += step) idx.push_back(i);
    if (obj.is_string()) {
      std::u32string cps = pystr::decode(obj.str());
      std::u32string out;
      for (int64_t i : idx) out.push_back(cps[static_cast<size_t>(i)]);
      return Value(pystr::encode(out));
    }
    std::vector<Value> out;
    for (int64_t i : idx) out.push_back(obj.seq().items[static_cast<size_t>(i)]);
    return Value::list(std::move(out), obj.seq().kind);
  }

  // ---- globals: jinja2's range/dict/namespace, transformers' raise_exception/strftime_now ----
  Value global(const std::string& name) {
    if (name == "raise_exception")
      return Value::callable(name, [](const CallArgs& args) -> Value {
        auto a = bind_args("raise_exception", args, {"message"});
        throw TemplateRaise(a[0] ? to_str(*a[0]) : "");
      });
    if (name == "namespace")
      return Value::callable(name, [](const CallArgs& args) {
        DictData attrs;
        if (args.positional.size() > 1)
          throw Error("namespace() takes at most one positional argument");
        if (!args.positional.empty()) {
          const Value& init = args.positional[0];
          if (init.is_dict())
            attrs = init.dict_data();
          else if (init.is_namespace())
            attrs = init.ns_data().attrs;
          else
            for (const auto& pair : iterate(init)) {
              auto kv = iterate(pair);
              if (kv.size() != 2 || !kv[0].is_string())
                throw Error("namespace(): expected key/value pairs");
              attrs.set(kv[0].str(), kv[1]);
            }
        }
        for (const auto& [k, v] : args.keyword) attrs.set(k, v);
        return Value::ns(std::move(attrs));
      });
    if (name == "dict")
      return Value::callable(name, [](const CallArgs& args) {
        DictData d;
        if (args.positional.size() > 1) throw Error("dict expected at most 1 argument");
        if (!args.positional.empty()) {
          if (!args.positional[0].is_dict())
            throw Error("dict(): only a mapping argument is supported");
          d = args.positional[0].dict_data();
        }
        for (const auto& [k, v] : args.keyword) d.set(k, v);
        return Value::dict(std::move(d));
      });
    if (name == "range")
      return Value::callable(name, [](const CallArgs& args) {
        if (!args.keyword.empty()) throw Error("range() takes no keyword arguments");
        std::vector<int64_t> a;
        for (const auto& v : args.positional) {
          if (!v.is_int() && !v.is_bool())
            throw Error(
                fmt::format("'{}' object cannot be interpreted as an integer", type_name(v)));
          a.push_back(v.to_int());
        }
        if (a.empty() || a.size() > 3) throw Error("range expected 1 to 3 arguments");
        int64_t start = a.size() == 1 ? 0 : a[0], stop = a.size() == 1 ? a[0] : a[1];
        int64_t step = a.size() == 3 ? a[2] : 1;
        if (step == 0) throw Error("range() arg 3 must not be zero");
        std::vector<Value> out;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
          if (static_cast<int64_t>(out.size()) >= kMaxRange)
            throw Error(fmt::format(
                "Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).", kMaxRange));
          out.emplace_back(i);
        }
        return Value::list(std::move(out));
      });
    if (name == "strftime_now")
      return Value::callable(name, [](const CallArgs& args) {
        auto a = bind_args("strftime_now", args, {"format"});
        if (!a[0] || !a[0]->is_string()) throw Error("strftime_now() needs a format string");
        std::time_t now = std::time(nullptr);
        std::tm local{};
        localtime_r(&now, &local);
        char buf[512];
        size_t n = std::strftime(buf, sizeof(buf), a[0]->str().c_str(), &local);
        return Value(std::string(buf, n));
      });
    return Value();
  }

  int depth_ = 0;
};

}  // namespace

Template::Template(const std::string& source) : body_(parse_template(source)) {}

std::string Template::render(const Value& context) const {
  Interpreter interp;
  return interp.run(body_, context);
}

}  // namespace specula::jinja
