// The vocabulary as a grammar sees it: each token's bytes, sorted so that tokens sharing a prefix
// sit together. A token mask then walks the sorted list once, re-using the automaton states of the
// prefix a token shares with the one before it (a trie walk without building the trie).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace specula {

class Tokenizer;

class TokenVocabulary {
 public:
  // `size` is the model's logits width (>= the tokenizer's ids; ids past them are never allowed).
  // Special tokens (is_special) are never allowed by a grammar; end tokens are added by the matcher.
  TokenVocabulary(const Tokenizer& tokenizer, int64_t size);
  // For tests: token id i has bytes tokens[i]; nullopt or "" marks a token no grammar allows.
  explicit TokenVocabulary(const std::vector<std::optional<std::string>>& tokens);

  int64_t size() const { return size_; }
  int64_t mask_words() const { return (size_ + 31) / 32; }  // a mask is one bit a token in uint32 words
  size_t num_sorted() const { return sorted_ids_.size(); }
  int32_t sorted_id(size_t i) const { return sorted_ids_[i]; }
  std::string_view sorted_bytes(size_t i) const {
    return std::string_view(bytes_).substr(offsets_[i], offsets_[i + 1] - offsets_[i]);
  }
  // Bytes entry i shares with entry i - 1 (0 for the first).
  uint32_t shared_prefix(size_t i) const { return shared_prefix_[i]; }
  // The bytes of token `id` ("" for one no grammar allows).
  std::string_view token_bytes(int32_t id) const;

 private:
  void index(std::vector<std::pair<std::string, int32_t>> tokens);

  int64_t size_ = 0;
  std::string bytes_;  // all sorted tokens' bytes, back to back
  std::vector<uint32_t> offsets_;
  std::vector<int32_t> sorted_ids_;
  std::vector<uint32_t> shared_prefix_;
  std::vector<int32_t> rank_of_id_;  // id -> sorted index, -1 when not allowed
};

}  // namespace specula
