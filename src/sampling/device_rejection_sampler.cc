#include "sampling/device_rejection_sampler.h"

#include "backend/token_sampler.h"
#include "core/error.h"
#include "sampling/device_sampler.h"
#include "sampling/sampling_math.h"
#include "sampling/rejection_math.h"

namespace specula {
namespace {

PositionLogprobs to_position_logprobs(const TokenSamplingResult& r) {
  PositionLogprobs out;
  out.chosen = {r.token, r.logprob, r.rank};
  for (size_t i = 0; i < r.top.size(); ++i) out.top.push_back({r.top[i].token, r.top[i].logprob, static_cast<int>(i) + 1});
  return out;
}

class DeviceRejectionSampler : public RejectionSampler {
 public:
  DeviceRejectionSampler(Backend& backend, std::unique_ptr<TokenSampler> device, int max_rows)
      : backend_(backend), device_(std::move(device)), max_rows_(max_rows) {}

  std::vector<VerifyResult> verify(const Tensor& target_logits, const Tensor* draft_probs,
                                   std::span<const VerifyRequest> requests) override {
    std::vector<VerifyResult> out(requests.size());
    if (requests.empty()) return out;
    // One device row per logits row of every request.
    std::vector<TokenSamplingRow> rows;
    std::vector<const SamplingRow*> source;
    std::vector<size_t> first(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      const VerifyRequest& r = requests[i];
      SPECULA_CHECK(r.rows.size() == r.draft_tokens.size() + 1,
                    "internal error: verifying {} drafts needs {} logits rows, got {}", r.draft_tokens.size(),
                    r.draft_tokens.size() + 1, r.rows.size());
      first[i] = rows.size();
      const size_t k = r.draft_tokens.size();
      for (size_t j = 0; j <= k; ++j) {
        const SamplingRow& row = r.rows[j];
        TokenSamplingRow d = device_row_settings(row);
        if (row.logprobs && *row.logprobs >= 0 && *row.logprobs <= device_->max_top_logprobs())
          d.top_logprobs = *row.logprobs;
        const bool stochastic = j < k && r.draft_probs_row >= 0 && !d.greedy;
        if (stochastic) {
          SPECULA_CHECK(draft_probs != nullptr, "internal error: draft probabilities rows [{}, {}) missing",
                        r.draft_probs_row, r.draft_probs_row + k);
          d.draft_token = r.draft_tokens[j];
          SPECULA_CHECK(d.draft_token >= 0 && d.draft_token < target_logits.size(1),
                        "verification: draft token {} outside the vocab of {}", d.draft_token, target_logits.size(1));
          d.q_row = r.draft_probs_row + static_cast<int32_t>(j);
          d.uniform_accept = uniform_draw(row.seed, row.position, kSpecAcceptStream);
          d.uniform_residual = uniform_draw(row.seed, row.position, kSpecResidualStream);
        }
        rows.push_back(d);
        source.push_back(&row);
      }
    }
    std::vector<TokenSamplingResult> res;
    res.reserve(rows.size());
    for (size_t b = 0; b < rows.size(); b += static_cast<size_t>(max_rows_)) {
      const size_t n = std::min(rows.size() - b, static_cast<size_t>(max_rows_));
      std::vector<TokenSamplingResult> part =
          device_->sample(target_logits, std::span<const TokenSamplingRow>(rows.data() + b, n), draft_probs);
      for (TokenSamplingResult& t : part) res.push_back(std::move(t));
    }
    for (size_t i = 0; i < requests.size(); ++i) {
      const VerifyRequest& r = requests[i];
      VerifyResult& v = out[i];
      for (size_t j = 0; j <= r.draft_tokens.size(); ++j) {
        const size_t at = first[i] + j;
        const TokenSamplingResult& t = res[at];
        v.tokens.push_back(t.token);
        const SamplingRow& row = *source[at];
        if (row.logprobs) {
          v.logprobs.push_back(t.has_logprobs ? to_position_logprobs(t)
                                              : compute_logprobs(host_row(target_logits, row.logits_row), t.token,
                                                                 *row.logprobs));
        }
        if (j == r.draft_tokens.size()) break;  // the bonus token
        const bool accepted = rows[at].draft_token >= 0 ? t.accepted : t.token == r.draft_tokens[j];
        if (!accepted) break;
      }
    }
    return out;
  }

 private:
  std::vector<float> host_row(const Tensor& logits, int row) {
    Tensor host = Tensor::empty({logits.size(1)}, DType::kF32, Device::kCPU);
    backend_.copy(logits.slice(row, row + 1).reshape({logits.size(1)}), host);
    backend_.synchronize();
    return host.to_f32_vector();
  }

  Backend& backend_;
  std::unique_ptr<TokenSampler> device_;
  int max_rows_;
};

}  // namespace

std::unique_ptr<RejectionSampler> make_device_rejection_sampler(Backend& backend, int max_rows, int64_t vocab) {
  std::unique_ptr<TokenSampler> device = backend.make_token_sampler(max_rows, vocab);
  if (!device) return nullptr;
  return std::make_unique<DeviceRejectionSampler>(backend, std::move(device), max_rows);
}

}  // namespace specula
