#include "tokenizer/tokenizer_config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace specula {
namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  SPECULA_CHECK(in.good(), "{}: cannot open", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A special token is written either as a string or as an AddedToken object {"content": ...}.
std::optional<AddedToken> parse_token(const nlohmann::json& v, const std::string& key, const std::string& file) {
  if (v.is_null()) return std::nullopt;
  AddedToken t;
  t.special = true;
  t.normalized = false;  // transformers' AddedToken default for special tokens
  if (v.is_string()) {
    t.content = v.get<std::string>();
  } else if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    t.content = v["content"].get<std::string>();
    t.single_word = v.value("single_word", false);
    t.lstrip = v.value("lstrip", false);
    t.rstrip = v.value("rstrip", false);
    t.normalized = v.value("normalized", false);
  } else {
    throw Error(fmt::format("{}: {}: expected a string or an object with \"content\"", file, key));
  }
  if (t.content.empty()) return std::nullopt;
  return t;
}

std::optional<bool> optional_bool(const nlohmann::json& cfg, const char* key, const std::string& file) {
  if (!cfg.contains(key) || cfg[key].is_null()) return std::nullopt;
  SPECULA_CHECK(cfg[key].is_boolean(), "{}: {}: expected true or false", file, key);
  return cfg[key].get<bool>();
}

std::string chat_template_from(const nlohmann::json& v, const std::string& file) {
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  // Older multi-template form: [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
  SPECULA_CHECK(v.is_array(), "{}: chat_template: expected a string or a list of named templates", file);
  for (const auto& t : v) {
    if (t.is_object() && t.value("name", std::string()) == "default" && t.contains("template")) {
      return t["template"].get<std::string>();
    }
  }
  return "";
}

}  // namespace

TokenizerConfig load_tokenizer_config(const std::filesystem::path& dir) {
  TokenizerConfig config;
  const auto path = dir / "tokenizer_config.json";
  const std::string file = path.string();
  if (std::filesystem::exists(path)) {
    nlohmann::json cfg;
    try {
      cfg = nlohmann::json::parse(read_file(path));
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("{}: invalid JSON: {}", file, e.what()));
    }
    SPECULA_CHECK(cfg.is_object(), "{}: expected a JSON object", file);
    try {
      auto named = [&](const char* key) -> std::optional<AddedToken> {
        if (!cfg.contains(key)) return std::nullopt;
        auto t = parse_token(cfg[key], key, file);
        if (t) config.special_tokens.push_back(*t);
        return t;
      };
      config.bos_token = named("bos_token");
      config.eos_token = named("eos_token");
      for (const char* key : {"unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) named(key);
      // A list of tokens, or (transformers 5) a map from attribute name to token.
      for (const char* key : {"additional_special_tokens", "extra_special_tokens"}) {
        if (!cfg.contains(key) || !(cfg[key].is_array() || cfg[key].is_object())) continue;
        for (const auto& v : cfg[key]) {
          if (auto t = parse_token(v, key, file)) config.special_tokens.push_back(*t);
        }
      }
      if (cfg.contains("added_tokens_decoder") && cfg["added_tokens_decoder"].is_object()) {
        for (const auto& [id, v] : cfg["added_tokens_decoder"].items()) {
          const std::string key = "added_tokens_decoder." + id;
          auto t = parse_token(v, key, file);
          if (!t) continue;
          t->special = v.is_object() && v.value("special", false);
          try {
            t->id = std::stoi(id);
          } catch (const std::exception&) {
            throw Error(fmt::format("{}: {}: the key is not a token id", file, key));
          }
          config.added_tokens.push_back(*t);
        }
        std::sort(config.added_tokens.begin(), config.added_tokens.end(),
                  [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });  // JSON keys sort as text
      }
      config.add_bos_token = optional_bool(cfg, "add_bos_token", file);
      config.add_eos_token = optional_bool(cfg, "add_eos_token", file);
      config.split_special_tokens = optional_bool(cfg, "split_special_tokens", file).value_or(false);
      if (cfg.contains("chat_template")) config.chat_template = chat_template_from(cfg["chat_template"], file);
      if (cfg.contains("tokenizer_class") && cfg["tokenizer_class"].is_string()) {
        config.tokenizer_class = cfg["tokenizer_class"].get<std::string>();
      }
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("{}: {}", file, e.what()));
    }
  }
  const auto jinja = dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja)) config.chat_template = read_file(jinja);
  return config;
}

}  // namespace specula
