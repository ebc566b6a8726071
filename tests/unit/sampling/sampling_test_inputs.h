// Inputs the device-sampler tests share (device sampler, draft sampler, rejection sampler): F32
// logits on the GPU, random logits that are never zero, and the sampling settings every one of
// them is checked under.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "sampling/sampling_params.h"

namespace specula::testing {

// host [rows * vocab] -> F32 [rows, vocab] on the GPU.
inline Tensor upload_f32(Backend& gpu, const std::vector<float>& host, int64_t rows, int64_t vocab) {
  Tensor src = Tensor::from_f32(host, {rows, vocab});
  Tensor dst = gpu.empty({rows, vocab}, DType::kF32);
  gpu.copy(src, dst);
  return dst;
}

// Normal logits of scale `scale`; quantised to `step` when step > 0 (hundreds of exact ties).
// Never zeros: a value that rounds to 0 is moved off it.
inline std::vector<float> random_logits(int64_t rows, int64_t vocab, uint32_t seed, float scale, float step = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> l(static_cast<size_t>(rows * vocab));
  for (float& x : l) {
    x = d(rng);
    if (step > 0) x = std::round(x / step) * step;
    if (x == 0.0f) x = step > 0 ? step : 0.01f;
  }
  return l;
}

// Greedy, temperatures, top-k, top-p, min-p and their combinations; each test appends its own
// (penalties, logprobs, ...).
inline std::vector<SamplingParams> common_sampling_settings() {
  std::vector<SamplingParams> s;
  SamplingParams p;
  p.temperature = 0.0f;
  s.push_back(p);  // greedy
  p = SamplingParams{};
  s.push_back(p);  // temperature 1
  p.temperature = 0.7f;
  s.push_back(p);
  p = SamplingParams{};
  p.top_k = 40;
  s.push_back(p);
  p = SamplingParams{};
  p.top_p = 0.9f;
  s.push_back(p);
  p = SamplingParams{};
  p.min_p = 0.05f;
  s.push_back(p);
  p = SamplingParams{};
  p.temperature = 0.6f;
  p.top_k = 20;
  p.top_p = 0.95f;  // Qwen3's recommended settings
  s.push_back(p);
  p = SamplingParams{};
  p.temperature = 1.3f;
  p.top_k = 100;
  p.top_p = 0.5f;
  p.min_p = 0.01f;
  s.push_back(p);
  p = SamplingParams{};
  p.temperature = 0.0f;
  p.logit_bias = {{3, 30.0f}};  // greedy, pushed onto token 3
  s.push_back(p);
  p = SamplingParams{};
  p.temperature = 0.8f;
  p.logit_bias = {{1, 2.5f}, {5, -100.0f}, {6, 1.0f}};
  s.push_back(p);
  return s;
}

}  // namespace specula::testing
