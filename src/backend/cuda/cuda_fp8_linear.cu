// FP8 (e4m3) weights: the row quantiser (alone or after an RMSNorm) and the row scales applied
// after cuBLASLt's unscaled FP8 GEMM (alone or with SwiGLU); the small-M kernel is cuda_gemv.cu's.
// Every kernel here starts overlapped with the one before it (cuda_launch.cuh): at a decode batch
// each is a few microseconds, about what a launch gap costs.
#include <cuda_fp8.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_fp8_scale.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

constexpr float kE4m3Max = 448.0f;

__device__ __forceinline__ uint8_t e4m3_code(float v, float s) {
  return __nv_cvt_float_to_fp8(v / s, __NV_SATFINITE, __NV_E4M3);
}

// One block per row: the row's absolute maximum, then every element divided by its scale and
// rounded (to nearest even, saturating) to e4m3.
template <class T>
__global__ void quantize_fp8_rows_kernel(const T* __restrict__ x, int64_t k, uint8_t* __restrict__ out,
                                         float* __restrict__ scale) {
  __shared__ float partial[32];
  allow_next_kernel_start();
  wait_for_previous_kernels();
  const T* row = x + static_cast<int64_t>(blockIdx.x) * k;
  // bf16 rows of whole 16-byte chunks are read 8 elements a load, a chunk a thread (unrolled
  // where a row has more chunks than the block threads), so that a row's loads are all in flight
  // at once (a row is read twice: the second pass mostly from L1), and their codes stored 8 at a
  // time. One element a load, each waited for, made the quantiser cost what the GEMM after it did.
  const bool chunks = std::is_same_v<T, bf16> && k % 8 == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0 &&
                      (reinterpret_cast<uintptr_t>(out) & 7u) == 0;
  float amax = 0.0f;
  if (chunks) {
#pragma unroll 4
    for (int64_t c = threadIdx.x; c < k / 8; c += blockDim.x) {
      float f[8];
      unpack8(*reinterpret_cast<const uint4*>(row + c * 8), f);
#pragma unroll
      for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(f[i]));
    }
  } else {
    for (int64_t c = threadIdx.x; c < k; c += blockDim.x) amax = fmaxf(amax, fabsf(to_float(row[c])));
  }
  amax = block_max(amax, partial);
  const float s = amax > 0.0f ? amax / kE4m3Max : 1.0f;
  if (threadIdx.x == 0) scale[blockIdx.x] = s;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * k;
  if (chunks) {
#pragma unroll 4
    for (int64_t c = threadIdx.x; c < k / 8; c += blockDim.x) {
      float f[8];
      unpack8(*reinterpret_cast<const uint4*>(row + c * 8), f);
      uint8_t codes[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) codes[i] = e4m3_code(f[i], s);
      *reinterpret_cast<uint2*>(out + base + c * 8) = *reinterpret_cast<const uint2*>(codes);
    }
  } else {
    for (int64_t c = threadIdx.x; c < k; c += blockDim.x) out[base + c] = e4m3_code(to_float(row[c]), s);
  }
}

// RMSNorm and the row quantiser in one kernel (one block a row, 8 elements a chunk): the row
// normalised and rounded to bf16 as rms_norm stores it, then its absolute maximum, scale and
// codes; the normalised row itself is never stored.
__global__ void rms_norm_quantize_fp8_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, int64_t k,
                                             float eps, uint8_t* __restrict__ out, float* __restrict__ scale) {
  __shared__ float partial[32];
  allow_next_kernel_start();
  wait_for_previous_kernels();
  const bf16* row = x + static_cast<int64_t>(blockIdx.x) * k;
  const int64_t chunks = k / 8;
  float sum_sq = 0.0f;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    float a[8];
    unpack8(*reinterpret_cast<const uint4*>(row + c * 8), a);
#pragma unroll
    for (int i = 0; i < 8; ++i) sum_sq += a[i] * a[i];
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq, partial) / static_cast<float>(k) + eps);
  auto normed = [&](int64_t c, float (&y)[8]) {  // the chunk as rms_norm stores it (L1 hits)
    float a[8], g[8];
    unpack8(*reinterpret_cast<const uint4*>(row + c * 8), a);
    unpack8(*reinterpret_cast<const uint4*>(w + c * 8), g);
#pragma unroll
    for (int i = 0; i < 8; ++i) y[i] = round_bf16(g[i] * (a[i] * inv_rms));
  };
  float amax = 0.0f;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    float y[8];
    normed(c, y);
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(y[i]));
  }
  amax = block_max(amax, partial);
  const float s = amax > 0.0f ? amax / kE4m3Max : 1.0f;
  if (threadIdx.x == 0) scale[blockIdx.x] = s;
  uint8_t* codes_row = out + static_cast<int64_t>(blockIdx.x) * k;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    float y[8];
    normed(c, y);
    uint8_t codes[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) codes[i] = e4m3_code(y[i], s);
    *reinterpret_cast<uint2*>(codes_row + c * 8) = *reinterpret_cast<const uint2*>(codes);
  }
}

