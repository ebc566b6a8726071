// Added tokens (tokenizer.json "added_tokens", plus special tokens tokenizer_config.json names):
// they are cut out of the text before normalization and pre-tokenization, with HF tokenizers'
// matching rules: leftmost-longest, non-normalized tokens matched on the raw text first, then
// normalized tokens on the normalized remainder, honouring single_word, lstrip and rstrip.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe_model.h"

namespace specula {

class Normalizer;

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// A piece of the input after added-token extraction: either an added token (`id` >= 0), or
// normalized text still to be pre-tokenized and encoded by the model (`id` == -1).
struct TextSegment {
  std::string text;
  int32_t id = -1;
};

class AddedVocabulary {
 public:
  // Adds a token; a second token with the same content replaces the first (as in a tokenizer.json
  // listing it twice). Call build() after the last add().
  void add(const AddedToken& token);
  // Makes an existing token special, keeping how it is matched: transformers does this for the
  // special tokens tokenizer_config.json names (HF keeps such a token in the matcher it was in).
  void mark_special(int32_t id);
  // Builds the matchers; normalized tokens are matched in their normalized form.
  void build(const Normalizer* normalizer);
  // When true, special tokens in the text are not matched (transformers' split_special_tokens).
  void set_split_special_tokens(bool split) { split_special_ = split; }

  void extract_and_normalize(std::string_view text, const Normalizer* normalizer,
                             std::vector<TextSegment>& out) const;

  const AddedToken* by_id(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view content) const;
  bool is_special(int32_t id) const {
    const AddedToken* t = by_id(id);
    return t && t->special;
  }
  std::optional<int32_t> max_id() const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // A byte trie over token contents, answering "the longest token starting here".
  class Matcher {
   public:
    void insert(std::string_view pattern, int32_t id);
    // Leftmost-longest match starting at or after `from`: {start, end, id}, or start == npos.
    struct Match {
      size_t start = std::string_view::npos, end = 0;
      int32_t id = -1;
    };
    Match find(std::string_view text, size_t from) const;
    bool empty() const { return nodes_.size() <= 1; }

   private:
    struct Node {
      std::vector<std::pair<unsigned char, int32_t>> children;
      int32_t id = -1;
    };
    std::vector<Node> nodes_{Node{}};
    bool first_byte_[256] = {};
  };

  // Splits `sentence` into (id or -1, byte range) pieces covering it (HF find_matches).
  void find_matches(std::string_view sentence, const Matcher& matcher,
                    std::vector<std::pair<int32_t, std::pair<size_t, size_t>>>& out) const;

  std::vector<AddedToken> tokens_;  // in insertion order
  std::unordered_map<int32_t, size_t> by_id_;
  TokenIdMap by_content_;
  Matcher raw_matcher_, normalized_matcher_;
  bool split_special_ = false;
};

}  // namespace specula
