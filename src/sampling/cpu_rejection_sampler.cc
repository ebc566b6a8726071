// The host implementation of RejectionSampler.
#include <algorithm>
#include <string>

#include "core/error.h"
#include "sampling/sampling_math.h"
#include "sampling/rejection_math.h"
#include "sampling/rejection_sampler.h"

namespace specula {

namespace {

class CpuRejectionSampler : public RejectionSampler {
 public:
  explicit CpuRejectionSampler(Backend& backend) : backend_(backend) {}

  // On the CPU backend the logits and the next forwards' inputs are host memory: starting is
  // verifying, and the launch-ahead's path stays under test.
  bool can_start_verify(std::span<const VerifyRequest>) const override { return backend_.device() == Device::kCPU; }

  std::vector<VerifyResult> verify(const Tensor& target_logits, const Tensor* draft_probs,
                                   std::span<const VerifyRequest> requests) override {
    std::vector<VerifyResult> out(requests.size());
    if (requests.empty()) return out;
    SPECULA_CHECK(target_logits.dtype() == DType::kF32 && target_logits.ndim() == 2,
                  "verification: target logits must be F32 [L, V], got {}", target_logits.describe());
    const Tensor logits = to_host(target_logits);
    const int64_t vocab = logits.size(1);
    std::vector<const float*> q_of(requests.size(), nullptr);
    std::vector<Tensor> q_host(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      const VerifyRequest& r = requests[i];
      SPECULA_CHECK(r.rows.size() == r.draft_tokens.size() + 1,
                    "internal error: verifying {} drafts needs {} logits rows, got {}", r.draft_tokens.size(),
                    r.draft_tokens.size() + 1, r.rows.size());
      for (const SamplingRow& row : r.rows)
        SPECULA_CHECK(row.logits_row >= 0 && row.logits_row < logits.size(0),
                      "internal error: verification row {} outside the {} logits rows", row.logits_row, logits.size(0));
      if (r.draft_probs_row < 0 || r.draft_tokens.empty() || r.rows[0].params->greedy()) continue;
      SPECULA_CHECK(draft_probs != nullptr && draft_probs->ndim() == 2 && draft_probs->size(1) == vocab &&
                        r.draft_probs_row + static_cast<int64_t>(r.draft_tokens.size()) <= draft_probs->size(0),
                    "internal error: draft probabilities rows [{}, {}) missing", r.draft_probs_row,
                    r.draft_probs_row + r.draft_tokens.size());
      // Only this request's k rows cross to the host, not the whole store.
      q_host[i] = to_host(draft_probs->slice(r.draft_probs_row, r.draft_probs_row + r.draft_tokens.size()));
      q_of[i] = q_host[i].data_as<float>();
    }

    // Requests are independent (each draws from its own stream): split them across threads.
    const int64_t n = static_cast<int64_t>(requests.size());
    std::string error;
#pragma omp parallel if (n > 1 && vocab * n >= (1 << 16))
    {
      std::vector<float> p(static_cast<size_t>(vocab)), residual(static_cast<size_t>(vocab));
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < n; ++i) {
        try {
          out[i] = verify_one(requests[i], logits, q_of[i], p, residual);
        } catch (const std::exception& e) {  // exceptions must not cross an OpenMP region
#pragma omp critical
          error = e.what();
        }
      }
    }
    SPECULA_CHECK(error.empty(), "{}", error);
    return out;
  }

 private:
  static VerifyResult verify_one(const VerifyRequest& r, const Tensor& logits, const float* q, std::vector<float>& p,
                                 std::vector<float>& residual) {
    const size_t vocab = p.size();
    auto raw_row = [&](const SamplingRow& row) {
      return std::span<const float>(logits.data_as<float>() + static_cast<size_t>(row.logits_row) * vocab, vocab);
    };
    VerifyResult res;
    auto emit = [&](const SamplingRow& row, int32_t token) {
      res.tokens.push_back(token);
      if (row.logprobs) res.logprobs.push_back(compute_logprobs(raw_row(row), token, *row.logprobs));
    };
    const size_t k = r.draft_tokens.size();
    for (size_t j = 0; j <= k; ++j) {
      const SamplingRow& row = r.rows[j];
      std::span<const float> raw = raw_row(row);
      p.assign(raw.begin(), raw.end());
      logits_to_probs(p, row);
      const bool greedy = row.params->greedy();
      if (j == k) {  // every draft accepted: the bonus token, sampled as without speculation
        emit(row, greedy ? argmax(p) : sample_from_probs(p, uniform_draw(row.seed, row.position)));
        break;
      }
      const int32_t x = r.draft_tokens[j];
      PositionVerdict v;
      if (q == nullptr || greedy) {
        v = verify_deterministic(p, x, uniform_draw(row.seed, row.position), greedy);
      } else {
        v = verify_stochastic(p, std::span<const float>(q + j * vocab, vocab), x,
                              uniform_draw(row.seed, row.position, kSpecAcceptStream),
                              uniform_draw(row.seed, row.position, kSpecResidualStream), residual);
      }
      emit(row, v.token);
      if (!v.accepted) break;
    }
    return res;
  }

  Tensor to_host(const Tensor& t) {
    if (t.is_cpu()) return t;
    Tensor host = Tensor::empty(t.shape(), t.dtype(), Device::kCPU);
    backend_.copy(t, host);
    backend_.synchronize();
    return host;
  }

  Backend& backend_;
};

}  // namespace

void RejectionSampler::start_verify(const Tensor& target_logits, const Tensor* draft_probs,
                                    std::span<const VerifyRequest> requests) {
  started_ = verify(target_logits, draft_probs, requests);
  started_rows_.clear();
  for (const VerifyRequest& r : requests) started_rows_.push_back(static_cast<int>(r.draft_tokens.size()) + 1);
}

bool RejectionSampler::feed_verified_tokens(Tensor& token_ids) {
  SPECULA_CHECK(token_ids.is_cpu() && token_ids.dtype() == DType::kI32,
                "internal error: the rejection sampler feeds host I32 token ids, got {}", token_ids.describe());
  // Row r -> (request, row of it); a row past the request's result gets its last token.
  std::vector<std::pair<size_t, size_t>> row_of;
  for (size_t i = 0; i < started_rows_.size(); ++i)
    for (int j = 0; j < started_rows_[i]; ++j) row_of.emplace_back(i, static_cast<size_t>(j));
  int32_t* ids = token_ids.data_as<int32_t>();
  for (int64_t i = 0; i < token_ids.numel(); ++i) {
    if (ids[i] >= 0) continue;
    const size_t row = static_cast<size_t>(-(ids[i] + 1));
    SPECULA_CHECK(row < row_of.size(), "internal error: verified token feed from row {} of {}", row, row_of.size());
    const std::vector<int32_t>& tokens = started_[row_of[row].first].tokens;
    SPECULA_CHECK(!tokens.empty(), "internal error: a verification without tokens");
    ids[i] = tokens[std::min(row_of[row].second, tokens.size() - 1)];
  }
  return true;
}

std::unique_ptr<RejectionSampler> make_cpu_rejection_sampler(Backend& backend) {
  return std::make_unique<CpuRejectionSampler>(backend);
}

}  // namespace specula