// Row i = blockIdx.y; a thread scales a 16-byte chunk of columns (VEC) or one column. Scalar
// loads of the product's bf16 columns left the pass at ~5.7 us a projection at 64 rows, more
// than the quantiser (H200).
template <class Out, bool VEC>
__global__ void fp8_scale_output_kernel(const Out* in, Out* out, const float* __restrict__ x_scale,
                                        const float* __restrict__ w_scale, const void* __restrict__ bias,
                                        bool bias_f32, bool accumulate, int64_t n) {
  allow_next_kernel_start();
  wait_for_previous_kernels();
  constexpr int kN = VEC ? Vec16<Out>::kN : 1;
  const int64_t i = blockIdx.y;
  const float xs = x_scale[i];
  const Out* src = in + i * n;
  Out* dst = out + i * n;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < n / kN;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v[kN], residual[kN];
    if constexpr (VEC) {
      load_vec(src + c * kN, v);
      if (accumulate) load_vec(dst + c * kN, residual);
    } else {
      v[0] = to_float(src[c]);
      if (accumulate) residual[0] = to_float(dst[c]);
    }
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      v[j] = fp8_scaled(v[j], xs, w_scale, bias, bias_f32, c * kN + j);
      if (accumulate) v[j] = residual[j] + to_float(from_float<Out>(v[j]));
    }
    if constexpr (VEC) {
      store_vec(dst + c * kN, v);
    } else {
      dst[c] = from_float<Out>(v[0]);
    }
  }
}

// SwiGLU over the scaled product: out[i, c] = silu(g) * u with g and u the gate and up columns c
// and inter + c as the scale pass stores them, so it equals the scale pass then silu_mul.
template <class Out, bool VEC>
__global__ void fp8_scale_silu_kernel(const Out* in, Out* out, const float* __restrict__ x_scale,
                                      const float* __restrict__ w_scale, const void* __restrict__ bias,
                                      bool bias_f32, int64_t inter) {
  allow_next_kernel_start();
  wait_for_previous_kernels();
  constexpr int kN = VEC ? Vec16<Out>::kN : 1;
  const int64_t i = blockIdx.y;
  const float xs = x_scale[i];
  const Out* src = in + i * 2 * inter;
  Out* dst = out + i * inter;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < inter / kN;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float g[kN], u[kN];
    if constexpr (VEC) {
      load_vec(src + c * kN, g);
      load_vec(src + inter + c * kN, u);
    } else {
      g[0] = to_float(src[c]);
      u[0] = to_float(src[inter + c]);
    }
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      const int64_t col = c * kN + j;
      const float gate = to_float(from_float<Out>(fp8_scaled(g[j], xs, w_scale, bias, bias_f32, col)));
      const float up = to_float(from_float<Out>(fp8_scaled(u[j], xs, w_scale, bias, bias_f32, inter + col)));
      g[j] = silu(gate) * up;
    }
    if constexpr (VEC) {
      store_vec(dst + c * kN, g);
    } else {
      dst[c] = from_float<Out>(g[0]);
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Rows of `cols` columns (or chunks of them) over blocks of 256 threads: at most 64 blocks a row.
dim3 row_grid(int64_t cols, int64_t rows) {
  return dim3(static_cast<unsigned>(std::clamp<int64_t>((cols + 255) / 256, 1, 64)), static_cast<unsigned>(rows));
}

template <class Out>
cudaError_t launch_scale_typed(const void* in, void* out, const float* x_scale, const float* w_scale,
                               const void* bias, bool bias_f32, bool accumulate, int64_t m, int64_t n,
                               cudaStream_t stream) {
  constexpr int kN = Vec16<Out>::kN;
  const auto* src = static_cast<const Out*>(in);
  auto* dst = static_cast<Out*>(out);
  if (n % kN == 0 && aligned16(in) && aligned16(out)) {
    return launch_overlapped(fp8_scale_output_kernel<Out, true>, {row_grid(n / kN, m), dim3(256)}, stream, src, dst,
                             x_scale, w_scale, bias, bias_f32, accumulate, n);
  }
  return launch_overlapped(fp8_scale_output_kernel<Out, false>, {row_grid(n, m), dim3(256)}, stream, src, dst,
                           x_scale, w_scale, bias, bias_f32, accumulate, n);
}

template <class Out>
cudaError_t launch_scale_silu_typed(const void* in, void* out, const float* x_scale, const float* w_scale,
                                    const void* bias, bool bias_f32, int64_t m, int64_t inter, cudaStream_t stream) {
  constexpr int kN = Vec16<Out>::kN;
  const auto* src = static_cast<const Out*>(in);
  auto* dst = static_cast<Out*>(out);
  if (inter % kN == 0 && aligned16(in) && aligned16(out)) {
    return launch_overlapped(fp8_scale_silu_kernel<Out, true>, {row_grid(inter / kN, m), dim3(256)}, stream, src,
                             dst, x_scale, w_scale, bias, bias_f32, inter);
  }
  return launch_overlapped(fp8_scale_silu_kernel<Out, false>, {row_grid(inter, m), dim3(256)}, stream, src, dst,
                           x_scale, w_scale, bias, bias_f32, inter);
}

}  // namespace

