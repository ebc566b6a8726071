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
};

std::unique_ptr<DraftSampler> make_cpu_draft_sampler(Backend& backend);

}  // namespace specula
