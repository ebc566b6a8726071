#include "model/config_json.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace specula {

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::error_code ec;
  SPECULA_CHECK(std::filesystem::exists(path, ec), "{}: file not found", path.string());
  SPECULA_CHECK(std::filesystem::is_regular_file(path, ec), "{}: not a regular file", path.string());
  std::ifstream in(path, std::ios::binary);
  SPECULA_CHECK(in.good(), "{}: cannot open for reading", path.string());
  std::stringstream buf;
  buf << in.rdbuf();
  std::string text = buf.str();
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 3, column 5: ..."; keep
    // the human part only so the message stays one readable line.
    std::string what = e.what();
    auto pos = what.find("] ");
    if (pos != std::string::npos) what = what.substr(pos + 2);
    throw Error(fmt::format("{}: invalid JSON ({})", path.string(), what));
  }
}

std::string describe_json_value(const nlohmann::json& v) {
  std::string dumped = v.dump();
  if (dumped.size() > 60) dumped = dumped.substr(0, 57) + "...";
  switch (v.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::boolean: return "boolean " + dumped;
    case nlohmann::json::value_t::string: return "string " + dumped;
    case nlohmann::json::value_t::array: return "list " + dumped;
    case nlohmann::json::value_t::object: return "object " + dumped;
    default: return "number " + dumped;
  }
}

JsonKeys::JsonKeys(const nlohmann::json& obj, std::string source, std::string prefix)
    : obj_(&obj), source_(std::move(source)), prefix_(std::move(prefix)) {
  if (!obj_->is_object()) {
    if (prefix_.empty()) throw Error(fmt::format("{}: expected a JSON object, got {}", source_, describe_json_value(*obj_)));
    std::string key = prefix_.substr(0, prefix_.size() - 1);
    throw Error(fmt::format("{}: key '{}': expected an object, got {}", source_, key, describe_json_value(*obj_)));
  }
}

void JsonKeys::fail(const std::string& key, const std::string& what) const {
  throw Error(fmt::format("{}: key '{}{}': {}", source_, prefix_, key, what));
}

const nlohmann::json* JsonKeys::find(const std::string& key) const {
  auto it = obj_->find(key);
  return it == obj_->end() ? nullptr : &*it;
}

bool JsonKeys::has(const std::string& key) const { return find(key) != nullptr; }

bool JsonKeys::has_value(const std::string& key) const {
  const auto* v = find(key);
  return v != nullptr && !v->is_null();
}

int64_t JsonKeys::as_int(const std::string& key, const nlohmann::json& v) const {
  if (v.is_number_integer()) return v.get<int64_t>();
  // Some writers store integral values as floats (4096.0); accept those, reject 4096.5.
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
  }
  fail(key, "expected an integer, got " + describe_json_value(v));
}

double JsonKeys::as_number(const std::string& key, const nlohmann::json& v) const {
  if (v.is_number()) return v.get<double>();
  fail(key, "expected a number, got " + describe_json_value(v));
}

int64_t JsonKeys::require_int(const std::string& key) const {
  const auto* v = find(key);
  if (v == nullptr) fail(key, "missing required key");
  if (v->is_null()) fail(key, "required key is null");
  return as_int(key, *v);
}

double JsonKeys::require_number(const std::string& key) const {
  const auto* v = find(key);
  if (v == nullptr) fail(key, "missing required key");
  if (v->is_null()) fail(key, "required key is null");
  return as_number(key, *v);
}

std::string JsonKeys::require_string(const std::string& key) const {
  auto s = get_string(key);
  if (!s) fail(key, has(key) ? "required key is null" : "missing required key");
  return *s;
}

std::optional<int64_t> JsonKeys::get_int(const std::string& key) const {
  const auto* v = find(key);
  if (v == nullptr || v->is_null()) return std::nullopt;
  return as_int(key, *v);
}

std::optional<double> JsonKeys::get_number(const std::string& key) const {
  const auto* v = find(key);
  if (v == nullptr || v->is_null()) return std::nullopt;
  return as_number(key, *v);
}

std::optional<bool> JsonKeys::get_bool(const std::string& key) const {
  const auto* v = find(key);
  if (v == nullptr || v->is_null()) return std::nullopt;
  if (!v->is_boolean()) fail(key, "expected true or false, got " + describe_json_value(*v));
  return v->get<bool>();
}

std::optional<std::string> JsonKeys::get_string(const std::string& key) const {
  const auto* v = find(key);
  if (v == nullptr || v->is_null()) return std::nullopt;
  if (!v->is_string()) fail(key, "expected a string, got " + describe_json_value(*v));
  return v->get<std::string>();
}

std::vector<int64_t> JsonKeys::get_int_or_int_list(const std::string& key) const {
  const auto* v = find(key);
  if (v == nullptr || v->is_null()) return {};
  if (!v->is_array()) return {as_int(key, *v)};
  std::vector<int64_t> out;
  for (size_t i = 0; i < v->size(); ++i) {
    const auto& e = (*v)[i];
    if (!e.is_number_integer()) {
      fail(key, fmt::format("expected an integer or a list of integers, element {} is {}", i,
                            describe_json_value(e)));
    }
    out.push_back(e.get<int64_t>());
  }
  return out;
}

std::optional<JsonKeys> JsonKeys::get_object(const std::string& key) const {
  const auto* v = find(key);
  if (v == nullptr || v->is_null()) return std::nullopt;
  if (!v->is_object()) fail(key, "expected an object, got " + describe_json_value(*v));
  return JsonKeys(*v, source_, prefix_ + key + ".");
}

}  // namespace specula
