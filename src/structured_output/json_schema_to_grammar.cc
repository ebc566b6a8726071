#include "structured_output/json_schema_to_grammar.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "core/error.h"
#include "structured_output/json_string.h"
#include "structured_output/number_range.h"
#include "structured_output/regex_to_grammar.h"

namespace specula {

namespace {

using ojson = nlohmann::ordered_json;

// Keywords that would change the language and that this converter does not implement.
const std::set<std::string, std::less<>> kUnsupported = {
    "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies", "patternProperties",
    "propertyNames", "unevaluatedItems", "contains", "minContains", "maxContains", "minProperties",
    "maxProperties", "multipleOf", "$dynamicRef", "$recursiveRef"};
// Keywords that constrain a value; next to $ref / anyOf / oneOf / allOf they would have to be
// intersected with the referenced schema, which is not supported.
const std::set<std::string, std::less<>> kConstraining = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems",
    "additionalItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "$ref", "anyOf", "oneOf", "allOf"};

// Regular expressions for the formats that are asserted; other formats are annotations.
const std::map<std::string, std::string, std::less<>> kFormats = {
    {"date", "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"},
    {"time", "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
    {"date-time",
     "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)"
     "(\\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
    {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
    {"email",
     "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+)*"
     "@[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)+"},
    {"ipv4",
     "((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"},
};

std::string pointer_token(std::string_view key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

class Converter {
 public:
  Converter(const ojson& root, const JsonGrammarOptions& options) : root_(root), opt_(options) {
    SPECULA_CHECK(opt_.max_whitespace >= 0, "JSON grammar: max_whitespace must not be negative");
  }

  Grammar convert() {
    uint32_t root = b_.declare("root");
    b_.define(root, {{schema(root_, "", 0)}});
    return b_.build(root);
  }

  Grammar any_object() {
    uint32_t root = b_.add("root", {{any_object_symbol()}});
    return b_.build(root);
  }

 private:
  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw Error(fmt::format("JSON schema: {} at '{}'", what, path.empty() ? "#" : "#" + path));
  }

  std::string fresh(std::string_view base) { return std::string(base); }  // the builder makes names unique

  // ---- Formatting: whitespace and separators.
  Sequence ws() {
    if (!opt_.any_whitespace || opt_.max_whitespace == 0) return {};
    if (!ws_) {
      ByteSet space;
      for (char c : std::string_view(" \t\n\r")) space.add(static_cast<uint8_t>(c));
      ws_ = b_.repeat({b_.bytes(space)}, 0, opt_.max_whitespace, "ws");
    }
    return {*ws_};
  }
  Sequence join(std::initializer_list<Sequence> parts) {
    Sequence out;
    for (const Sequence& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  }
  Sequence item_sep() { return opt_.any_whitespace ? join({ws(), b_.literal(","), ws()}) : b_.literal(opt_.item_separator); }
  Sequence key_sep() { return opt_.any_whitespace ? join({ws(), b_.literal(":"), ws()}) : b_.literal(opt_.key_separator); }
  Sequence open(char c) { return join({b_.literal(std::string(1, c)), ws()}); }
  Sequence close(char c) { return join({ws(), b_.literal(std::string(1, c))}); }

  // ---- Values without constraints.
  Symbol any_string() {
    if (!any_string_) {
      Sequence s = b_.literal("\"");
      s.push_back(b_.star({json_any_string_char(b_)}, "string_chars"));
      s.push_back(b_.bytes(ByteSet::of('"')));
      any_string_ = GrammarBuilder::ref(b_.add("string", {s}));
    }
    return *any_string_;
  }
  Symbol any_integer() {
    if (!any_integer_) {
      Sequence s;
      s.push_back(b_.optional(b_.literal("-"), "sign"));
      s.push_back(b_.choice({b_.literal("0"), {b_.bytes(ByteSet::range('1', '9')), b_.star({b_.bytes(ByteSet::range('0', '9'))}, "digits")}}, "int_digits"));
      any_integer_ = GrammarBuilder::ref(b_.add("integer", {s}));
    }
    return *any_integer_;
  }
  Symbol any_number() {
    if (!any_number_) {
      Symbol digit = b_.bytes(ByteSet::range('0', '9'));
      Sequence s{any_integer()};
      s.push_back(b_.optional({b_.bytes(ByteSet::of('.')), b_.plus({digit}, "frac")}, "frac"));
      ByteSet e = ByteSet::of('e');
      e.add('E');
      ByteSet sign = ByteSet::of('+');
      sign.add('-');
      s.push_back(b_.optional({b_.bytes(e), b_.optional({b_.bytes(sign)}, "exp_sign"), b_.plus({digit}, "exp")}, "exp"));
      any_number_ = GrammarBuilder::ref(b_.add("number", {s}));
    }
    return *any_number_;
  }
  Symbol boolean() {
    if (!boolean_) boolean_ = b_.choice({b_.literal("true"), b_.literal("false")}, "boolean");
    return *boolean_;
  }
  Symbol null() {
    if (!null_) null_ = GrammarBuilder::ref(b_.add("null", {b_.literal("null")}));
    return *null_;
  }
  Symbol any_value() {
    if (!any_value_) {
      uint32_t value = b_.declare("value");
      any_value_ = GrammarBuilder::ref(value);
      Symbol object = any_object_symbol();
      Symbol array = GrammarBuilder::ref(b_.add(
          "array", {join({open('['), {*any_value_}, {b_.star(join({item_sep(), {*any_value_}}), "array_items")}, close(']')}),
                    join({b_.literal("["), ws(), b_.literal("]")})}));
      b_.define(value, {{object}, {array}, {any_string()}, {any_number()}, {boolean()}, {null()}});
    }
    return *any_value_;
  }
  Symbol any_object_symbol() {
    if (!any_object_) {
      uint32_t object = b_.declare("object");
      any_object_ = GrammarBuilder::ref(object);
      Symbol value = any_value();
      Sequence member = join({{any_string()}, key_sep(), {value}});
      b_.define(object, {join({open('{'), member, {b_.star(join({item_sep(), member}), "object_members")}, close('}')}),
                         join({b_.literal("{"), ws(), b_.literal("}")})});
    }
    return *any_object_;
  }

  // A JSON value exactly (const / enum), formatted as the rest of the grammar.
  Sequence literal_value(const ojson& v) {
    if (v.is_object()) {
      if (v.empty()) return join({b_.literal("{"), ws(), b_.literal("}")});
      Sequence s = open('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) s = join({s, item_sep()});
        first = false;
        s = join({s, b_.literal(ojson(it.key()).dump()), key_sep(), literal_value(it.value())});
      }
      return join({s, close('}')});
    }
    if (v.is_array()) {
      if (v.empty()) return join({b_.literal("["), ws(), b_.literal("]")});
      Sequence s = open('[');
      for (size_t i = 0; i < v.size(); ++i) s = join({s, i ? item_sep() : Sequence{}, literal_value(v[i])});
      return join({s, close(']')});
    }
    return b_.literal(v.dump());
  }

  // ---- Schemas.
  static std::vector<std::string> type_list(const ojson& t) {
    std::vector<std::string> out;
    if (t.is_string()) out.push_back(t.get<std::string>());
    if (t.is_array())
      for (const ojson& x : t)
        if (x.is_string()) out.push_back(x.get<std::string>());
    return out;
  }

  // {"type": T, "anyOf": [A, B]} (vLLM's forced tool calls, and common in client schemas) is the
  // union of each alternative restricted to T: an alternative without a type takes T, one with
  // types keeps those it shares with T, one that shares none is dropped.
  Symbol typed_union(const ojson& s, const char* combinator, const std::string& path, int depth) {
    const std::vector<std::string> outer = type_list(s["type"]);
    if (outer.empty()) fail(path + "/type", "'type' must be a string or an array of strings");
    // The type both allow, "" for none ("integer" is the meet of "integer" and "number").
    auto meet = [&](const std::string& t) -> std::string {
      for (const std::string& o : outer) {
        if (o == t) return t;
        if ((o == "number" && t == "integer") || (o == "integer" && t == "number")) return "integer";
      }
      return "";
    };
    const ojson& c = s[combinator];
    const std::string cpath = path + "/" + combinator;
    if (!c.is_array() || c.empty()) fail(cpath, fmt::format("'{}' must be a non-empty array", combinator));
    std::vector<Sequence> alts;
    for (size_t i = 0; i < c.size(); ++i) {
      ojson alt = c[i];
      if (alt.is_boolean()) alt = alt.get<bool>() ? ojson::object() : ojson();
      if (!alt.is_object()) continue;  // `false` matches nothing
      if (!alt.contains("type")) {
        alt["type"] = s["type"];
      } else {
        ojson kept = ojson::array();
        for (const std::string& t : type_list(alt["type"]))
          if (std::string m = meet(t); !m.empty()) kept.push_back(m);
        if (kept.empty()) continue;
        alt["type"] = kept.size() == 1 ? kept[0] : kept;
      }
      alts.push_back({schema(alt, cpath + "/" + std::to_string(i), depth + 1)});
    }
    if (alts.empty()) fail(cpath, fmt::format("no alternative of '{}' has the type the schema requires", combinator));
    return b_.choice(std::move(alts), fresh("any_of"));
  }

  Symbol schema(const ojson& s, const std::string& path, int depth) {
    if (depth > opt_.max_depth) fail(path, fmt::format("the schema nests deeper than {} levels", opt_.max_depth));
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(path, "the schema 'false' matches nothing");
      return any_value();
    }
    if (!s.is_object()) fail(path, "a schema must be an object or a boolean");
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (kUnsupported.count(it.key())) fail(path + "/" + pointer_token(it.key()), fmt::format("the keyword '{}' is not supported", it.key()));
    }
    if (s.contains("uniqueItems") && s["uniqueItems"] == true)
      fail(path + "/uniqueItems", "the keyword 'uniqueItems' is not supported");
    if (s.contains("unevaluatedProperties") && s["unevaluatedProperties"] != false)
      fail(path + "/unevaluatedProperties", "the keyword 'unevaluatedProperties' is only supported as false");

    for (const char* combinator : {"$ref", "anyOf", "oneOf", "allOf"}) {
      if (!s.contains(combinator)) continue;
      const bool is_union = std::string_view(combinator) == "anyOf" || std::string_view(combinator) == "oneOf";
      for (auto it = s.begin(); it != s.end(); ++it)
        if (it.key() != combinator && kConstraining.count(it.key()) && !(is_union && it.key() == "type"))
          fail(path + "/" + pointer_token(it.key()),
               fmt::format("the keyword '{}' alongside '{}' is not supported", it.key(), combinator));
      if (is_union && s.contains("type")) return typed_union(s, combinator, path, depth);
      const ojson& c = s[combinator];
      const std::string cpath = path + "/" + combinator;
      if (std::string_view(combinator) == "$ref") return ref(c, cpath, depth);
      if (!c.is_array() || c.empty()) fail(cpath, fmt::format("'{}' must be a non-empty array", combinator));
      if (std::string_view(combinator) == "allOf") {
        if (c.size() != 1) fail(cpath, "'allOf' with more than one schema is not supported");
        return schema(c[0], cpath + "/0", depth + 1);
      }
      std::vector<Sequence> alts;
      for (size_t i = 0; i < c.size(); ++i) alts.push_back({schema(c[i], cpath + "/" + std::to_string(i), depth + 1)});
      return b_.choice(std::move(alts), fresh("any_of"));
    }

    if (s.contains("const")) return b_.choice({literal_value(s["const"])}, fresh("const"));
    if (s.contains("enum")) {
      const ojson& e = s["enum"];
      if (!e.is_array() || e.empty()) fail(path + "/enum", "'enum' must be a non-empty array");
      std::vector<Sequence> alts;
      for (const ojson& v : e) alts.push_back(literal_value(v));
      return b_.choice(std::move(alts), fresh("enum"));
    }

    std::vector<std::string> types;
    if (s.contains("type")) {
      const ojson& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const ojson& x : t) {
          if (!x.is_string()) fail(path + "/type", "'type' must be a string or an array of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        fail(path + "/type", "'type' must be a string or an array of strings");
      }
    } else {
      // No type: the keywords present say which type is meant; none means any value.
      auto has = [&](std::initializer_list<const char*> keys) {
        for (const char* k : keys)
          if (s.contains(k)) return true;
        return false;
      };
      if (has({"properties", "required", "additionalProperties"})) types.push_back("object");
      if (has({"items", "prefixItems", "minItems", "maxItems"})) types.push_back("array");
      if (has({"minLength", "maxLength", "pattern"})) types.push_back("string");
      if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) types.push_back("number");
      if (types.empty()) return any_value();
    }
    std::vector<Sequence> alts;
    for (const std::string& t : types) alts.push_back({typed(s, t, path, depth)});
    return b_.choice(std::move(alts), fresh("types"));
  }

  Symbol typed(const ojson& s, const std::string& type, const std::string& path, int depth) {
    if (type == "string") return string(s, path);
    if (type == "integer") return integer(s, path);
    if (type == "number") return number(s, path);
    if (type == "boolean") return boolean();
    if (type == "null") return null();
    if (type == "object") return object(s, path, depth);
    if (type == "array") return array(s, path, depth);
    fail(path + "/type", fmt::format("unknown type '{}'", type));
  }

  Symbol ref(const ojson& r, const std::string& path, int depth) {
    if (!r.is_string()) fail(path, "'$ref' must be a string");
    const std::string target = r.get<std::string>();
    if (target.empty() || target[0] != '#') fail(path, fmt::format("only local references ('#/...') are supported, not '{}'", target));
    if (auto it = refs_.find(target); it != refs_.end()) return GrammarBuilder::ref(it->second);
    const ojson* node = nullptr;
    try {
      node = &root_.at(ojson::json_pointer(target.substr(1)));
    } catch (const std::exception&) {
      fail(path, fmt::format("the reference '{}' does not resolve", target));
    }
    std::string name = target.substr(target.rfind('/') + 1);
    uint32_t rule = b_.declare(fresh(name.empty() ? "ref" : name));
    refs_.emplace(target, rule);  // before converting: recursive references find it
    b_.define(rule, {{schema(*node, target.substr(1), depth + 1)}});
    return GrammarBuilder::ref(rule);
  }

  std::optional<int64_t> count(const ojson& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return std::nullopt;
    const ojson& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) fail(path + "/" + key, fmt::format("'{}' must be a non-negative integer", key));
    return v.get<int64_t>();
  }

  // Lower and upper repetition counts: a lower bound above the limit is an error, an upper one is
  // dropped (see the header).
  std::pair<int, std::optional<int>> bounds(const ojson& s, const char* min_key, const char* max_key, const std::string& path) {
    int64_t min = count(s, min_key, path).value_or(0);
    std::optional<int64_t> max = count(s, max_key, path);
    if (min > kMaxJsonRepeat) fail(path + "/" + min_key, fmt::format("'{}' above {} is not supported", min_key, kMaxJsonRepeat));
    if (max && *max < min) fail(path + "/" + max_key, fmt::format("'{}' is below '{}'", max_key, min_key));
    if (max && *max > kMaxJsonRepeat) max.reset();
    return {static_cast<int>(min), max ? std::optional<int>(static_cast<int>(*max)) : std::nullopt};
  }

  Symbol string(const ojson& s, const std::string& path) {
    auto [min, max] = bounds(s, "minLength", "maxLength", path);
    const bool has_length = s.contains("minLength") || s.contains("maxLength");
    std::optional<std::string> pattern;
    std::string pattern_path;
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) fail(path + "/pattern", "'pattern' must be a string");
      pattern = s["pattern"].get<std::string>();
      pattern_path = path + "/pattern";
    }
    if (s.contains("format") && s["format"].is_string()) {
      auto f = kFormats.find(s["format"].get<std::string>());
      if (f != kFormats.end()) {
        if (pattern) fail(path + "/format", "'format' together with 'pattern' is not supported");
        pattern = f->second;
        pattern_path = path + "/format";
      }
    }
    Sequence body;
    if (pattern) {
      if (has_length) fail(pattern_path, "a pattern or format together with minLength / maxLength is not supported");
      uint32_t rule = 0;
      try {
        rule = add_regex_rule(b_, *pattern, RegexTarget::kJsonStringBody, fresh("pattern"));
      } catch (const Error& e) {
        fail(pattern_path, e.what());
      }
      body = {GrammarBuilder::ref(rule)};
    } else if (!has_length) {
      return any_string();
    } else {
      Symbol c = json_any_string_char(b_);
      if (min == 0 && !max) body = {b_.star({c}, fresh("string_chars"))};
      else if (!(max && *max == 0)) body = {b_.repeat({c}, min, max, "string_chars")};
    }
    return GrammarBuilder::ref(b_.add(fresh("string"), {join({b_.literal("\""), body, b_.literal("\"")})}));
  }

