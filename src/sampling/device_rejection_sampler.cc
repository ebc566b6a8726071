#include "sampling/device_rejection_sampler.h"

#include <optional>

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
    if (requests.empty()) return {};
    Verification v = prepare(target_logits, draft_probs, requests);
    std::vector<TokenSamplingResult> res;
    res.reserve(v.rows.size());
    for (size_t b = 0; b < v.rows.size(); b += static_cast<size_t>(max_rows_)) {
      const size_t n = std::min(v.rows.size() - b, static_cast<size_t>(max_rows_));
      std::vector<TokenSamplingResult> part =
          device_->sample(target_logits, std::span<const TokenSamplingRow>(v.rows.data() + b, n), draft_probs);
      for (TokenSamplingResult& t : part) res.push_back(std::move(t));
    }
    return assemble(v, res, &target_logits);
  }

  // One launch whose rows need nothing from the host afterwards (logprobs the device computes).
  bool can_start_verify(std::span<const VerifyRequest> requests) const override {
    size_t rows = 0;
    for (const VerifyRequest& r : requests) {
      rows += r.rows.size();
      for (const SamplingRow& row : r.rows)
        if (row.logprobs && !(*row.logprobs >= 0 && *row.logprobs <= device_->max_top_logprobs())) return false;
    }
    return rows > 0 && rows <= static_cast<size_t>(max_rows_);
  }
  void start_verify(const Tensor& target_logits, const Tensor* draft_probs,
                    std::span<const VerifyRequest> requests) override {
    SPECULA_CHECK(can_start_verify(requests), "internal error: a started verification of rows that need the host");
    started_ = prepare(target_logits, draft_probs, requests);
    device_->start_sample(target_logits, started_->rows, draft_probs);
  }
  bool feed_verified_tokens(Tensor& token_ids) override {
    if (!device_->can_feed_started()) return false;
    device_->feed_started_tokens(token_ids);
    return true;
  }
  std::vector<VerifyResult> finish_verify() override {
    SPECULA_CHECK(started_.has_value(), "internal error: no started verification");
    Verification v = std::move(*started_);
    started_.reset();
    return assemble(v, device_->finish_sample(), nullptr);
  }

 private:
  // The device rows of a verification and what assembling their results needs.
  struct Verification {
    std::vector<TokenSamplingRow> rows;    // one per logits row of every request
    std::vector<size_t> first;             // each request's first row
    std::vector<std::vector<int32_t>> drafts;
    std::vector<bool> wants_logprobs;      // per row
    std::vector<int> logprobs;             // per row: how many, where wanted
    std::vector<int32_t> logits_rows;      // per row
  };

  Verification prepare(const Tensor& target_logits, const Tensor* draft_probs,
                       std::span<const VerifyRequest> requests) const {
    Verification v;
    v.first.resize(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      const VerifyRequest& r = requests[i];
      SPECULA_CHECK(r.rows.size() == r.draft_tokens.size() + 1,
                    "internal error: verifying {} drafts needs {} logits rows, got {}", r.draft_tokens.size(),
                    r.draft_tokens.size() + 1, r.rows.size());
      v.first[i] = v.rows.size();
      v.drafts.emplace_back(r.draft_tokens.begin(), r.draft_tokens.end());
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
        v.rows.push_back(d);
        v.wants_logprobs.push_back(row.logprobs.has_value());
        v.logprobs.push_back(row.logprobs.value_or(0));
        v.logits_rows.push_back(row.logits_row);
      }
    }
    return v;
  }

  // Each request's accepted prefix and its token from the target. Logprobs the device did not
  // compute are computed here from target_logits (null: none may be missing).
  std::vector<VerifyResult> assemble(const Verification& v, const std::vector<TokenSamplingResult>& res,
                                     const Tensor* target_logits) {
    std::vector<VerifyResult> out(v.first.size());
    for (size_t i = 0; i < v.first.size(); ++i) {
      const std::vector<int32_t>& drafts = v.drafts[i];
      VerifyResult& result = out[i];
      for (size_t j = 0; j <= drafts.size(); ++j) {
        const size_t at = v.first[i] + j;
        const TokenSamplingResult& t = res[at];
        result.tokens.push_back(t.token);
        if (v.wants_logprobs[at]) {
          if (t.has_logprobs) {
            result.logprobs.push_back(to_position_logprobs(t));
          } else {
            SPECULA_CHECK(target_logits != nullptr, "internal error: logprobs of a started verification missing");
            result.logprobs.push_back(compute_logprobs(host_row(*target_logits, v.logits_rows[at]), t.token,
                                                       v.logprobs[at]));
          }
        }
        if (j == drafts.size()) break;  // the bonus token
        const bool accepted = v.rows[at].draft_token >= 0 ? t.accepted : t.token == drafts[j];
        if (!accepted) break;
      }
    }
    return out;
  }

  std::vector<float> host_row(const Tensor& logits, int row) {
    Tensor host = Tensor::empty({logits.size(1)}, DType::kF32, Device::kCPU);
    backend_.copy(logits.slice(row, row + 1).reshape({logits.size(1)}), host);
    backend_.synchronize();
    return host.to_f32_vector();
  }

  Backend& backend_;
  std::unique_ptr<TokenSampler> device_;
  int max_rows_;
  std::optional<Verification> started_;
};

}  // namespace

std::unique_ptr<RejectionSampler> make_device_rejection_sampler(Backend& backend, int max_rows, int64_t vocab) {
  std::unique_ptr<TokenSampler> device = backend.make_token_sampler(max_rows, vocab);
  if (!device) return nullptr;
  return std::make_unique<DeviceRejectionSampler>(backend, std::move(device), max_rows);
}

}  // namespace specula
