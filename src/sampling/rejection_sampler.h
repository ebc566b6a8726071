// Verification of draft tokens against the target's logits, lossless (rejection_math.h): the
// accepted drafts plus one token from the target (the replacement of the first rejected draft, or
// the bonus token after all k). p and q are each request's FINAL distributions: logits_to_probs
// with the request's temperature, top-k/top-p/min-p, penalties and min_tokens mask, applied to the
// target here exactly as the proposer applied them to the draft. Draws are keyed by (the
// sequence's seed, position), so a request's result does not depend on the rest of the batch.
//
// The interface is what the model runner calls; the CPU implementation is below and a device one
// can satisfy the same contract (the draft probabilities already live in a backend Tensor).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"
#include "sampling/logprobs.h"
#include "sampling/sampler.h"

namespace specula {

struct VerifyRequest {
  // k + 1 rows of the target logits: the positions of drafts 1..k, then the bonus position. Each
  // row's output_token_ids already include the drafts before it, its position is that of the
  // token it samples, and its logprobs setting asks for logprobs of the tokens returned.
  std::span<const SamplingRow> rows;
  std::span<const int32_t> draft_tokens;  // k
  // First of the k rows of `draft_probs` holding q for drafts 1..k; -1: deterministic drafts (q
  // one-hot at the draft, e.g. ngram).
  int draft_probs_row = -1;
};

struct VerifyResult {
  std::vector<int32_t> tokens;              // accepted drafts, then one token from the target
  std::vector<PositionLogprobs> logprobs;   // one per token (raw target logprobs) when asked
};

class RejectionSampler {
 public:
  virtual ~RejectionSampler() = default;
  // target_logits: F32 [L, V] on the backend's device. draft_probs: F32 [R, V] on the device, or
  // null when no request has stochastic drafts.
  virtual std::vector<VerifyResult> verify(const Tensor& target_logits, const Tensor* draft_probs,
                                           std::span<const VerifyRequest> requests) = 0;

  // verify() in two halves, for speculative decoding's launch-ahead (async scheduling, engine/
  // README.md): start_verify() queues the verification and returns; feed_verified_tokens() then
  // replaces each entry -(1 + r) of token_ids (I32 on the backend's device) by the token of row r
  // (every request's k + 1 rows in order; past a request's first rejected draft, any token) in
  // stream order, or returns false when it cannot (the start ran as several launches whose
  // tokens are on the host); finish_verify() waits and returns what verify() would. Only where
  // can_start_verify(requests); one start may be outstanding. The default verifies at once and
  // feeds host memory, which is what the CPU backend's sampler does.
  virtual bool can_start_verify(std::span<const VerifyRequest> requests) const { return false; }
  virtual void start_verify(const Tensor& target_logits, const Tensor* draft_probs,
                            std::span<const VerifyRequest> requests);
  virtual bool feed_verified_tokens(Tensor& token_ids);
  virtual std::vector<VerifyResult> finish_verify() { return std::move(started_); }

 private:
  std::vector<VerifyResult> started_;
  std::vector<int> started_rows_;  // rows of each started request
};

// Reads the rows it needs back to the host (when they live on a device) and verifies row by row.
std::unique_ptr<RejectionSampler> make_cpu_rejection_sampler(Backend& backend);

}  // namespace specula