  // Reads minimum / maximum / exclusive*: (value, exclusive) for each side. Draft-4 boolean
  // exclusiveMinimum / exclusiveMaximum modify minimum / maximum.
  std::pair<std::optional<NumberBound>, std::optional<NumberBound>> number_bounds(const ojson& s, const std::string& path) {
    auto read = [&](const char* inclusive, const char* exclusive) -> std::optional<NumberBound> {
      std::optional<NumberBound> best;
      auto consider = [&](NumberBound nb, bool is_min) {
        if (!best) best = nb;
        else if (is_min ? (nb.value > best->value || (nb.value == best->value && nb.exclusive)) :
                          (nb.value < best->value || (nb.value == best->value && nb.exclusive)))
          best = nb;
      };
      const bool is_min = std::string_view(inclusive) == "minimum";
      bool draft4_exclusive = s.contains(exclusive) && s[exclusive].is_boolean() && s[exclusive].get<bool>();
      if (s.contains(inclusive)) {
        if (!s[inclusive].is_number()) fail(path + "/" + inclusive, fmt::format("'{}' must be a number", inclusive));
        consider({s[inclusive].get<double>(), draft4_exclusive}, is_min);
      }
      if (s.contains(exclusive) && !s[exclusive].is_boolean()) {
        if (!s[exclusive].is_number()) fail(path + "/" + exclusive, fmt::format("'{}' must be a number", exclusive));
        consider({s[exclusive].get<double>(), true}, is_min);
      }
      if (best && !std::isfinite(best->value)) fail(path + "/" + inclusive, "bounds must be finite");
      return best;
    };
    return {read("minimum", "exclusiveMinimum"), read("maximum", "exclusiveMaximum")};
  }

