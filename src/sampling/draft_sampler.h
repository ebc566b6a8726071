// Turns a draft model's logits into draft tokens and keeps the distributions q they were drawn
// from, for the rejection sampler of the next step. q is the draft's FINAL distribution:
// logits_to_probs with the request's own settings, exactly as the target's p will be computed.
// Greedy rows draft the argmax (q one-hot: nothing to keep); the others draw x ~ q with the
// request's position-keyed draw on kSpecDraftStream.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "sampling/sampler.h"

namespace specula {

struct DraftSampleRow {
  SamplingRow row;  // logits_row, settings, seed, position of the drafted token, context so far
  int q_row = -1;   // row of the q store that receives its distribution (-1: do not keep it)
};

class DraftSampler {
 public:
  virtual ~DraftSampler() = default;
  // draft_logits: F32 [L, V] on the device; q_store: F32 [R, V] on the device (may be null when
  // no row keeps q). Returns one token per row.
  virtual std::vector<int32_t> sample(const Tensor& draft_logits, std::span<const DraftSampleRow> rows,
                                      Tensor* q_store) = 0;
  // Chained drafts (spec_decode/draft_chain.h): what sample() draws, with row i's token written to
  // tokens_out[i] (I32 on the backend's device) in stream order and nothing brought back, so that
  // the next draft step can be queued at once. Rows must keep no context (no penalties, masked ids,
  // logit bias or allowed-token mask: draws_without_context); logprobs are not reported.
  virtual void draw_on_device(const Tensor& draft_logits, std::span<const DraftSampleRow> rows, Tensor* q_store,
                              Tensor& tokens_out) = 0;
};

// A row whose draw depends on nothing but its logits, settings and (seed, position): it can be
// drawn on the device ahead of the host knowing the drafts before it (draw_on_device).
bool draws_without_context(const SamplingRow& row);

std::unique_ptr<DraftSampler> make_cpu_draft_sampler(Backend& backend);

}  // namespace specula
