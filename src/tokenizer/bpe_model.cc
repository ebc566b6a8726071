#include "tokenizer/bpe_model.h"

#include <queue>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace specula {
namespace {

// The two halves of a merge rule, given as "a b" (older files) or ["a", "b"] (newer files).
std::pair<std::string, std::string> parse_merge(const nlohmann::json& m, size_t index, const std::string& file) {
  if (m.is_string()) {
    const auto& s = m.get_ref<const std::string&>();
    const size_t space = s.find(' ');
    SPECULA_CHECK(space != std::string::npos && s.find(' ', space + 1) == std::string::npos,
                  "{}: model.merges[{}]: {:?} is not two tokens separated by one space", file, index, s);
    return {s.substr(0, space), s.substr(space + 1)};
  }
  SPECULA_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                "{}: model.merges[{}]: expected \"a b\" or [\"a\", \"b\"]", file, index);
  return {m[0].get<std::string>(), m[1].get<std::string>()};
}

bool is_unset_string(const nlohmann::json& model, const char* key) {
  return !model.contains(key) || model[key].is_null() ||
         (model[key].is_string() && model[key].get_ref<const std::string&>().empty());
}

}  // namespace

BpeModel::BpeModel(const nlohmann::json& model, const std::string& file) {
  SPECULA_CHECK(model.contains("vocab") && model["vocab"].is_object(), "{}: model.vocab: expected an object", file);
  SPECULA_CHECK(model.contains("merges") && model["merges"].is_array(), "{}: model.merges: expected an array", file);
  // Word-boundary markers are for non-byte-level BPEs (e.g. old subword-nmt models); refusing them
  // is better than silently producing different ids.
  SPECULA_CHECK(is_unset_string(model, "continuing_subword_prefix"),
                "{}: model.continuing_subword_prefix is not supported", file);
  SPECULA_CHECK(is_unset_string(model, "end_of_word_suffix"), "{}: model.end_of_word_suffix is not supported", file);
  if (model.contains("dropout") && !model["dropout"].is_null()) {
    SPECULA_CHECK(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0,
                  "{}: model.dropout is not supported (BPE dropout is random; inference needs determinism)", file);
  }
  ignore_merges_ = model.value("ignore_merges", false);
  byte_fallback_ = model.value("byte_fallback", false);
  fuse_unk_ = model.value("fuse_unk", false);

  const auto& vocab = model["vocab"];
  vocab_.reserve(vocab.size());
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    SPECULA_CHECK(it.value().is_number_integer() && it.value().get<int64_t>() >= 0,
                  "{}: model.vocab[{:?}]: expected a non-negative integer id", file, it.key());
    SPECULA_CHECK(it.value().get<int64_t>() <= kMaxTokenId,
                  "{}: model.vocab[{:?}]: id {} is above the largest supported, {} (corrupt file?)", file, it.key(),
                  it.value().get<int64_t>(), kMaxTokenId);
    const auto id = static_cast<int32_t>(it.value().get<int64_t>());
    vocab_.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }
  id_to_token_.resize(static_cast<size_t>(max_id + 1));
  has_id_.resize(static_cast<size_t>(max_id + 1));
  for (const auto& [token, id] : vocab_) {
    id_to_token_[id] = token;
    has_id_[id] = true;
  }

  if (!is_unset_string(model, "unk_token")) {
    const auto& unk = model["unk_token"].get_ref<const std::string&>();
    unk_id_ = token_to_id(unk);
    SPECULA_CHECK(unk_id_.has_value(), "{}: model.unk_token {:?} is not in the vocab", file, unk);
  }

  const auto& merges = model["merges"];
  merges_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto [a, b] = parse_merge(merges[i], i, file);
    const auto left = token_to_id(a), right = token_to_id(b), merged = token_to_id(a + b);
    SPECULA_CHECK(left && right, "{}: model.merges[{}]: token {:?} is not in the vocab", file, i, left ? b : a);
    SPECULA_CHECK(merged, "{}: model.merges[{}]: merged token {:?} is not in the vocab", file, i, a + b);
    // A repeated pair takes its last rank, as HF's HashMap collect does.
    merges_[pair_key(*left, *right)] = Merge{static_cast<int32_t>(i), *merged};
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>& symbols) const {
  std::optional<int32_t> pending_unk;  // an unknown run not yet emitted (fused when fuse_unk)
  for (size_t i = 0; i < word.size();) {
    const size_t len = std::max<size_t>(1, utf8::valid_sequence_length(word, i));
    const std::string_view ch = word.substr(i, len);
    i += len;
    if (const auto id = token_to_id(ch)) {
      if (pending_unk) symbols.push_back(*std::exchange(pending_unk, std::nullopt));
      symbols.push_back(*id);
      continue;
    }
    if (byte_fallback_) {  // one <0xXX> token per byte, if the vocab has all of them
      std::vector<int32_t> bytes;
      for (unsigned char b : ch) {
        if (const auto id = token_to_id(fmt::format("<0x{:02X}>", b))) bytes.push_back(*id);
      }
      if (bytes.size() == ch.size()) {
        symbols.insert(symbols.end(), bytes.begin(), bytes.end());
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk && !fuse_unk_) symbols.push_back(*pending_unk);
      pending_unk = unk_id_;
    }
    // Without an unk token an unknown character produces nothing, as in HF.
  }
  if (pending_unk) symbols.push_back(*pending_unk);
}

void BpeModel::merge(std::vector<int32_t>& ids) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // neighbours in the linked list; -1 at the ends
    bool alive;
  };
  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator<(const Candidate& o) const {  // priority_queue pops the largest: invert
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  const auto n = static_cast<int32_t>(ids.size());
  std::vector<Symbol> sym(ids.size());
  for (int32_t i = 0; i < n; ++i) sym[i] = {ids[i], i - 1, i + 1 < n ? i + 1 : -1, true};
  std::priority_queue<Candidate> queue;
  auto push_pair = [&](int32_t pos) {
    const int32_t next = sym[pos].next;
    if (next < 0) return;
    const auto it = merges_.find(pair_key(sym[pos].id, sym[next].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.new_id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& cur = sym[top.pos];
    if (!cur.alive || cur.next < 0) continue;
    // Stale entry: the pair at this position changed since it was queued.
    const auto it = merges_.find(pair_key(cur.id, sym[cur.next].id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    Symbol& right = sym[cur.next];
    cur.id = top.new_id;
    right.alive = false;
    cur.next = right.next;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    if (cur.prev >= 0) push_pair(cur.prev);
    push_pair(top.pos);
  }
  ids.clear();
  for (int32_t i = 0; i < n; ++i) {
    if (sym[i].alive) ids.push_back(sym[i].id);
  }
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {  // a pre-token that is a whole vocab entry is emitted as is
    if (const auto id = token_to_id(word)) {
      ids.push_back(*id);
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  initial_symbols(word, symbols);
  merge(symbols);
  ids.insert(ids.end(), symbols.begin(), symbols.end());
}

}  // namespace specula
