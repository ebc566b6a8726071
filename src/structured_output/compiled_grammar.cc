#include "structured_output/compiled_grammar.h"

namespace specula {
namespace {

// Masks kept per grammar before the cache starts over: a 150k vocabulary's mask is 19 KB, so
// this bounds a grammar's cache near 40 MB however many states a long generation visits.
constexpr size_t kMaxCachedMasks = 2048;

}  // namespace

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocabulary)
    : automaton_(std::move(grammar)), vocabulary_(std::move(vocabulary)) {}

const std::vector<uint32_t>& CompiledGrammar::token_mask(StateId state) {
  if (auto it = masks_.find(state); it != masks_.end()) {
    ++stats_.hits;
    return it->second;
  }
  ++stats_.misses;
  if (masks_.size() >= kMaxCachedMasks) masks_.clear();
  return masks_.emplace(state, compute_mask(state)).first->second;
}

std::vector<uint32_t> CompiledGrammar::compute_mask(StateId state) {
  // Tokens in byte order: prefix_states_[d] is the state after the first d bytes of the current
  // token, valid for the bytes it shares with the previous one, so each token costs only the
  // transitions of its own suffix, and a dead prefix ends every token that shares it at once.
  const TokenVocabulary& v = *vocabulary_;
  std::vector<uint32_t> mask(static_cast<size_t>(v.mask_words()), 0);
  prefix_states_.assign(1, state);
  for (size_t i = 0; i < v.num_sorted(); ++i) {
    const std::string_view bytes = v.sorted_bytes(i);
    const size_t keep = std::min<size_t>(v.shared_prefix(i), prefix_states_.size() - 1);
    prefix_states_.resize(keep + 1);
    StateId s = prefix_states_.back();
    for (size_t d = keep; d < bytes.size() && s != GrammarAutomaton::kDead; ++d) {
      s = automaton_.advance(s, static_cast<uint8_t>(bytes[d]));
      prefix_states_.push_back(s);
    }
    if (s != GrammarAutomaton::kDead) {
      const int32_t id = v.sorted_id(i);
      mask[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
    }
  }
  return mask;
}

}  // namespace specula