cudaError_t launch_fp8_scale_output(const void* in, void* out, DType out_dtype, const float* x_scale,
                                    const float* w_scale, const void* bias, DType bias_dtype, bool accumulate,
                                    int64_t m, int64_t n, cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  const bool bias_f32 = bias_dtype == DType::kF32;
  if (out_dtype == DType::kF32)
    return launch_scale_typed<float>(in, out, x_scale, w_scale, bias, bias_f32, accumulate, m, n, stream);
  return launch_scale_typed<bf16>(in, out, x_scale, w_scale, bias, bias_f32, accumulate, m, n, stream);
}

cudaError_t launch_fp8_scale_silu(const void* in, void* out, DType out_dtype, const float* x_scale,
                                  const float* w_scale, const void* bias, DType bias_dtype, int64_t m, int64_t inter,
                                  cudaStream_t stream) {
  if (m == 0 || inter == 0) return cudaSuccess;
  const bool bias_f32 = bias_dtype == DType::kF32;
  if (out_dtype == DType::kF32)
    return launch_scale_silu_typed<float>(in, out, x_scale, w_scale, bias, bias_f32, m, inter, stream);
  return launch_scale_silu_typed<bf16>(in, out, x_scale, w_scale, bias, bias_f32, m, inter, stream);
}

cudaError_t launch_quantize_fp8_rows(const void* x, DType dtype, int64_t rows, int64_t k, uint8_t* out, float* scale,
                                     cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  // A bf16 row a chunk of 8 a thread, up to 1024 threads: a decode batch has a block per SM or
  // fewer, so each block's loads in flight set the time (256 threads over 14336-element rows of
  // 64: 5.1 us, H200).
  const int threads =
      dtype == DType::kF32 ? 256 : static_cast<int>(std::clamp<int64_t>((k / 8 + 31) / 32 * 32, 128, 1024));
  const LaunchShape shape{dim3(static_cast<unsigned>(rows)), dim3(threads)};
  if (dtype == DType::kF32)
    return launch_overlapped(quantize_fp8_rows_kernel<float>, shape, stream, static_cast<const float*>(x), k, out,
                             scale);
  return launch_overlapped(quantize_fp8_rows_kernel<bf16>, shape, stream, static_cast<const bf16*>(x), k, out, scale);
}

bool rms_norm_quantize_fp8_supports(const void* x, const void* w, int64_t k, const uint8_t* out) {
  return k % 8 == 0 && aligned16(x) && aligned16(w) && (reinterpret_cast<uintptr_t>(out) & 7u) == 0;
}

cudaError_t launch_rms_norm_quantize_fp8(const void* x, const void* w, int64_t rows, int64_t k, float eps,
                                         uint8_t* out, float* scale, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (!rms_norm_quantize_fp8_supports(x, w, k, out)) return cudaErrorInvalidValue;
  // A chunk a thread up to 1024 threads (k <= 8192), in whole warps for the block reductions.
  const int threads = static_cast<int>(std::clamp<int64_t>((k / 8 + 31) / 32 * 32, 32, 1024));
  return launch_overlapped(rms_norm_quantize_fp8_kernel, {dim3(static_cast<unsigned>(rows)), dim3(threads)}, stream,
                           static_cast<const bf16*>(x), static_cast<const bf16*>(w), k, eps, out, scale);
}

}  // namespace specula::cuda
