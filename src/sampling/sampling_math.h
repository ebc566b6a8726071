// The per-row math of sampling, on host fp32 vectors. `logits_to_probs` is THE definition of the
// distribution a request's next token is drawn from; the rejection sampler of speculative decoding
// reuses it for target and draft distributions so that verification stays lossless.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/counter_draw.h"  // uniform_draw
#include "sampling/logprobs.h"
#include "sampling/sampler.h"

namespace specula {

// In vLLM's order: logit_bias, min_tokens masking, then repetition (prompt + output), frequency
// and presence (output) penalties. In place on raw logits.
void apply_penalties(std::span<float> logits, const SamplingRow& row);

// The distribution to draw from, in place: penalties, then for greedy rows a one-hot at the
// argmax; otherwise temperature, softmax, min_p (relative to the most likely token), top_k (ties
// at the k-th value kept), top_p (smallest set of most likely tokens reaching p), renormalised.
void logits_to_probs(std::span<float> logits, const SamplingRow& row);

// First index of the maximum.
int32_t argmax(std::span<const float> values);
// Inverse CDF over token ids in order: the first token whose cumulative probability exceeds u.
int32_t sample_from_probs(std::span<const float> probs, double u);

// log_softmax of raw logits: the target's logprob and rank (1 + tokens strictly more likely) and
// the top_n tokens (-1: every token), most likely first (ties: lower id first).
PositionLogprobs compute_logprobs(std::span<const float> raw_logits, int32_t target, int top_n);

}  // namespace specula
