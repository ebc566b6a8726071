// Turning logits into tokens. The Sampler interface is what the model runner calls; the CPU
// implementation lives in cpu_sampler.cc and a CUDA one can satisfy the same interface later.
// Everything a row needs travels in SamplingRow, so a row's result depends on nothing else in the
// batch: random draws come from a counter-based stream keyed by (the sequence's seed, the position
// of the token being sampled), which makes seeded requests reproducible whatever they share the
// batch with, and even across preemption and recomputation.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"
#include "sampling/logprobs.h"
#include "sampling/sampling_params.h"

namespace specula {

struct SamplingRow {
  int logits_row = 0;                        // row of the [L, V] logits
  const SamplingParams* params = nullptr;
  uint64_t seed = 0;                         // the sequence's RNG stream
  int64_t position = 0;                      // position of the token being sampled (the RNG counter)
  std::span<const int32_t> prompt_token_ids; // repetition penalty looks at prompt + output
  std::span<const int32_t> output_token_ids; // generated so far (for a verified draft: drafts before it)
  std::span<const int32_t> masked_token_ids; // eos/stop ids while min_tokens is not reached
  // Structured outputs: bit t (word t / 32) set = token t allowed; empty = no constraint.
  std::span<const uint32_t> allowed_token_mask;
  // Logprobs wanted: the sampled token's and the top N (N = -1: the whole vocabulary, as vLLM).
  std::optional<int> logprobs;
};

struct SampledToken {
  int32_t token = 0;
  std::optional<PositionLogprobs> logprobs;
};

class Sampler {
 public:
  virtual ~Sampler() = default;
  // logits: F32 [L, V] on the backend's device; one result per row.
  virtual std::vector<SampledToken> sample(const Tensor& logits, std::span<const SamplingRow> rows) = 0;
  // sample() in two halves, for async scheduling: start_sample() queues the sampling and returns,
  // finish_sample() waits for the tokens. Only where can_defer(rows) (the device has everything
  // the rows need); one may be outstanding. The defaults sample at once.
  virtual bool can_defer(std::span<const SamplingRow> rows) const { return false; }
  virtual void start_sample(const Tensor& logits, std::span<const SamplingRow> rows) { started_ = sample(logits, rows); }
  virtual std::vector<SampledToken> finish_sample() { return std::move(started_); }
  // Async scheduling's token feed: after start_sample(), replaces each entry -(1 + i) of token_ids
  // (I32, the next step's input ids on the backend's device) by the token of row i, in the
  // backend's stream order, so that the next step is launched before its inputs reach the host.
  // Only where can_feed_started(): the default (start_sample() sampled at once) writes host memory.
  virtual bool can_feed_started() const { return false; }
  virtual void feed_started_tokens(Tensor& token_ids);
  // log_softmax of raw logits rows[i], reporting targets[i] (its logprob and rank) and the top N
  // (-1: all): prompt logprobs.
  virtual std::vector<PositionLogprobs> logprobs_of(const Tensor& logits, std::span<const int> rows,
                                                    std::span<const int32_t> targets, int top_n) = 0;

 private:
  std::vector<SampledToken> started_;
};

// Reads logits back to the host through backend.copy when they live on a device.
std::unique_ptr<Sampler> make_cpu_sampler(Backend& backend);

}  // namespace specula
