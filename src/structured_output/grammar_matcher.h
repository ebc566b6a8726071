// One sequence's place in its grammar, token by token: which tokens may come next (a bitmask for
// the sampler), accepting the sampled ones, and rolling back the drafts a verification rejected.
// End tokens (eos, stop tokens) are allowed exactly where the grammar accepts the output so far,
// and always when nothing else could follow, so that a sequence is never left with no token.
//
// A grammar that outgrows the automaton's bounds mid-output (GrammarLimitError) fails the matcher,
// not the caller: from then on it accepts any token and masks allow only end tokens, and error()
// says why, so that the engine ends that one request with the error while its batch goes on.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "structured_output/compiled_grammar.h"

namespace specula {

class GrammarMatcher {
 public:
  GrammarMatcher(std::shared_ptr<CompiledGrammar> grammar, std::vector<int32_t> end_token_ids);

  bool allows(int32_t token);
  // Advances by `token`; false (nothing changes) when the grammar forbids it.
  bool accept_token(int32_t token);
  void rollback(int num_tokens);          // undoes the last num_tokens accepted tokens
  int num_accepted() const { return static_cast<int>(states_.size()) - 1; }
  bool terminated() const { return states_.back() == kTerminated; }  // an end token was accepted
  bool accepting();                       // the output so far is a whole match
  bool failed() const { return !error_.empty(); }
  const std::string& error() const { return error_; }  // why the grammar could not be followed

  // mask.size() == vocabulary().mask_words(): the tokens allowed next.
  void fill_next_token_mask(std::span<uint32_t> mask);
  // Masks for verifying `drafts`: row j allows what may follow the first j drafts; returns how
  // many leading drafts the grammar allows. `masks` holds drafts.size() + 1 rows of mask_words():
  // past the first forbidden draft (which verification always rejects: its masked probability is
  // 0) the rows repeat the last defined one, so that every row is a mask the sampler can use. The
  // matcher is left as it was.
  int fill_draft_masks(std::span<const int32_t> drafts, std::span<uint32_t> masks);
  // How many leading drafts the grammar allows.
  int num_valid_drafts(std::span<const int32_t> drafts);
  int64_t mask_words() const { return grammar_->vocabulary().mask_words(); }

 private:
  static constexpr CompiledGrammar::StateId kTerminated = -1;
  bool is_end_token(int32_t token) const;
  void set_end_tokens(std::span<uint32_t> mask) const;
  void fail(const GrammarLimitError& e);

  std::shared_ptr<CompiledGrammar> grammar_;
  std::vector<int32_t> end_tokens_;
  std::vector<CompiledGrammar::StateId> states_;  // [0]: the start; one more per accepted token
  std::string error_;                              // set once the grammar outgrew its bounds
};

}  // namespace specula
