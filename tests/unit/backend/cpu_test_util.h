// Helpers for the CPU backend tests: random (never zero) inputs and closeness checks.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/tensor.h"

namespace specula::testing {

// Uniform values in [-scale, scale], bounded away from zero so that no test passes on zeros.
inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::uniform_real_distribution<float> mag(0.05f * scale, scale);
  std::bernoulli_distribution neg(0.5);
  std::vector<float> v(n);
  for (auto& x : v) x = neg(rng) ? -mag(rng) : mag(rng);
  return v;
}

inline Tensor random_tensor(const Shape& shape, std::mt19937& rng, float scale = 1.0f) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return Tensor::from_f32(random_floats(static_cast<size_t>(n), rng, scale), shape);
}

inline std::vector<float> values(const Tensor& t) { return t.to_f32_vector(); }

// |got - want| <= atol + rtol * |want| for every element, reporting the first few failures.
inline void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rtol, double atol,
                         const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= atol + rtol * std::fabs(want[i]))) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
      if (++failures >= 5) return;
    }
  }
}

}  // namespace specula::testing