  Symbol integer(const ojson& s, const std::string& path) {
    auto [lo, hi] = number_bounds(s, path);
    if (!lo && !hi) return any_integer();
    // Integer bounds, rounded inward; kept exact when the schema wrote integers.
    auto to_int = [&](const NumberBound& nb, bool is_min, const char* key) -> int64_t {
      const ojson& raw = s.contains(key) && s[key].is_number_integer() && !nb.exclusive ? s[key] : ojson();
      if (raw.is_number_unsigned() && raw.get<uint64_t>() > static_cast<uint64_t>(kMaxBoundMagnitude)) return kMaxBoundMagnitude;
      if (raw.is_number_integer()) return raw.get<int64_t>();
      double v = std::max(-1e18, std::min(1e18, nb.value));
      double r = is_min ? (nb.exclusive ? std::floor(v) + 1 : std::ceil(v)) : (nb.exclusive ? std::ceil(v) - 1 : std::floor(v));
      return static_cast<int64_t>(r);
    };
    std::optional<int64_t> l, h;
    if (lo) l = to_int(*lo, true, "minimum");
    if (hi) h = to_int(*hi, false, "maximum");
    try {
      return integer_range(b_, l, h, fresh("int_range"));
    } catch (const Error& e) {
      fail(path, e.what());
    }
  }

