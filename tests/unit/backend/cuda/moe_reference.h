// fused_moe with the CUDA backend's rounding, computed plainly on the host: every product in fp32
// (double for the dots, so that the reference itself adds no summation-order noise), rounded to
// bf16 where the GPU rounds (gate and up, silu(gate) * up, each expert's output row), the weighted
// sum over the columns in fp32 in column order, rounded once. The CPU backend's fused_moe is the
// same computation without the intermediate roundings. Ids outside [0, E) contribute nothing.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace specula::testing {

inline float round_to_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// x [T, H], w13 [E, 2I, H], w2 [E, H, I], ids / weights [T, C] -> [T, H] (values already bf16-rounded).
inline std::vector<float> fused_moe_bf16_reference(const std::vector<float>& x, const std::vector<float>& w13,
                                                   const std::vector<float>& w2, const std::vector<int32_t>& ids,
                                                   const std::vector<float>& weights, int64_t t, int64_t h,
                                                   int64_t inter, int64_t e, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(t * h));
  std::vector<float> act(static_cast<size_t>(inter)), acc(static_cast<size_t>(h));
  for (int64_t tok = 0; tok < t; ++tok) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    const float* xr = x.data() + tok * h;
    for (int64_t c = 0; c < cols; ++c) {
      const int32_t ex = ids[tok * cols + c];
      if (ex < 0 || ex >= e) continue;
      for (int64_t i = 0; i < inter; ++i) {
        const float* gate = w13.data() + (ex * 2 * inter + i) * h;
        const float* up = gate + inter * h;
        double g = 0, u = 0;
        for (int64_t k = 0; k < h; ++k) {
          g += double(xr[k]) * gate[k];
          u += double(xr[k]) * up[k];
        }
        const float gr = round_to_bf16(static_cast<float>(g)), ur = round_to_bf16(static_cast<float>(u));
        act[i] = round_to_bf16(gr / (1.0f + std::exp(-gr)) * ur);
      }
      const float w = weights[tok * cols + c];
      for (int64_t n = 0; n < h; ++n) {
        const float* down = w2.data() + (ex * h + n) * inter;
        double y = 0;
        for (int64_t i = 0; i < inter; ++i) y += double(act[i]) * down[i];
        acc[n] += w * round_to_bf16(static_cast<float>(y));
      }
    }
    for (int64_t n = 0; n < h; ++n) out[tok * h + n] = round_to_bf16(acc[n]);
  }
  return out;
}

}  // namespace specula::testing
