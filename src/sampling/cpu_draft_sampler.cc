// The host implementation of DraftSampler.
#include <string>

#include "core/error.h"
#include "sampling/sampling_math.h"
#include "sampling/draft_sampler.h"
#include "sampling/rejection_math.h"

namespace specula {

bool draws_without_context(const SamplingRow& row) {
  const SamplingParams& p = *row.params;
  return row.masked_token_ids.empty() && row.allowed_token_mask.empty() && !row.logprobs &&
         p.repetition_penalty == 1.0f && p.frequency_penalty == 0.0f && p.presence_penalty == 0.0f &&
         p.logit_bias.empty();
}

namespace {

class CpuDraftSampler : public DraftSampler {
 public:
  explicit CpuDraftSampler(Backend& backend) : backend_(backend) {}

  std::vector<int32_t> sample(const Tensor& draft_logits, std::span<const DraftSampleRow> rows,
                              Tensor* q_store) override {
    std::vector<int32_t> out(rows.size());
    if (rows.empty()) return out;
    SPECULA_CHECK(draft_logits.dtype() == DType::kF32 && draft_logits.ndim() == 2,
                  "draft sampling: logits must be F32 [L, V], got {}", draft_logits.describe());
    const Tensor logits = to_host(draft_logits);
    const int64_t vocab = logits.size(1);
    for (const DraftSampleRow& r : rows) {
      SPECULA_CHECK(r.row.logits_row >= 0 && r.row.logits_row < logits.size(0),
                    "internal error: draft row {} outside the {} logits rows", r.row.logits_row, logits.size(0));
      if (r.q_row >= 0)
        SPECULA_CHECK(q_store && q_store->ndim() == 2 && q_store->size(1) == vocab && r.q_row < q_store->size(0),
                      "internal error: draft probabilities row {} outside the store", r.q_row);
    }
    // On the host the store is written in place; a device store gets each kept row copied up.
    const bool direct = q_store && q_store->is_cpu();
    Tensor staging;
    if (q_store && !direct) staging = Tensor::empty({static_cast<int64_t>(rows.size()), vocab}, DType::kF32, Device::kCPU);

    const int64_t n = static_cast<int64_t>(rows.size());
    std::string error;
#pragma omp parallel if (n > 1 && vocab * n >= (1 << 16))
    {
      std::vector<float> work(static_cast<size_t>(vocab));
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < n; ++i) {
        try {
          const DraftSampleRow& r = rows[i];
          const float* raw = logits.data_as<float>() + static_cast<size_t>(r.row.logits_row) * vocab;
          float* dst = work.data();
          const bool keep = r.q_row >= 0 && !r.row.params->greedy();
          if (keep) dst = direct ? q_store->data_as<float>() + static_cast<size_t>(r.q_row) * vocab
                                 : staging.data_as<float>() + static_cast<size_t>(i) * vocab;
          std::copy(raw, raw + vocab, dst);
          std::span<float> probs(dst, static_cast<size_t>(vocab));
          logits_to_probs(probs, r.row);
          out[i] = r.row.params->greedy()
                       ? argmax(probs)
                       : sample_from_probs(probs, uniform_draw(r.row.seed, r.row.position, kSpecDraftStream));
        } catch (const std::exception& e) {  // exceptions must not cross an OpenMP region
#pragma omp critical
          error = e.what();
        }
      }
    }
    SPECULA_CHECK(error.empty(), "{}", error);
    if (q_store && !direct) {
      for (int64_t i = 0; i < n; ++i) {
        if (rows[i].q_row < 0 || rows[i].row.params->greedy()) continue;
        Tensor dst = q_store->slice(rows[i].q_row, rows[i].q_row + 1);
        backend_.copy(staging.slice(i, i + 1), dst);
      }
    }
    return out;
  }

  // The host draws at once; the tokens go where the chain reads them.
  void draw_on_device(const Tensor& draft_logits, std::span<const DraftSampleRow> rows, Tensor* q_store,
                      Tensor& tokens_out) override {
    for (const DraftSampleRow& r : rows)
      SPECULA_CHECK(draws_without_context(r.row),
                    "internal error: a chained draft row with context (penalties, masks)");
    SPECULA_CHECK(tokens_out.dtype() == DType::kI32 && tokens_out.numel() == static_cast<int64_t>(rows.size()),
                  "internal error: {} chained draft tokens into {}", rows.size(), tokens_out.describe());
    if (rows.empty()) return;
    backend_.copy(Tensor::from_i32(sample(draft_logits, rows, q_store)), tokens_out);
  }

 private:
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

std::unique_ptr<DraftSampler> make_cpu_draft_sampler(Backend& backend) {
  return std::make_unique<CpuDraftSampler>(backend);
}

}  // namespace specula
