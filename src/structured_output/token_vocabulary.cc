#include "structured_output/token_vocabulary.h"

#include <algorithm>

#include "tokenizer/tokenizer.h"

namespace specula {

TokenVocabulary::TokenVocabulary(const Tokenizer& tokenizer, int64_t size) : size_(size) {
  std::vector<std::pair<std::string, int32_t>> tokens;
  const int64_t n = std::min<int64_t>(size, tokenizer.vocab_size());
  tokens.reserve(n);
  for (int32_t id = 0; id < n; ++id) {
    if (tokenizer.is_special(id)) continue;
    std::string bytes = tokenizer.token_bytes(id);
    if (!bytes.empty()) tokens.emplace_back(std::move(bytes), id);
  }
  index(std::move(tokens));
}

TokenVocabulary::TokenVocabulary(const std::vector<std::optional<std::string>>& tokens)
    : size_(static_cast<int64_t>(tokens.size())) {
  std::vector<std::pair<std::string, int32_t>> list;
  for (size_t id = 0; id < tokens.size(); ++id)
    if (tokens[id] && !tokens[id]->empty()) list.emplace_back(*tokens[id], static_cast<int32_t>(id));
  index(std::move(list));
}

void TokenVocabulary::index(std::vector<std::pair<std::string, int32_t>> tokens) {
  std::sort(tokens.begin(), tokens.end());
  rank_of_id_.assign(size_, -1);
  offsets_.push_back(0);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& t = tokens[i].first;
    uint32_t shared = 0;
    if (i > 0) {
      const std::string& prev = tokens[i - 1].first;
      while (shared < t.size() && shared < prev.size() && t[shared] == prev[shared]) ++shared;
    }
    shared_prefix_.push_back(shared);
    sorted_ids_.push_back(tokens[i].second);
    rank_of_id_[tokens[i].second] = static_cast<int32_t>(i);
    bytes_ += t;
    offsets_.push_back(static_cast<uint32_t>(bytes_.size()));
  }
}

std::string_view TokenVocabulary::token_bytes(int32_t id) const {
  if (id < 0 || id >= size_ || rank_of_id_[id] < 0) return {};
  return sorted_bytes(rank_of_id_[id]);
}

}  // namespace specula
