// Small hand-made tokenizer.json files for the tokenizer tests: a byte-level BPE whose vocab is
// the 256 byte-level characters (ids 0..255, in byte order) plus one token per merge, written to a
// temporary folder with an optional tokenizer_config.json.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/byte_level.h"

namespace specula::testing {

// Id of a single byte in the toy vocab.
inline int32_t byte_id(unsigned char b) { return b; }

// A toy tokenizer.json: ByteLevel pre-tokenizer (GPT-2 regex, no prefix space), ByteLevel decoder,
// no normalizer, merges in rank order (given as byte-level strings, e.g. {"Ġ", "w"}).
inline nlohmann::json toy_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level::encode(std::string(1, static_cast<char>(b)))] = b;
  nlohmann::json merge_list = nlohmann::json::array();
  int32_t next = 256;
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
    merge_list.push_back(a + " " + b);
  }
  return {
      {"version", "1.0"},
      {"added_tokens", nlohmann::json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", {{"type", "ByteLevel"}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}, {"ignore_merges", false}}},
  };
}

inline nlohmann::json added_token(int32_t id, const std::string& content, bool special = true) {
  return {{"id", id},          {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},   {"normalized", false}, {"special", special}};
}

// A temporary folder holding tokenizer files; removed when it goes out of scope.
class TempTokenizerDir {
 public:
  TempTokenizerDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::path(::testing::TempDir()) /
            ("specula_tok_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempTokenizerDir() { std::filesystem::remove_all(path_); }
  TempTokenizerDir(const TempTokenizerDir&) = delete;
  TempTokenizerDir& operator=(const TempTokenizerDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
  }
  void write_json(const std::string& name, const nlohmann::json& j) const { write(name, j.dump()); }

 private:
  std::filesystem::path path_;
};

}  // namespace specula::testing
