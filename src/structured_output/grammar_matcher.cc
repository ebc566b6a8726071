#include "structured_output/grammar_matcher.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace specula {

GrammarMatcher::GrammarMatcher(std::shared_ptr<CompiledGrammar> grammar, std::vector<int32_t> end_token_ids)
    : grammar_(std::move(grammar)), end_tokens_(std::move(end_token_ids)) {
  states_.push_back(grammar_->automaton().initial());
}

bool GrammarMatcher::is_end_token(int32_t token) const {
  return std::find(end_tokens_.begin(), end_tokens_.end(), token) != end_tokens_.end();
}

bool GrammarMatcher::accepting() {
  return !terminated() && !failed() && grammar_->automaton().accepting(states_.back());
}

void GrammarMatcher::fail(const GrammarLimitError& e) {
  if (error_.empty()) error_ = e.what();
}

bool GrammarMatcher::allows(int32_t token) {
  if (failed()) return true;
  // Past an end token (a request that ignores eos goes on) only end tokens again.
  if (terminated()) return is_end_token(token);
  GrammarAutomaton& a = grammar_->automaton();
  const CompiledGrammar::StateId s = states_.back();
  if (is_end_token(token)) return a.accepting(s) || !a.can_continue(s);
  const std::string_view bytes = grammar_->vocabulary().token_bytes(token);
  try {
    return !bytes.empty() && a.advance(s, bytes) != GrammarAutomaton::kDead;
  } catch (const GrammarLimitError& e) {
    fail(e);
    return true;
  }
}

bool GrammarMatcher::accept_token(int32_t token) {
  if (!allows(token)) return false;
  if (terminated() || failed() || is_end_token(token)) {
    states_.push_back(kTerminated);
  } else {
    states_.push_back(grammar_->automaton().advance(states_.back(), grammar_->vocabulary().token_bytes(token)));
  }
  return true;
}

void GrammarMatcher::rollback(int num_tokens) {
  SPECULA_ASSERT(num_tokens >= 0 && num_tokens <= num_accepted());
  states_.resize(states_.size() - static_cast<size_t>(num_tokens));
}

void GrammarMatcher::fill_next_token_mask(std::span<uint32_t> mask) {
  SPECULA_ASSERT(static_cast<int64_t>(mask.size()) == mask_words());
  const std::vector<uint32_t>* allowed = nullptr;
  if (!terminated() && !failed()) {
    try {
      allowed = &grammar_->token_mask(states_.back());
    } catch (const GrammarLimitError& e) {
      fail(e);
    }
  }
  // After an end token only end tokens again: a verification row past an accepted eos is sampled
  // (and then dropped by the stop check) and must have something to sample.
  if (!allowed) {
    std::fill(mask.begin(), mask.end(), 0u);
    set_end_tokens(mask);
    return;
  }
  std::memcpy(mask.data(), allowed->data(), allowed->size() * sizeof(uint32_t));
  bool any = false;
  for (uint32_t w : *allowed) any = any || w != 0;
  if (grammar_->automaton().accepting(states_.back()) || !any) set_end_tokens(mask);
}

void GrammarMatcher::set_end_tokens(std::span<uint32_t> mask) const {
  for (int32_t t : end_tokens_)
    if (t >= 0 && t < grammar_->vocabulary().size()) mask[static_cast<size_t>(t) >> 5] |= 1u << (t & 31);
}

int GrammarMatcher::num_valid_drafts(std::span<const int32_t> drafts) {
  int valid = 0;
  while (valid < static_cast<int>(drafts.size()) && accept_token(drafts[valid])) ++valid;
  rollback(valid);
  return valid;
}

int GrammarMatcher::fill_draft_masks(std::span<const int32_t> drafts, std::span<uint32_t> masks) {
  const size_t words = static_cast<size_t>(mask_words());
  SPECULA_CHECK(masks.size() == words * (drafts.size() + 1), "fill_draft_masks: {} mask words for {} drafts",
                masks.size(), drafts.size());
  auto row = [&](size_t j) { return masks.subspan(words * j, words); };
  int valid = 0;
  fill_next_token_mask(row(0));
  for (int32_t d : drafts) {
    if (!accept_token(d)) break;
    ++valid;
    fill_next_token_mask(row(static_cast<size_t>(valid)));
  }
  rollback(valid);
  for (size_t j = static_cast<size_t>(valid) + 1; j <= drafts.size(); ++j) {
    std::copy_n(row(static_cast<size_t>(valid)).begin(), words, row(j).begin());
  }
  return valid;
}

}  // namespace specula
