// FP8 (e4m3) weights: the row quantiser and the row scales applied after cuBLASLt's unscaled FP8
// GEMM (the small-M kernel is cuda_gemv.cu's).
#include <cuda_fp8.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_kernels.h"
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
  const T* row = x + static_cast<int64_t>(blockIdx.x) * k;
  // bf16 rows of whole 16-byte chunks are read 8 elements a load, unrolled so that each thread
  // has several loads in flight (a row is read twice: the second pass mostly from L1), and their
  // codes stored 8 at a time. One element a load, each load waited for before the next, cost a
  // 64-row batch of Llama-3.1-8B ~6 us a projection, 0.7 ms of its 5.8 ms step (H200).
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
  amax = warp_max(amax);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = amax;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
    v = warp_max(v);
    if (threadIdx.x == 0) partial[0] = v;
  }
  __syncthreads();
  const float s = partial[0] > 0.0f ? partial[0] / kE4m3Max : 1.0f;
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

template <class Out>
__global__ void fp8_scale_output_kernel(const Out* in, Out* out, const float* __restrict__ x_scale,
                                        const float* __restrict__ w_scale, const void* __restrict__ bias,
                                        bool bias_f32, bool accumulate, int64_t n) {
  const int64_t i = blockIdx.y;
  const float xs = x_scale[i];
  const Out* src = in + i * n;
  Out* dst = out + i * n;
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < n;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = to_float(src[r]) * xs * w_scale[r];
    if (bias != nullptr) {
      v += bias_f32 ? static_cast<const float*>(bias)[r] : to_float(static_cast<const bf16*>(bias)[r]);
    }
    dst[r] = accumulate ? from_float<Out>(to_float(dst[r]) + to_float(from_float<Out>(v))) : from_float<Out>(v);
  }
}

}  // namespace

cudaError_t launch_fp8_scale_output(const void* in, void* out, DType out_dtype, const float* x_scale,
                                    const float* w_scale, const void* bias, DType bias_dtype, bool accumulate,
                                    int64_t m, int64_t n, cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 64)),
                  static_cast<unsigned>(m));
  const bool bias_f32 = bias_dtype == DType::kF32;
  if (out_dtype == DType::kF32) {
    fp8_scale_output_kernel<float><<<grid, kThreads, 0, stream>>>(
        static_cast<const float*>(in), static_cast<float*>(out), x_scale, w_scale, bias, bias_f32, accumulate, n);
  } else {
    fp8_scale_output_kernel<bf16><<<grid, kThreads, 0, stream>>>(
        static_cast<const bf16*>(in), static_cast<bf16*>(out), x_scale, w_scale, bias, bias_f32, accumulate, n);
  }
  return cudaGetLastError();
}

cudaError_t launch_quantize_fp8_rows(const void* x, DType dtype, int64_t rows, int64_t k, uint8_t* out, float* scale,
                                     cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  if (dtype == DType::kF32) {
    quantize_fp8_rows_kernel<float>
        <<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(static_cast<const float*>(x), k, out, scale);
  } else {
    quantize_fp8_rows_kernel<bf16>
        <<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(static_cast<const bf16*>(x), k, out, scale);
  }
  return cudaGetLastError();
}

}  // namespace specula::cuda
