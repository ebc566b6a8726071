#include "sampling/device_sampler.h"

#include <string>
#include <vector>

#include "backend/token_sampler.h"
#include "core/error.h"
#include "sampling/sampling_math.h"

namespace specula {
namespace {

PositionLogprobs to_position_logprobs(const TokenSamplingResult& r) {
  PositionLogprobs out;
  out.chosen = {r.token, r.logprob, r.rank};
  out.top.reserve(r.top.size());
  for (size_t i = 0; i < r.top.size(); ++i)
    out.top.push_back({r.top[i].token, r.top[i].logprob, static_cast<int>(i) + 1});
  return out;
}

class DeviceSampler : public Sampler {
 public:
  DeviceSampler(Backend& backend, std::unique_ptr<TokenSampler> device) : backend_(backend), device_(std::move(device)) {}

  std::vector<SampledToken> sample(const Tensor& logits, std::span<const SamplingRow> rows) override {
    std::vector<size_t> host_logprob_rows;  // rows whose logprobs the device does not cover
    const std::vector<TokenSamplingRow> dev = device_rows(rows, &host_logprob_rows);
    std::vector<SampledToken> out = to_sampled(device_->sample(logits, dev));
    for (size_t i : host_logprob_rows) {
      const std::vector<float> raw = host_row(logits, rows[i].logits_row);
      out[i].logprobs = compute_logprobs(raw, out[i].token, *rows[i].logprobs);
    }
    return out;
  }

  bool can_defer(std::span<const SamplingRow> rows) const override {
    for (const SamplingRow& r : rows)
      if (r.logprobs && !covers_logprobs(*r.logprobs)) return false;
    return true;
  }
  void start_sample(const Tensor& logits, std::span<const SamplingRow> rows) override {
    SPECULA_CHECK(can_defer(rows), "internal error: deferred sampling of rows that need the host");
    device_->start_sample(logits, device_rows(rows, nullptr));
  }
  std::vector<SampledToken> finish_sample() override { return to_sampled(device_->finish_sample()); }
  bool can_feed_started() const override { return device_->can_feed_started(); }
  void feed_started_tokens(Tensor& token_ids) override { device_->feed_started_tokens(token_ids); }

  std::vector<PositionLogprobs> logprobs_of(const Tensor& logits, std::span<const int> rows,
                                            std::span<const int32_t> targets, int top_n) override {
    SPECULA_ASSERT(rows.size() == targets.size());
    std::vector<PositionLogprobs> out;
    out.reserve(rows.size());
    if (top_n >= 0 && top_n <= device_->max_top_logprobs()) {
      std::vector<int32_t> r(rows.begin(), rows.end());
      for (const TokenSamplingResult& t : device_->logprobs_of(logits, r, targets, top_n))
        out.push_back(to_position_logprobs(t));
      return out;
    }
    for (size_t i = 0; i < rows.size(); ++i) out.push_back(compute_logprobs(host_row(logits, rows[i]), targets[i], top_n));
    return out;
  }

 private:
  bool covers_logprobs(int n) const { return n >= 0 && n <= device_->max_top_logprobs(); }

  std::vector<TokenSamplingRow> device_rows(std::span<const SamplingRow> rows, std::vector<size_t>* host_logprob_rows) const {
    std::vector<TokenSamplingRow> dev(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      const SamplingRow& r = rows[i];
      TokenSamplingRow& d = dev[i] = device_row_settings(r);
      if (!r.logprobs) continue;
      if (covers_logprobs(*r.logprobs)) {
        d.top_logprobs = *r.logprobs;
      } else if (host_logprob_rows) {
        host_logprob_rows->push_back(i);
      }
    }
    return dev;
  }

  static std::vector<SampledToken> to_sampled(const std::vector<TokenSamplingResult>& res) {
    std::vector<SampledToken> out(res.size());
    for (size_t i = 0; i < res.size(); ++i) {
      out[i].token = res[i].token;
      if (res[i].has_logprobs) out[i].logprobs = to_position_logprobs(res[i]);
    }
    return out;
  }

  std::vector<float> host_row(const Tensor& logits, int row) {
    SPECULA_CHECK(row >= 0 && row < logits.size(0), "sampler: logits row {} of {}", row, logits.size(0));
    Tensor host = Tensor::empty({logits.size(1)}, DType::kF32, Device::kCPU);
    backend_.copy(logits.slice(row, row + 1).reshape({logits.size(1)}), host);
    backend_.synchronize();
    return host.to_f32_vector();
  }

  Backend& backend_;
  std::unique_ptr<TokenSampler> device_;
};

}  // namespace

TokenSamplingRow device_row_settings(const SamplingRow& r, uint32_t stream) {
  const SamplingParams& p = *r.params;
  TokenSamplingRow d;
  d.logits_row = r.logits_row;
  d.greedy = p.greedy();
  d.temperature = p.temperature;
  d.top_k = p.top_k;
  d.top_p = p.top_p;
  d.min_p = p.min_p;
  d.repetition_penalty = p.repetition_penalty;
  d.frequency_penalty = p.frequency_penalty;
  d.presence_penalty = p.presence_penalty;
  d.uniform = d.greedy ? 0.0 : uniform_draw(r.seed, r.position, stream);
  d.prompt_ids = r.prompt_token_ids;
  d.output_ids = r.output_token_ids;
  d.masked_ids = r.masked_token_ids;
  d.allowed_mask = r.allowed_token_mask;
  d.logit_bias = p.logit_bias;
  return d;
}

std::unique_ptr<Sampler> make_device_sampler(Backend& backend, int max_rows, int64_t vocab) {
  std::unique_ptr<TokenSampler> device = backend.make_token_sampler(max_rows, vocab);
  if (!device) return nullptr;
  return std::make_unique<DeviceSampler>(backend, std::move(device));
}

std::unique_ptr<Sampler> make_sampler(Backend& backend, int max_rows, int64_t vocab) {
  std::unique_ptr<Sampler> device = make_device_sampler(backend, max_rows, vocab);
  return device ? std::move(device) : make_cpu_sampler(backend);
}

}  // namespace specula
