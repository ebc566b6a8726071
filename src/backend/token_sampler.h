// Token sampling on the backend's device: logits rows in, one token per row out, with only the
// tokens (and the logprobs a row asks for) coming back to the host, once per call. Rows may also
// verify a speculative draft token against the draft's distribution (the rejection sampler).
//
// This is the device half of the engine's Sampler (sampling/sampler.h): the engine turns its
// per-request SamplingRows into TokenSamplingRows (computing each row's random draw `uniform`
// from the request's counter-based stream), and back. The math is the engine's
// sampling/sampling_math.h, step for step:
//   processed logits l' = raw, then masked ids -> -inf, repetition penalty (each distinct id of
//   prompt + output once: divided when positive, multiplied otherwise), frequency and presence
//   penalties (output counts: l' -= frequency * count + presence);
//   greedy: the first index of max l';
//   otherwise p = exp((l' - max l') / temperature); min_p drops p < min_p * max p; top_k keeps
//   p >= the k-th largest p (ties kept); top_p keeps the most likely tokens (ties: lower id first)
//   while the mass before them is below top_p of the remaining mass; the token is the first id
//   whose cumulative kept mass exceeds uniform * (total kept mass).
// Logprobs are those of the raw logits (log_softmax): the sampled token's value and rank (1 +
// tokens strictly more likely) and the top N, most likely first (ties: lower id first).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace specula {

struct TokenSamplingRow {
  int32_t logits_row = 0;
  bool greedy = true;
  float temperature = 1.0f;
  int32_t top_k = 0;  // <= 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  double uniform = 0.0;  // the row's draw in [0, 1)
  std::span<const int32_t> prompt_ids;  // read only when repetition_penalty != 1
  std::span<const int32_t> output_ids;  // read when any penalty is on
  std::span<const int32_t> masked_ids;  // -> -inf
  // Structured outputs: bit t (word t / 32) clear -> token t is -inf, like a masked id; empty: none.
  std::span<const uint32_t> allowed_mask;
  // Added to the logits first (logit_bias), sorted by token id.
  std::span<const std::pair<int32_t, float>> logit_bias;
  int32_t top_logprobs = -1;            // -1: no logprobs; N >= 0: the sampled token's and the top N
  // Speculative verification instead of a draw (non-greedy rows): accept draft_token x with
  // probability min(1, p(x) / q(x)) (uniform_accept * q(x) < p(x)), else draw from max(0, p - q)
  // normalised, with uniform_residual (from p when that has no mass). p is the row's final
  // distribution (as above, normalised), q = row q_row of the draft probabilities given to
  // sample(). The result's token is x when accepted, else the draw.
  int32_t draft_token = -1;  // -1: sample as above
  int32_t q_row = -1;
  double uniform_accept = 0.0;
  double uniform_residual = 0.0;
  // Non-greedy sampling rows (no draft_token): also write the row's final distribution p (as
  // above, normalised; zeros where a filter dropped a token) into row probs_out_row of the
  // probs_out given to sample(), on the device. The speculative draft keeps q this way.
  int32_t probs_out_row = -1;  // -1: do not write it
};

struct TokenLogprobEntry {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct TokenSamplingResult {
  int32_t token = 0;
  bool accepted = false;  // verification rows: the draft token was accepted
  // When logprobs were asked for (or for logprobs_of): the target token's logprob and rank, and
  // the top N entries, most likely first.
  bool has_logprobs = false;
  float logprob = 0.0f;
  int32_t rank = 0;
  std::vector<TokenLogprobEntry> top;
};

class TokenSampler {
 public:
  virtual ~TokenSampler() = default;
  // The largest N of top logprobs computed on the device; rows asking for more are the caller's
  // to compute (the engine does them on the host).
  virtual int max_top_logprobs() const = 0;
  // logits: F32 [L, V] on the device, rows.size() <= the max_rows the sampler was made for;
  // draft_probs: F32 [R, V] on the device, needed only by verification rows; probs_out: F32
  // [R', V] on the device, needed only by rows with probs_out_row >= 0 (written in stream order:
  // later work on the backend's stream sees it, the host does not need it).
  virtual std::vector<TokenSamplingResult> sample(const Tensor& logits, std::span<const TokenSamplingRow> rows,
                                                  const Tensor* draft_probs = nullptr, Tensor* probs_out = nullptr) = 0;
  // sample() in two halves, for async scheduling: start_sample() queues the work and the copy of
  // the results and returns; finish_sample() waits for them. One may be outstanding; nothing else
  // may be asked of the sampler meanwhile. This default samples at once.
  virtual void start_sample(const Tensor& logits, std::span<const TokenSamplingRow> rows,
                            const Tensor* draft_probs = nullptr, Tensor* probs_out = nullptr) {
    started_ = sample(logits, rows, draft_probs, probs_out);
  }
  virtual std::vector<TokenSamplingResult> finish_sample() { return std::move(started_); }
  // Async scheduling's token feed: between start_sample() and finish_sample(), replaces each entry
  // -(1 + i) of token_ids (I32 on the device) by row i's token, in stream order. Only where
  // can_feed_started() (the default never: its start_sample() returns the tokens to the host).
  virtual bool can_feed_started() const { return false; }
  virtual void feed_started_tokens(Tensor& token_ids) {}
  // Chained drafts: queues rows' draws (rows that only draw: no logprobs, verification, penalties,
  // masked ids, bias or allowed mask), keeping probs_out rows as sample() does, and writes row i's
  // token into tokens_out[i] (I32 on the device) in stream order. Nothing comes back to the host
  // and the call does not wait for the device, so calls can be queued back to back.
  virtual void draw_on_device(const Tensor& logits, std::span<const TokenSamplingRow> rows, Tensor* probs_out,
                              Tensor& tokens_out) = 0;
  // log_softmax of raw logits rows[i] reporting targets[i] and the top top_n (<= max_top_logprobs).
  virtual std::vector<TokenSamplingResult> logprobs_of(const Tensor& logits, std::span<const int32_t> rows,
                                                       std::span<const int32_t> targets, int top_n) = 0;
  // Device bytes the sampler holds (for the memory plan's log).
  virtual size_t device_bytes() const = 0;

 private:
  std::vector<TokenSamplingResult> started_;
};

}  // namespace specula
