// A grammar ready to constrain one model's tokens: its automaton and, per automaton state, the
// mask of tokens whose bytes the grammar allows next. Masks are cached per state because states
// recur (inside a JSON string every character leads back to the same state), which is what makes
// a mask cost a lookup rather than a walk over the vocabulary on most steps.
//
// Shared by every request that asks for the same constraint; not thread-safe (the engine thread
// drives it, like GrammarAutomaton).
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "structured_output/grammar_automaton.h"
#include "structured_output/token_vocabulary.h"

namespace specula {

class CompiledGrammar {
 public:
  using StateId = GrammarAutomaton::StateId;

  CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocabulary);

  GrammarAutomaton& automaton() { return automaton_; }
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }
  // Bit t (word t / 32, bit t % 32) is set when token t's bytes can follow `state`. End tokens
  // are not in it (GrammarMatcher adds them where the grammar accepts).
  const std::vector<uint32_t>& token_mask(StateId state);

  struct CacheStats {
    int64_t hits = 0;
    int64_t misses = 0;
  };
  const CacheStats& cache_stats() const { return stats_; }

 private:
  std::vector<uint32_t> compute_mask(StateId state);

  GrammarAutomaton automaton_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  std::unordered_map<StateId, std::vector<uint32_t>> masks_;
  std::vector<StateId> prefix_states_;  // scratch of compute_mask
  CacheStats stats_;
};

}  // namespace specula
