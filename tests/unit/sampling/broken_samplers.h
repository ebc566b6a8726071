// Deliberately broken verifiers: the lossless tests must tell them apart from the real one.
#pragma once

#include <vector>

#include "sampling/sampling_math.h"
#include "sampling/rejection_math.h"
#include "sampling/rejection_sampler.h"

namespace specula::testing {

// Accepts every draft, then samples the bonus token.
class AlwaysAccept : public RejectionSampler {
 public:
  std::vector<VerifyResult> verify(const Tensor& logits, const Tensor*, std::span<const VerifyRequest> reqs) override {
    std::vector<VerifyResult> out;
    for (const VerifyRequest& r : reqs) {
      VerifyResult v;
      v.tokens.assign(r.draft_tokens.begin(), r.draft_tokens.end());
      const SamplingRow& bonus = r.rows.back();
      const int64_t V = logits.size(1);
      std::vector<float> p(logits.data_as<float>() + bonus.logits_row * V, logits.data_as<float>() + (bonus.logits_row + 1) * V);
      logits_to_probs(p, bonus);
      v.tokens.push_back(sample_from_probs(p, uniform_draw(bonus.seed, bonus.position)));
      out.push_back(v);
    }
    return out;
  }
};

// min(1, p/q) acceptance, but a rejection draws from p instead of the residual max(0, p - q).
class ResampleFromP : public RejectionSampler {
 public:
  std::vector<VerifyResult> verify(const Tensor& logits, const Tensor* q, std::span<const VerifyRequest> reqs) override {
    std::vector<VerifyResult> out;
    const int64_t V = logits.size(1);
    for (const VerifyRequest& r : reqs) {
      VerifyResult v;
      for (size_t j = 0; j < r.rows.size(); ++j) {
        const SamplingRow& row = r.rows[j];
        std::vector<float> p(logits.data_as<float>() + row.logits_row * V, logits.data_as<float>() + (row.logits_row + 1) * V);
        logits_to_probs(p, row);
        if (j == r.draft_tokens.size()) {
          v.tokens.push_back(sample_from_probs(p, uniform_draw(row.seed, row.position)));
          break;
        }
        const int32_t x = r.draft_tokens[j];
        const float qx = q->data_as<float>()[(r.draft_probs_row + j) * V + x];
        if (uniform_draw(row.seed, row.position, kSpecAcceptStream) * qx < p[x]) {
          v.tokens.push_back(x);
          continue;
        }
        v.tokens.push_back(sample_from_probs(p, uniform_draw(row.seed, row.position, kSpecResidualStream)));
        break;
      }
      out.push_back(v);
    }
    return out;
  }
};

}  // namespace specula::testing
