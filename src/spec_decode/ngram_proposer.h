// Prompt lookup (vLLM's "ngram" method): the longest suffix n-gram of the context (n from
// prompt_lookup_max down to prompt_lookup_min) that occurred earlier in prompt + output, and the
// tokens that followed its most recent earlier occurrence become the drafts. No model, no KV
// cache, no probabilities: the drafts are deterministic (q one-hot), so verification is exact
// matching against the target's own sample (rejection_sampler.h), which is lossless.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "spec_decode/proposer.h"

namespace specula {

// Up to k tokens that followed the most recent earlier occurrence of the longest suffix n-gram
// of `tokens`, min_n <= n <= max_n; empty when no suffix of at least min_n tokens recurs.
std::vector<int32_t> ngram_lookup(std::span<const int32_t> tokens, int min_n, int max_n, int k);

class NgramProposer : public Proposer {
 public:
  NgramProposer(int min_n, int max_n) : min_n_(min_n), max_n_(max_n) {}

  std::string_view method() const override { return "ngram"; }
  void propose(const ProposeBatch& batch, std::vector<std::vector<int32_t>>& drafts) override;
  // A lookup over host tokens: next to nothing beside a forward.
  double relative_step_cost() const override { return 0.01; }

 private:
  int min_n_, max_n_;
};

}  // namespace specula
