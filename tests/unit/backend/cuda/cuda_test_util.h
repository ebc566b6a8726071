// Helpers for the CUDA backend tests: each op runs on the GPU (bf16) and on the CPU backend (fp32)
// on the same inputs, rounded to bf16 first so that both sides see identical values; random
// inputs are bounded away from zero so that no test passes on zeros.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace specula::testing {

#define SKIP_WITHOUT_GPU() \
  if (!::specula::cuda_available()) GTEST_SKIP() << "no CUDA GPU visible"

// Uniform in [-scale, -0.05 scale] u [0.05 scale, scale].
inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::uniform_real_distribution<float> mag(0.05f * scale, scale);
  std::bernoulli_distribution neg(0.5);
  std::vector<float> v(n);
  for (auto& x : v) x = neg(rng) ? -mag(rng) : mag(rng);
  return v;
}

inline int64_t numel_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// F32 CPU tensor of random values already rounded to bf16 (exactly representable in both).
inline Tensor random_bf16_values(const Shape& shape, std::mt19937& rng, float scale = 1.0f) {
  std::vector<float> v = random_floats(static_cast<size_t>(numel_of(shape)), rng, scale);
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return Tensor::from_f32(v, shape);
}

// Copies a CPU tensor to the GPU, converting F32 to `dtype` first (integers go as they are).
inline Tensor to_gpu(Backend& gpu, const Tensor& host, DType dtype = DType::kBF16) {
  Tensor src = host;
  if (host.dtype() == DType::kF32 && dtype != DType::kF32) {
    src = Tensor::empty(host.shape(), dtype);
    convert_from_f32(host.data_as<float>(), dtype, src.data(), static_cast<size_t>(host.numel()));
  }
  Tensor t = gpu.empty(src.shape(), src.dtype());
  gpu.copy(src, t);
  return t;
}

// A rope cos / sin table [max_pos, rotary] (cos in the first half of a row, sin in the second)
// with the usual 10000^(-2i / rotary) frequencies, on the host.
inline Tensor rope_table(int64_t max_pos, int rotary) {
  std::vector<float> table(static_cast<size_t>(max_pos * rotary));
  for (int64_t p = 0; p < max_pos; ++p)
    for (int i = 0; i < rotary / 2; ++i) {
      const double f = static_cast<double>(p) * std::pow(10000.0, -2.0 * i / rotary);
      table[p * rotary + i] = static_cast<float>(std::cos(f));
      table[p * rotary + rotary / 2 + i] = static_cast<float>(std::sin(f));
    }
  return Tensor::from_f32(table, {max_pos, rotary});
}

// Copies a GPU tensor back (waiting for it) as fp32 values.
inline std::vector<float> to_host(Backend& gpu, const Tensor& t) {
  Tensor host = Tensor::empty(t.shape(), t.dtype());
  gpu.copy(t, host);
  gpu.synchronize();
  return host.to_f32_vector();
}

// |got - want| <= atol + rtol * |want| everywhere; reports the worst error and the first failures.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rtol, double atol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int failures = 0;
  double worst = 0;
  size_t worst_at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    // Identical values (infinities included) and NaN where NaN is expected are exact matches.
    if (got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]))) continue;
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= worst)) {  // also catches NaN
      worst = std::isnan(err) ? INFINITY : err;
      worst_at = i;
    }
    if (!(err <= atol + rtol * std::fabs(want[i]))) {
      if (++failures <= 5) ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
    }
  }
  if (failures > 0) {
    ADD_FAILURE() << what << ": " << failures << " of " << got.size() << " elements out of tolerance (rtol " << rtol
                  << ", atol " << atol << "); worst |err| " << worst << " at " << worst_at;
  }
}

inline void expect_equal(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  expect_close(got, want, 0.0, 0.0, what);
}

}  // namespace specula::testing
