// Typed access to the fields of an OpenAI request body. A missing or null field is "unset"
// (std::nullopt), as the OpenAI API treats null; a field of the wrong type is a 400 naming it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace specula::server::fields {

using nlohmann::json;

// The JSON type name used in error messages ("string", "number", ...).
template <class J>
std::string type_name(const J& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  return "object";
}

std::optional<double> number(const json& body, const char* key);
// Accepts integral numbers only (2.0 is fine, 2.5 and "2" are not).
std::optional<int64_t> integer(const json& body, const char* key);
std::optional<bool> boolean(const json& body, const char* key);
std::optional<std::string> string(const json& body, const char* key);
// A list of integers (token ids): every element integral and within int32.
std::optional<std::vector<int32_t>> int_list(const json& body, const char* key);
// `stop`: a string or a list of strings.
std::vector<std::string> string_or_string_list(const json& body, const char* key);
// The field when it is an object / array; nullptr when absent or null; 400 for another type.
const json* object(const json& body, const char* key);
const json* array(const json& body, const char* key);

// Converts one JSON value (already known to be a number) to int32, or 400 naming `param`.
int32_t to_token_id(const json& v, const std::string& param);

// The deepest nesting a request body may have. nlohmann's parser is iterative, but copying,
// dumping and converting a value (into the chat template's values, say) recurse once per level:
// a body nested 20,000 levels deep exhausted a worker thread's stack. Real requests (JSON
// schemas, tool definitions) stay far below this.
constexpr int kMaxJsonDepth = 128;

// Parses `text` as J (json or ordered_json). Nesting deeper than kMaxJsonDepth is a 400
// (ApiError) naming `what` ("the request body", ...); so is a syntax error, unless
// syntax_error_is_400 is false, when a discarded value comes back instead.
template <class J>
J parse_limited(const std::string& text, const char* what, bool syntax_error_is_400 = true);

}  // namespace specula::server::fields
