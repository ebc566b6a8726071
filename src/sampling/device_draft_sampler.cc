#include "sampling/device_draft_sampler.h"

#include <algorithm>
#include <vector>

#include "backend/token_sampler.h"
#include "core/error.h"
#include "sampling/device_sampler.h"
#include "sampling/rejection_math.h"

namespace specula {
namespace {

class DeviceDraftSampler : public DraftSampler {
 public:
  DeviceDraftSampler(std::unique_ptr<TokenSampler> device, int max_rows, int64_t vocab)
      : device_(std::move(device)), max_rows_(max_rows), vocab_(vocab) {}

  std::vector<int32_t> sample(const Tensor& draft_logits, std::span<const DraftSampleRow> rows,
                              Tensor* q_store) override {
    std::vector<int32_t> out(rows.size());
    if (rows.empty()) return out;
    bool keeps_q = false;
    const std::vector<TokenSamplingRow> dev = device_rows(draft_logits, rows, q_store, keeps_q);
    for (size_t b = 0; b < dev.size(); b += static_cast<size_t>(max_rows_)) {
      const size_t n = std::min(dev.size() - b, static_cast<size_t>(max_rows_));
      const std::vector<TokenSamplingResult> res = device_->sample(
          draft_logits, std::span<const TokenSamplingRow>(dev.data() + b, n), nullptr, keeps_q ? q_store : nullptr);
      for (size_t i = 0; i < n; ++i) out[b + i] = res[i].token;
    }
    return out;
  }

  void draw_on_device(const Tensor& draft_logits, std::span<const DraftSampleRow> rows, Tensor* q_store,
                      Tensor& tokens_out) override {
    SPECULA_CHECK(tokens_out.dtype() == DType::kI32 && tokens_out.numel() == static_cast<int64_t>(rows.size()),
                  "internal error: {} chained draft tokens into {}", rows.size(), tokens_out.describe());
    if (rows.empty()) return;
    for (const DraftSampleRow& r : rows)
      SPECULA_CHECK(draws_without_context(r.row),
                    "internal error: a chained draft row with context (penalties, masks)");
    bool keeps_q = false;
    const std::vector<TokenSamplingRow> dev = device_rows(draft_logits, rows, q_store, keeps_q);
    for (size_t b = 0; b < dev.size(); b += static_cast<size_t>(max_rows_)) {
      const size_t n = std::min(dev.size() - b, static_cast<size_t>(max_rows_));
      Tensor out = tokens_out.slice(static_cast<int64_t>(b), static_cast<int64_t>(b + n));
      device_->draw_on_device(draft_logits, std::span<const TokenSamplingRow>(dev.data() + b, n),
                              keeps_q ? q_store : nullptr, out);
    }
  }

 private:
  // The rows' device settings; non-greedy rows with a q row write q there (keeps_q).
  std::vector<TokenSamplingRow> device_rows(const Tensor& draft_logits, std::span<const DraftSampleRow> rows,
                                            Tensor* q_store, bool& keeps_q) const {
    SPECULA_CHECK(draft_logits.dtype() == DType::kF32 && draft_logits.ndim() == 2 && !draft_logits.is_cpu() &&
                      draft_logits.size(1) == vocab_,
                  "draft sampling: logits must be F32 [L, {}] on the device, got {}", vocab_, draft_logits.describe());
    std::vector<TokenSamplingRow> dev(rows.size());
    keeps_q = false;
    for (size_t i = 0; i < rows.size(); ++i) {
      const SamplingRow& r = rows[i].row;
      SPECULA_CHECK(r.logits_row >= 0 && r.logits_row < draft_logits.size(0),
                    "internal error: draft row {} outside the {} logits rows", r.logits_row, draft_logits.size(0));
      TokenSamplingRow& d = dev[i] = device_row_settings(r, kSpecDraftStream);
      // Greedy rows draft the argmax: q is one-hot there and nobody reads it.
      if (rows[i].q_row >= 0 && !d.greedy) {
        SPECULA_CHECK(q_store && !q_store->is_cpu() && q_store->ndim() == 2 && q_store->size(1) == vocab_ &&
                          rows[i].q_row < q_store->size(0),
                      "internal error: draft probabilities row {} outside the store", rows[i].q_row);
        d.probs_out_row = rows[i].q_row;
        keeps_q = true;
      }
    }
    return dev;
  }

  std::unique_ptr<TokenSampler> device_;
  int max_rows_;
  int64_t vocab_;
};

}  // namespace

std::unique_ptr<DraftSampler> make_device_draft_sampler(Backend& backend, int max_rows, int64_t vocab) {
  SPECULA_CHECK(max_rows > 0, "draft sampling: needs a positive row count, got {}", max_rows);
  std::unique_ptr<TokenSampler> device = backend.make_token_sampler(max_rows, vocab);
  if (!device) return nullptr;
  return std::make_unique<DeviceDraftSampler>(std::move(device), max_rows, vocab);
}

std::unique_ptr<DraftSampler> make_draft_sampler(Backend& backend, int max_rows, int64_t vocab) {
  if (backend.device() != Device::kCPU) {
    if (std::unique_ptr<DraftSampler> device = make_device_draft_sampler(backend, max_rows, vocab)) return device;
  }
  return make_cpu_draft_sampler(backend);
}

}  // namespace specula
