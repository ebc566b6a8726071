#include "server/structured_output_fields.h"

#include <fmt/format.h>

#include "server/api_error.h"
#include "server/json_fields.h"

namespace specula::server {
namespace {

using ojson = nlohmann::ordered_json;
using Kind = StructuredOutputsParams::Kind;

const ojson* field(const ojson& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

[[noreturn]] void wrong_type(const std::string& path, const char* expected, const ojson& got) {
  throw bad_request(fmt::format("Invalid type for '{}': expected {}, got {}.", path, expected, fields::type_name(got)),
                    path);
}

const ojson& require_object(const ojson& v, const std::string& path) {
  if (!v.is_object()) wrong_type(path, "an object", v);
  return v;
}

std::string require_string(const ojson& v, const std::string& path) {
  if (!v.is_string()) wrong_type(path, "a string", v);
  return v.get<std::string>();
}

bool require_bool(const ojson& v, const std::string& path) {
  if (!v.is_boolean()) wrong_type(path, "a boolean", v);
  return v.get<bool>();
}

// A JSON schema given as an object, or as its text (vLLM takes both for json / guided_json).
std::string schema_text(const ojson& v, const std::string& path) {
  if (v.is_object()) return v.dump();
  if (v.is_string()) {
    ojson parsed = fields::parse_limited<ojson>(v.get<std::string>(), path.c_str(), false);
    if (!parsed.is_object())
      throw bad_request(fmt::format("'{}' must be a JSON schema: an object, or its JSON text.", path), path);
    return v.get<std::string>();
  }
  wrong_type(path, "a JSON schema (an object or its JSON text)", v);
}

std::vector<std::string> string_choices(const ojson& v, const std::string& path) {
  if (!v.is_array()) wrong_type(path, "an array of strings", v);
  if (v.empty()) throw bad_request(fmt::format("'{}' must hold at least one choice.", path), path);
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) out.push_back(require_string(v[i], fmt::format("{}[{}]", path, i)));
  return out;
}

StructuredOutputsParams make(Kind kind, std::string spec = {}, std::vector<std::string> choices = {}) {
  StructuredOutputsParams p;
  p.kind = kind;
  p.spec = std::move(spec);
  p.choices = std::move(choices);
  return p;
}

// The constraints found so far, with the field that set each.
struct Found {
  std::vector<std::pair<std::string, StructuredOutputsParams>> items;
  void add(std::string source, StructuredOutputsParams p) { items.emplace_back(std::move(source), std::move(p)); }
};

void parse_response_format(const ojson& body, Found* found) {
  const ojson* rf = field(body, "response_format");
  if (!rf) return;
  require_object(*rf, "response_format");
  const ojson* type = field(*rf, "type");
  if (!type) throw bad_request("Field required: 'response_format.type'.", "response_format.type");
  std::string t = require_string(*type, "response_format.type");
  if (t == "text") return;
  if (t == "json_object") {
    found->add("response_format", make(Kind::kJsonObject));
    return;
  }
  if (t == "json_schema") {
    const ojson* js = field(*rf, "json_schema");
    if (!js) throw bad_request("Field required: 'response_format.json_schema'.", "response_format.json_schema");
    require_object(*js, "response_format.json_schema");
    const ojson* name = field(*js, "name");
    if (!name) throw bad_request("Field required: 'response_format.json_schema.name'.", "response_format.json_schema.name");
    require_string(*name, "response_format.json_schema.name");
    if (const ojson* d = field(*js, "description")) require_string(*d, "response_format.json_schema.description");
    if (const ojson* s = field(*js, "strict")) require_bool(*s, "response_format.json_schema.strict");
    const ojson* schema = field(*js, "schema");
    if (!schema)
      throw bad_request("Field required: 'response_format.json_schema.schema'.", "response_format.json_schema.schema");
    require_object(*schema, "response_format.json_schema.schema");
    found->add("response_format", make(Kind::kJson, schema->dump()));
    return;
  }
  throw bad_request(fmt::format("response_format type '{}' is not supported: use 'text', 'json_object' or "
                                "'json_schema'.", t), "response_format.type");
}

void parse_structured_outputs(const ojson& body, Found* found, StructuredOutputFields* out) {
  const ojson* so = field(body, "structured_outputs");
  if (!so) return;
  require_object(*so, "structured_outputs");
  for (const auto& [key, v] : so->items()) {
    const std::string path = "structured_outputs." + key;
    if (v.is_null()) continue;
    if (key == "json") {
      found->add(path, make(Kind::kJson, schema_text(v, path)));
    } else if (key == "regex") {
      found->add(path, make(Kind::kRegex, require_string(v, path)));
    } else if (key == "choice") {
      found->add(path, make(Kind::kChoice, {}, string_choices(v, path)));
    } else if (key == "grammar") {
      found->add(path, make(Kind::kGrammar, require_string(v, path)));
    } else if (key == "json_object") {
      if (require_bool(v, path)) found->add(path, make(Kind::kJsonObject));
    } else if (key == "disable_any_whitespace") {
      out->any_whitespace = !require_bool(v, path);
    } else if (key == "whitespace_pattern" || key == "structural_tag") {
      throw bad_request(fmt::format("'{}' is not supported by this server.", path), path);
    } else if (key == "disable_additional_properties") {
      if (require_bool(v, path))
        throw bad_request(fmt::format("'{}' is not supported by this server.", path), path);
    } else if (key == "backend") {
      require_string(v, path);
      out->ignored.push_back(path);  // one grammar engine here
    } else {
      out->ignored.push_back(path);  // disable_fallback and fields of later vLLM versions
    }
  }
}

void parse_guided_fields(const ojson& body, Found* found) {
  if (const ojson* v = field(body, "guided_json")) found->add("guided_json", make(Kind::kJson, schema_text(*v, "guided_json")));
  if (const ojson* v = field(body, "guided_regex")) found->add("guided_regex", make(Kind::kRegex, require_string(*v, "guided_regex")));
  if (const ojson* v = field(body, "guided_choice"))
    found->add("guided_choice", make(Kind::kChoice, {}, string_choices(*v, "guided_choice")));
  if (const ojson* v = field(body, "guided_grammar"))
    found->add("guided_grammar", make(Kind::kGrammar, require_string(*v, "guided_grammar")));
  if (const ojson* v = field(body, "guided_whitespace_pattern")) {
    require_string(*v, "guided_whitespace_pattern");
    throw bad_request("'guided_whitespace_pattern' is not supported by this server (structured_outputs."
                      "disable_any_whitespace turns the whitespace between JSON tokens off).", "guided_whitespace_pattern");
  }
  if (const ojson* v = field(body, "guided_decoding_backend")) require_string(*v, "guided_decoding_backend");
}

}  // namespace

void throw_structured_output_conflict(const std::string& first, const std::string& second) {
  throw bad_request(fmt::format("Only one kind of structured output may be used per request, but both '{}' and '{}' "
                                "are given.", first, second), second);
}

StructuredOutputFields parse_structured_output_fields(const ojson& body) {
  StructuredOutputFields out;
  Found found;
  parse_response_format(body, &found);
  parse_structured_outputs(body, &found, &out);
  parse_guided_fields(body, &found);
  if (found.items.size() > 1) throw_structured_output_conflict(found.items[0].first, found.items[1].first);
  if (!found.items.empty()) {
    out.source = found.items[0].first;
    out.constraint = std::move(found.items[0].second);
    out.constraint->any_whitespace = out.any_whitespace;
  }
  return out;
}

}  // namespace specula::server
