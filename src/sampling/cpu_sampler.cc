// The host implementation of Sampler: reads the logits back (when they live on a device) and
// runs sampling_math row by row.
#include <string>
#include <vector>

#include "core/error.h"
#include "sampling/sampler.h"
#include "sampling/sampling_math.h"

namespace specula {

namespace {

class CpuSampler : public Sampler {
 public:
  explicit CpuSampler(Backend& backend) : backend_(backend) {}

  std::vector<SampledToken> sample(const Tensor& logits, std::span<const SamplingRow> rows) override {
    const Tensor host = to_host(logits);
    const size_t vocab = static_cast<size_t>(host.size(1));
    std::vector<SampledToken> out(rows.size());
    for (const SamplingRow& row : rows)
      SPECULA_CHECK(row.logits_row >= 0 && row.logits_row < host.size(0),
                    "internal error: sampling row {} outside the {} logits rows", row.logits_row, host.size(0));
    // Rows are independent (each draws from its own stream), so they split across threads with
    // results identical to a serial loop. Worth it for large vocabularies: each row is several
    // passes over V floats.
    const int64_t n = static_cast<int64_t>(rows.size());
    std::string error;
#pragma omp parallel if (n > 1 && vocab * n >= (1 << 16))
    {
      std::vector<float> work(vocab);
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < n; ++i) {
        try {
          const SamplingRow& row = rows[i];
          std::span<const float> raw(host.data_as<float>() + static_cast<size_t>(row.logits_row) * vocab, vocab);
          work.assign(raw.begin(), raw.end());
          logits_to_probs(work, row);
          const int32_t token =
              row.params->greedy() ? argmax(work) : sample_from_probs(work, uniform_draw(row.seed, row.position));
          out[i].token = token;
          if (row.logprobs) out[i].logprobs = compute_logprobs(raw, token, *row.logprobs);
        } catch (const std::exception& e) {  // exceptions must not cross an OpenMP region
#pragma omp critical
          error = e.what();
        }
      }
    }
    SPECULA_CHECK(error.empty(), "{}", error);
    return out;
  }

  // On the CPU backend the logits and the next step's inputs are host memory, and start_sample()
  // samples at once: deferring and feeding cost nothing and keep the async path under test.
  bool can_defer(std::span<const SamplingRow>) const override { return backend_.device() == Device::kCPU; }
  bool can_feed_started() const override { return backend_.device() == Device::kCPU; }

  std::vector<PositionLogprobs> logprobs_of(const Tensor& logits, std::span<const int> rows,
                                            std::span<const int32_t> targets, int top_n) override {
    SPECULA_ASSERT(rows.size() == targets.size());
    const Tensor host = to_host(logits);
    const size_t vocab = static_cast<size_t>(host.size(1));
    std::vector<PositionLogprobs> out;
    out.reserve(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      std::span<const float> raw(host.data_as<float>() + static_cast<size_t>(rows[i]) * vocab, vocab);
      out.push_back(compute_logprobs(raw, targets[i], top_n));
    }
    return out;
  }

 private:
  Tensor to_host(const Tensor& logits) {
    SPECULA_CHECK(logits.dtype() == DType::kF32 && logits.ndim() == 2, "sampler: logits must be F32 [L, V], got {}",
                  logits.describe());
    if (logits.is_cpu()) return logits;
    Tensor host = Tensor::empty(logits.shape(), DType::kF32, Device::kCPU);
    backend_.copy(logits, host);
    backend_.synchronize();
    return host;
  }

  Backend& backend_;
};

}  // namespace

void Sampler::feed_started_tokens(Tensor& token_ids) {
  SPECULA_CHECK(token_ids.is_cpu() && token_ids.dtype() == DType::kI32,
                "internal error: the sampler feeds host I32 token ids, got {}", token_ids.describe());
  int32_t* ids = token_ids.data_as<int32_t>();
  for (int64_t i = 0; i < token_ids.numel(); ++i) {
    if (ids[i] >= 0) continue;
    const size_t row = static_cast<size_t>(-(ids[i] + 1));
    SPECULA_CHECK(row < started_.size(), "internal error: token feed from row {} of {}", row, started_.size());
    ids[i] = started_[row].token;
  }
}

std::unique_ptr<Sampler> make_cpu_sampler(Backend& backend) { return std::make_unique<CpuSampler>(backend); }

}  // namespace specula
