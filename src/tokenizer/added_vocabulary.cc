#include "tokenizer/added_vocabulary.h"

#include <algorithm>

#include "tokenizer/normalizer.h"
#include "tokenizer/utf8.h"

namespace specula {
namespace {

// The last/first character of `s` is a word character (HF's \w$ / ^\w checks for single_word).
bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return utf8::is_word_char(utf8::next_codepoint(s, i));
}
bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = 0;
  return utf8::is_word_char(utf8::next_codepoint(s, i));
}

// Start of the whitespace run that ends `s` (s.size() when none).
size_t trailing_space_start(std::string_view s) {
  size_t start = s.size();
  while (start > 0) {
    size_t i = start - 1;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    size_t j = i;
    if (!utf8::is_white_space(utf8::next_codepoint(s, j))) break;
    start = i;
  }
  return start;
}
// Length of the whitespace run that starts `s`.
size_t leading_space_length(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!utf8::is_white_space(utf8::next_codepoint(s, j))) break;
    i = j;
  }
  return i;
}

}  // namespace

void AddedVocabulary::Matcher::insert(std::string_view pattern, int32_t id) {
  if (pattern.empty()) return;
  int32_t node = 0;
  for (unsigned char c : pattern) {
    auto& kids = nodes_[node].children;
    auto it = std::find_if(kids.begin(), kids.end(), [c](const auto& k) { return k.first == c; });
    if (it != kids.end()) {
      node = it->second;
    } else {
      const auto child = static_cast<int32_t>(nodes_.size());
      nodes_[node].children.emplace_back(c, child);  // nodes_ may reallocate below: index again
      nodes_.emplace_back();
      node = child;
    }
  }
  if (nodes_[node].id < 0) nodes_[node].id = id;  // the first token with this content wins
  first_byte_[static_cast<unsigned char>(pattern[0])] = true;
}

AddedVocabulary::Matcher::Match AddedVocabulary::Matcher::find(std::string_view text, size_t from) const {
  for (size_t s = from; s < text.size(); ++s) {
    if (!first_byte_[static_cast<unsigned char>(text[s])]) continue;
    int32_t node = 0;
    Match best;
    for (size_t i = s; i < text.size(); ++i) {
      const auto c = static_cast<unsigned char>(text[i]);
      const auto& kids = nodes_[node].children;
      auto it = std::find_if(kids.begin(), kids.end(), [c](const auto& k) { return k.first == c; });
      if (it == kids.end()) break;
      node = it->second;
      if (nodes_[node].id >= 0) best = {s, i + 1, nodes_[node].id};
    }
    if (best.start != std::string_view::npos) return best;
  }
  return {};
}

void AddedVocabulary::add(const AddedToken& token) {
  if (token.content.empty()) return;
  if (auto it = by_content_.find(token.content); it != by_content_.end()) {
    const size_t index = by_id_.at(it->second);
    by_id_.erase(it->second);
    tokens_[index] = token;
    by_id_[token.id] = index;
    it->second = token.id;
    return;
  }
  by_id_[token.id] = tokens_.size();
  by_content_.emplace(token.content, token.id);
  tokens_.push_back(token);
}

void AddedVocabulary::mark_special(int32_t id) {
  if (const auto it = by_id_.find(id); it != by_id_.end()) tokens_[it->second].special = true;
}

void AddedVocabulary::build(const Normalizer* normalizer) {
  raw_matcher_ = Matcher();
  normalized_matcher_ = Matcher();
  // HF lists special tokens before the others when building its automata; with leftmost-longest
  // matching only identical contents could be affected, and contents are unique here.
  for (const auto& t : tokens_) {
    if (t.normalized) {
      normalized_matcher_.insert(normalizer ? normalizer->normalize(t.content) : t.content, t.id);
    } else {
      raw_matcher_.insert(t.content, t.id);
    }
  }
}

const AddedToken* AddedVocabulary::by_id(int32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocabulary::token_to_id(std::string_view content) const {
  const auto it = by_content_.find(content);
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

std::optional<int32_t> AddedVocabulary::max_id() const {
  std::optional<int32_t> m;
  for (const auto& t : tokens_) m = std::max(m.value_or(t.id), t.id);
  return m;
}

void AddedVocabulary::find_matches(std::string_view sentence, const Matcher& matcher,
                                   std::vector<std::pair<int32_t, std::pair<size_t, size_t>>>& out) const {
  size_t start_offset = 0;  // end of the last piece emitted
  size_t from = 0;          // where the automaton resumes: after the previous raw match
  while (!matcher.empty()) {
    const auto m = matcher.find(sentence, from);
    if (m.start == std::string_view::npos) break;
    from = m.end;
    const AddedToken& token = *by_id(m.id);
    if (split_special_ && token.special) continue;
    size_t start = m.start, stop = m.end;
    if (token.single_word) {
      const bool space_before = start == 0 || !ends_with_word(sentence.substr(0, start));
      const bool space_after = stop == sentence.size() || !starts_with_word(sentence.substr(stop));
      if (!space_before || !space_after) continue;
    }
    if (token.lstrip) start = std::max(trailing_space_start(sentence.substr(0, start)), start_offset);
    if (token.rstrip) stop += leading_space_length(sentence.substr(stop));
    if (start_offset < start) out.push_back({-1, {start_offset, start}});
    out.push_back({token.id, {start, stop}});
    start_offset = stop;
  }
  if (start_offset != sentence.size()) out.push_back({-1, {start_offset, sentence.size()}});
}

void AddedVocabulary::extract_and_normalize(std::string_view text, const Normalizer* normalizer,
                                            std::vector<TextSegment>& out) const {
  std::vector<std::pair<int32_t, std::pair<size_t, size_t>>> raw, norm;
  find_matches(text, raw_matcher_, raw);
  for (const auto& [id, range] : raw) {
    const std::string_view piece = text.substr(range.first, range.second - range.first);
    if (piece.empty()) continue;
    if (id >= 0) {
      out.push_back({std::string(piece), id});
      continue;
    }
    const std::string normalized = normalizer ? normalizer->normalize(piece) : std::string(piece);
    norm.clear();
    find_matches(normalized, normalized_matcher_, norm);
    for (const auto& [nid, nrange] : norm) {
      if (nrange.second > nrange.first) {
        out.push_back({normalized.substr(nrange.first, nrange.second - nrange.first), nid});
      }
    }
  }
}

}  // namespace specula
