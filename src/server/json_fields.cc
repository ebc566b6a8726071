#include "server/json_fields.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "server/api_error.h"

namespace specula::server::fields {
namespace {

const json* find(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

[[noreturn]] void wrong_type(const char* key, const char* expected, const json& got) {
  throw bad_request(fmt::format("Invalid type for '{}': expected {}, got {}.", key, expected, type_name(got)), key);
}

bool integral(const json& v) {
  if (v.is_number_integer()) return true;
  if (!v.is_number_float()) return false;
  double d = v.get<double>();
  return std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.2e18;
}

int64_t as_int64(const json& v) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    return u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max()
                                                                         : static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return static_cast<int64_t>(v.get<double>());
}

}  // namespace

std::optional<double> number(const json& body, const char* key) {
  const json* v = find(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(key, "a number", *v);
  return v->get<double>();
}

std::optional<int64_t> integer(const json& body, const char* key) {
  const json* v = find(body, key);
  if (!v) return std::nullopt;
  if (!integral(*v)) wrong_type(key, "an integer", *v);
  return as_int64(*v);
}

std::optional<bool> boolean(const json& body, const char* key) {
  const json* v = find(body, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(key, "a boolean", *v);
  return v->get<bool>();
}

std::optional<std::string> string(const json& body, const char* key) {
  const json* v = find(body, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) wrong_type(key, "a string", *v);
  return v->get<std::string>();
}

int32_t to_token_id(const json& v, const std::string& param) {
  if (!integral(v)) {
    throw bad_request(fmt::format("Invalid type for '{}': expected a list of integers, got an element of type {}.",
                                  param, type_name(v)), param);
  }
  int64_t id = as_int64(v);
  if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
    throw bad_request(fmt::format("Invalid token id {} in '{}': token ids are non-negative 32-bit integers.", id, param),
                      param);
  }
  return static_cast<int32_t>(id);
}

std::optional<std::vector<int32_t>> int_list(const json& body, const char* key) {
  const json* v = find(body, key);
  if (!v) return std::nullopt;
  if (!v->is_array()) wrong_type(key, "a list of integers", *v);
  std::vector<int32_t> out;
  out.reserve(v->size());
  for (const auto& e : *v) out.push_back(to_token_id(e, key));
  return out;
}

std::vector<std::string> string_or_string_list(const json& body, const char* key) {
  const json* v = find(body, key);
  if (!v) return {};
  if (v->is_string()) return {v->get<std::string>()};
  if (!v->is_array()) wrong_type(key, "a string or a list of strings", *v);
  std::vector<std::string> out;
  for (const auto& e : *v) {
    if (!e.is_string()) wrong_type(key, "a string or a list of strings", e);
    out.push_back(e.get<std::string>());
  }
  return out;
}

const json* object(const json& body, const char* key) {
  const json* v = find(body, key);
  if (v && !v->is_object()) wrong_type(key, "an object", *v);
  return v;
}

const json* array(const json& body, const char* key) {
  const json* v = find(body, key);
  if (v && !v->is_array()) wrong_type(key, "an array", *v);
  return v;
}

template <class J>
J parse_limited(const std::string& text, const char* what, bool syntax_error_is_400) {
  bool too_deep = false;
  // The callback sees every value with its depth as the parser enters it; stopping at the first
  // one too deep keeps the partial value shallow too.
  auto depth_guard = [&too_deep, what](int depth, typename J::parse_event_t, J&) {
    if (depth > kMaxJsonDepth) too_deep = true;
    if (too_deep) throw bad_request(fmt::format("{} is nested deeper than {} levels.", what, kMaxJsonDepth));
    return true;
  };
  try {
    return J::parse(text, depth_guard);
  } catch (const typename J::exception& e) {
    // parse_error for bad syntax; out_of_range for a number no double holds (1e400), which the
    // parser reports as its own exception type (found by tests/fuzz: it escaped as a 500).
    if (!syntax_error_is_400) return J(J::value_t::discarded);
    // The decoder's message names the byte position, so the client can find the mistake.
    throw bad_request(fmt::format("Invalid JSON in {}: {}", what, e.what()));
  }
}

template json parse_limited<json>(const std::string&, const char*, bool);
template nlohmann::ordered_json parse_limited<nlohmann::ordered_json>(const std::string&, const char*, bool);

}  // namespace specula::server::fields