  Symbol number(const ojson& s, const std::string& path) {
    auto [lo, hi] = number_bounds(s, path);
    if (!lo && !hi) return any_number();
    try {
      return number_range(b_, lo, hi, fresh("num_range"));
    } catch (const Error& e) {
      fail(path, e.what());
    }
  }

  Symbol object(const ojson& s, const std::string& path, int depth) {
    struct Prop {
      Sequence pair;  // "key": value
      bool required;
    };
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) fail(path + "/required", "'required' must be an array of strings");
      for (const ojson& r : s["required"]) {
        if (!r.is_string()) fail(path + "/required", "'required' must be an array of strings");
        required.insert(r.get<std::string>());
      }
    }
    std::vector<Prop> props;
    if (s.contains("properties")) {
      const ojson& p = s["properties"];
      if (!p.is_object()) fail(path + "/properties", "'properties' must be an object");
      for (auto it = p.begin(); it != p.end(); ++it) {
        const std::string ppath = path + "/properties/" + pointer_token(it.key());
        Symbol value = schema(it.value(), ppath, depth + 1);
        props.push_back({join({b_.literal(ojson(it.key()).dump()), key_sep(), {value}}), required.count(it.key()) > 0});
        required.erase(it.key());
      }
    }
    if (!required.empty())
      fail(path + "/required", fmt::format("the required property '{}' is not in 'properties'", *required.begin()));
    std::optional<Symbol> additional;
    if (s.contains("additionalProperties")) {
      const ojson& a = s["additionalProperties"];
      if (!(a.is_boolean() && !a.get<bool>())) additional = schema(a, path + "/additionalProperties", depth + 1);
    }

    // Rest_i: properties i.. after at least one was written (each preceded by a separator).
    // First_i: the first property written is at index >= i (absent when none can be).
    const size_t n = props.size();
    std::optional<Sequence> extra_pair;
    if (additional) extra_pair = join({{any_string()}, key_sep(), {*additional}});
    Sequence rest = extra_pair ? Sequence{b_.star(join({item_sep(), *extra_pair}), fresh("extra_props"))} : Sequence{};
    std::optional<Symbol> first;
    if (extra_pair) first = GrammarBuilder::ref(b_.add(fresh("props"), {join({*extra_pair, rest})}));
    for (size_t i = n; i-- > 0;) {
      const Prop& p = props[i];
      std::vector<Sequence> first_alts{join({p.pair, rest})};
      if (!p.required && first) first_alts.push_back({*first});
      first = GrammarBuilder::ref(b_.add(fresh("props"), std::move(first_alts)));
      std::vector<Sequence> rest_alts{join({item_sep(), p.pair, rest})};
      if (!p.required) rest_alts.push_back(rest);
      rest = {GrammarBuilder::ref(b_.add(fresh("props_rest"), std::move(rest_alts)))};
    }
    const bool any_required = std::any_of(props.begin(), props.end(), [](const Prop& p) { return p.required; });
    std::vector<Sequence> alts;
    if (first) alts.push_back(join({open('{'), {*first}, close('}')}));
    if (!any_required) alts.push_back(join({b_.literal("{"), ws(), b_.literal("}")}));
    return GrammarBuilder::ref(b_.add(fresh("object"), std::move(alts)));
  }

  Symbol array(const ojson& s, const std::string& path, int depth) {
    std::vector<Symbol> prefix;
    std::optional<Symbol> item;
    const ojson* prefix_items = s.contains("prefixItems") ? &s["prefixItems"] : nullptr;
    std::string prefix_path = path + "/prefixItems";
    bool items_given = s.contains("items");
    if (items_given && s["items"].is_array()) {  // draft-7 tuple form
      if (prefix_items) fail(path + "/items", "'items' as an array together with 'prefixItems'");
      prefix_items = &s["items"];
      prefix_path = path + "/items";
      items_given = false;
      if (s.contains("additionalItems")) {
        const ojson& a = s["additionalItems"];
        if (!(a.is_boolean() && !a.get<bool>())) item = schema(a, path + "/additionalItems", depth + 1);
      }
    } else if (items_given) {
      const ojson& it = s["items"];
      if (!(it.is_boolean() && !it.get<bool>())) item = schema(it, path + "/items", depth + 1);
    }
    if (prefix_items) {
      if (!prefix_items->is_array()) fail(prefix_path, "must be an array of schemas");
      for (size_t i = 0; i < prefix_items->size(); ++i)
        prefix.push_back(schema((*prefix_items)[i], prefix_path + "/" + std::to_string(i), depth + 1));
    } else if (!items_given) {
      item = any_value();
    }
    auto [min, max] = bounds(s, "minItems", "maxItems", path);
    const int k = static_cast<int>(prefix.size());
    if (max && *max < k) fail(path + "/maxItems", "'maxItems' below the number of prefixItems is not supported");
    const int extra_min = std::max(0, min - k);
    std::optional<int> extra_max;
    if (max) extra_max = *max - k;
    if (!item) {
      if (extra_min > 0) fail(path + "/minItems", "'minItems' asks for more items than the schema allows");
      extra_max = 0;
    }
    std::vector<Sequence> alts;
    if (k > 0) {
      Sequence s_items = open('[');
      for (int i = 0; i < k; ++i) s_items = join({s_items, i ? item_sep() : Sequence{}, {prefix[i]}});
      if (!(extra_max && *extra_max == 0))
        s_items.push_back(b_.repeat(join({item_sep(), {*item}}), extra_min, extra_max, "array_items"));
      alts.push_back(join({s_items, close(']')}));
    } else {
      if (min == 0) alts.push_back(join({b_.literal("["), ws(), b_.literal("]")}));
      if (item && !(max && *max == 0)) {
        Sequence more;
        std::optional<int> more_max;
        if (max) more_max = *max - 1;
        if (!(more_max && *more_max == 0))
          more.push_back(b_.repeat(join({item_sep(), {*item}}), std::max(0, min - 1), more_max, "array_items"));
        alts.push_back(join({open('['), {*item}, more, close(']')}));
      }
    }
    return GrammarBuilder::ref(b_.add(fresh("array"), std::move(alts)));
  }

  const ojson& root_;
  JsonGrammarOptions opt_;
  GrammarBuilder b_;
  std::map<std::string, uint32_t> refs_;
  std::optional<Symbol> ws_, any_string_, any_integer_, any_number_, boolean_, null_, any_value_, any_object_;
};

}  // namespace

Grammar json_schema_to_grammar(const nlohmann::ordered_json& schema, const JsonGrammarOptions& options) {
  return Converter(schema, options).convert();
}

Grammar json_schema_to_grammar(const nlohmann::json& schema, const JsonGrammarOptions& options) {
  return json_schema_to_grammar(nlohmann::ordered_json::parse(schema.dump()), options);
}

Grammar json_schema_text_to_grammar(std::string_view schema_text, const JsonGrammarOptions& options) {
  nlohmann::ordered_json schema;
  try {
    schema = nlohmann::ordered_json::parse(schema_text);
  } catch (const std::exception& e) {
    throw Error(fmt::format("JSON schema: not valid JSON: {}", e.what()));
  }
  return json_schema_to_grammar(schema, options);
}

Grammar any_json_grammar(const JsonGrammarOptions& options) {
  nlohmann::ordered_json unused = true;
  return Converter(unused, options).any_object();
}

}  // namespace specula
