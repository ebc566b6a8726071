// Typed, error-reporting access to the keys of a JSON object read from a file (config.json,
// generation_config.json, model.safetensors.index.json). Every failure is one specula::Error that
// names the file and the key, e.g. `config.json: key 'rope_scaling.factor': expected a number,
// got string "8"`.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace specula {

// Reads and parses a JSON file; throws naming the file when it is missing, unreadable or corrupt.
nlohmann::json read_json_file(const std::filesystem::path& path);

class JsonKeys {
 public:
  // `source` names the file in messages; `prefix` is the dotted path of this object inside it
  // ("" for the top level, "rope_scaling." for a nested one).
  JsonKeys(const nlohmann::json& obj, std::string source, std::string prefix = "");

  const nlohmann::json& json() const { return *obj_; }
  const std::string& source() const { return source_; }
  // True when the key is present (even if null).
  bool has(const std::string& key) const;
  // True when the key is present and not null.
  bool has_value(const std::string& key) const;

  // Required keys: missing or null -> error.
  int64_t require_int(const std::string& key) const;
  double require_number(const std::string& key) const;
  std::string require_string(const std::string& key) const;

  // Optional keys: absent -> std::nullopt; null -> std::nullopt; wrong type -> error.
  std::optional<int64_t> get_int(const std::string& key) const;
  std::optional<double> get_number(const std::string& key) const;
  std::optional<bool> get_bool(const std::string& key) const;
  std::optional<std::string> get_string(const std::string& key) const;
  // An int or a list of ints (eos_token_id); absent/null -> empty.
  std::vector<int64_t> get_int_or_int_list(const std::string& key) const;
  // A nested object as JsonKeys (absent/null -> nullopt; not an object -> error).
  std::optional<JsonKeys> get_object(const std::string& key) const;

  // "config.json: key 'x.y': <what>" as a thrown Error.
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;

 private:
  const nlohmann::json* find(const std::string& key) const;
  int64_t as_int(const std::string& key, const nlohmann::json& v) const;
  double as_number(const std::string& key, const nlohmann::json& v) const;

  const nlohmann::json* obj_;  // not owned: the parsed document outlives its readers
  std::string source_;
  std::string prefix_;
};

// "string \"abc\"", "number 3.5", "null", ... for error messages.
std::string describe_json_value(const nlohmann::json& v);

}  // namespace specula
