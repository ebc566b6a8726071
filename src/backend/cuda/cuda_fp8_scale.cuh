// The value an FP8 GEMM's unscaled product stands for: shared by the scale passes after
// cuBLASLt's GEMM (cuda_fp8_linear.cu) and the attention prologue that reads the qkv product
// unscaled (cuda_qkv_prologue.cu), so that both round the same expression to the same bits.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {

// Column r of a row whose activations had scale xs: product * xs * w_scale[r] (+ bias[r]), each
// operation rounded on its own: the compiler may fuse a multiply and an add into one FMA in one
// kernel and not in another, which moved the bias rows' last bits between the two callers.
__device__ __forceinline__ float fp8_scaled(float product, float xs, const float* __restrict__ w_scale,
                                            const void* __restrict__ bias, bool bias_f32, int64_t r) {
  float v = __fmul_rn(__fmul_rn(product, xs), w_scale[r]);
  if (bias != nullptr)
    v = __fadd_rn(v, bias_f32 ? static_cast<const float*>(bias)[r] : to_float(static_cast<const bf16*>(bias)[r]));
  return v;
}

}  // namespace specula::cuda
