// tokenizer.json "model" of type BPE: vocabulary, ranked merges, and the merge loop of HF
// tokenizers (lowest rank first, leftmost first among equal ranks), including ignore_merges,
// unk_token/fuse_unk and byte_fallback.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/string_view_hash.h"

namespace specula {

using TokenIdMap = std::unordered_map<std::string, int32_t, StringViewHash, std::equal_to<>>;

// The largest token id a tokenizer may hold. Tables are indexed by id, so one corrupt id (say
// 2,000,000,000) would allocate tens of GB before anything failed; real vocabularies stay far
// below (Gemma 3's 262,144 is among the largest).
constexpr int32_t kMaxTokenId = (1 << 22) - 1;

class BpeModel {
 public:
  // `model` is tokenizer.json's "model" object; errors name `file`.
  BpeModel(const nlohmann::json& model, const std::string& file);

  // Appends the ids of one pre-token (already byte-level mapped when the pipeline is byte-level).
  void tokenize(std::string_view word, std::vector<int32_t>& ids) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // nullptr when the vocab has no such id
  int64_t vocab_size() const { return static_cast<int64_t>(vocab_.size()); }
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  void initial_symbols(std::string_view word, std::vector<int32_t>& symbols) const;
  void merge(std::vector<int32_t>& symbols) const;

  TokenIdMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  std::unordered_map<uint64_t, Merge> merges_;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  std::optional<int32_t> unk_id_;
};

}  // namespace specula
