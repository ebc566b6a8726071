// FP8 (e4m3) weights: the small-M GEMM of linear_fp8, the row quantiser, and the row scales
// applied after cuBLASLt's unscaled FP8 GEMM.
//
// Decode and speculative verification multiply 1-16 activation rows by the weights, so the cost
// is streaming the weights once: at one byte per weight the kernel must keep HBM busy, not the
// tensor cores (which would need the activations in FP8 too). Each warp owns NR output rows and
// walks K in 16-byte chunks (16 weights, one LDG.128 per row), up to kUnroll chunks in flight per
// lane so that enough loads are outstanding to cover HBM latency. Weight loads bypass L1
// (ld.global.nc.L1::no_allocate: each byte is read once), which leaves L1 to the activation rows
// every warp of the SM rereads. e4m3 -> f16 is one hardware conversion per pair on sm_89+
// (cvt.rn.f16x2.e4m3x2); products accumulate in fp32 per lane, then across the warp, and the row's
// scale multiplies the finished sum. Each row's sum is formed in the same order whatever M is, so a
// row's result does not depend on the batch it runs in.
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kUnroll = 4;
constexpr float kE4m3Max = 448.0f;

__device__ __forceinline__ uint4 load_streaming(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Two e4m3 values (low byte first) -> two floats.
__device__ __forceinline__ float2 fp8x2_to_float2(uint32_t pair) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

__device__ __forceinline__ void fp8x16_to_float(const uint4& v, float (&f)[16]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 lo = fp8x2_to_float2(words[i] & 0xffffu), hi = fp8x2_to_float2(words[i] >> 16);
    f[4 * i] = lo.x;
    f[4 * i + 1] = lo.y;
    f[4 * i + 2] = hi.x;
    f[4 * i + 3] = hi.y;
  }
}

// 16 bf16 activations -> floats (bf16 -> f32 is a shift).
__device__ __forceinline__ void bf16x16_to_float(const bf16* p, float (&f)[16]) {
  const uint4 a = *reinterpret_cast<const uint4*>(p), b = *reinterpret_cast<const uint4*>(p + 8);
  const uint32_t words[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    f[2 * i] = __uint_as_float(words[i] << 16);
    f[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

template <class Out>
__device__ __forceinline__ void store_out(void* out, int64_t i, float v) {
  static_cast<Out*>(out)[i] = from_float<Out>(v);
}

// out[mi, row] for mi < m, row < n; MT >= m rows of x, NR rows of w per warp.
template <int MT, int NR, class Out>
__global__ void __launch_bounds__(kWarps * 32)
    fp8_gemv_kernel(const bf16* __restrict__ x, const uint8_t* __restrict__ w, const float* __restrict__ scale,
                    const void* __restrict__ bias, bool bias_f32, void* __restrict__ out, int m, int64_t n, int64_t k) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * NR;
  if (row0 >= n) return;
  const uint8_t* rows[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) rows[r] = w + min(row0 + r, n - 1) * k;
  const bf16* xs[MT];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) xs[mi] = x + static_cast<int64_t>(min(mi, m - 1)) * k;

  float acc[NR][MT];
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) acc[r][mi] = 0.0f;

  const int64_t chunks = k / 16;
  for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kUnroll) {
    uint4 wv[kUnroll][NR];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + 32 * u;
#pragma unroll
      for (int r = 0; r < NR; ++r) wv[u][r] = c < chunks ? load_streaming(rows[r] + c * 16) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + 32 * u;
      if (c >= chunks) break;
      float wf[NR][16];
#pragma unroll
      for (int r = 0; r < NR; ++r) fp8x16_to_float(wv[u][r], wf[r]);
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        float xf[16];
        bf16x16_to_float(xs[mi] + c * 16, xf);
#pragma unroll
        for (int r = 0; r < NR; ++r)
#pragma unroll
          for (int j = 0; j < 16; ++j) acc[r][mi] = fmaf(wf[r][j], xf[j], acc[r][mi]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < NR; ++r) {
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
      const float sum = warp_sum(acc[r][mi]);
      const int64_t row = row0 + r;
      if (lane == (r * MT + mi) % 32 && mi < m && row < n) {
        float v = sum * scale[row];
        if (bias != nullptr) {
          v += bias_f32 ? static_cast<const float*>(bias)[row] : to_float(static_cast<const bf16*>(bias)[row]);
        }
        store_out<Out>(out, static_cast<int64_t>(mi) * n + row, v);
      }
    }
  }
}

template <int MT, int NR>
cudaError_t launch_gemv(const bf16* x, const uint8_t* w, const float* scale, const void* bias, bool bias_f32,
                        void* out, bool out_f32, int m, int64_t n, int64_t k, cudaStream_t stream) {
  const int64_t blocks = (n + kWarps * NR - 1) / (kWarps * NR);
  if (out_f32) {
    fp8_gemv_kernel<MT, NR, float>
        <<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(x, w, scale, bias, bias_f32, out, m, n, k);
  } else {
    fp8_gemv_kernel<MT, NR, bf16>
        <<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(x, w, scale, bias, bias_f32, out, m, n, k);
  }
  return cudaGetLastError();
}

// One block per row: the row's absolute maximum, then every element divided by its scale and
// rounded (to nearest even, saturating) to e4m3.
template <class T>
__global__ void quantize_fp8_rows_kernel(const T* __restrict__ x, int64_t k, uint8_t* __restrict__ out,
                                         float* __restrict__ scale) {
  __shared__ float partial[32];
  const T* row = x + static_cast<int64_t>(blockIdx.x) * k;
  float amax = 0.0f;
  for (int64_t c = threadIdx.x; c < k; c += blockDim.x) amax = fmaxf(amax, fabsf(to_float(row[c])));
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
  uint8_t* dst = out + static_cast<int64_t>(blockIdx.x) * k;
  for (int64_t c = threadIdx.x; c < k; c += blockDim.x) {
    dst[c] = __nv_cvt_float_to_fp8(to_float(row[c]) / s, __NV_SATFINITE, __NV_E4M3);
  }
}

template <class Out>
__global__ void fp8_scale_output_kernel(Out* __restrict__ out, const float* __restrict__ x_scale,
                                        const float* __restrict__ w_scale, const void* __restrict__ bias,
                                        bool bias_f32, int64_t n) {
  const int64_t i = blockIdx.y;
  const float xs = x_scale[i];
  Out* row = out + i * n;
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < n;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = to_float(row[r]) * xs * w_scale[r];
    if (bias != nullptr) {
      v += bias_f32 ? static_cast<const float*>(bias)[r] : to_float(static_cast<const bf16*>(bias)[r]);
    }
    row[r] = from_float<Out>(v);
  }
}

}  // namespace

cudaError_t launch_fp8_scale_output(void* out, DType out_dtype, const float* x_scale, const float* w_scale,
                                    const void* bias, DType bias_dtype, int64_t m, int64_t n, cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 64)),
                  static_cast<unsigned>(m));
  const bool bias_f32 = bias_dtype == DType::kF32;
  if (out_dtype == DType::kF32) {
    fp8_scale_output_kernel<float>
        <<<grid, kThreads, 0, stream>>>(static_cast<float*>(out), x_scale, w_scale, bias, bias_f32, n);
  } else {
    fp8_scale_output_kernel<bf16>
        <<<grid, kThreads, 0, stream>>>(static_cast<bf16*>(out), x_scale, w_scale, bias, bias_f32, n);
  }
  return cudaGetLastError();
}

bool fp8_gemv_supports(int64_t m, int64_t k, const void* x, const void* w) {
  return m >= 1 && m <= kFp8GemvMaxRows && k % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

cudaError_t launch_fp8_gemv(const void* x, const uint8_t* w, const float* scale, const void* bias, DType bias_dtype,
                            void* out, DType out_dtype, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  const auto* xb = static_cast<const bf16*>(x);
  const bool bias_f32 = bias_dtype == DType::kF32, out_f32 = out_dtype == DType::kF32;
  const int mi = static_cast<int>(m);
  // Rows of w per warp: more rows reuse each activation chunk read from L1 more often, which
  // matters once several activation rows are read per weight chunk.
  if (m == 1) return launch_gemv<1, 2>(xb, w, scale, bias, bias_f32, out, out_f32, mi, n, k, stream);
  if (m == 2) return launch_gemv<2, 2>(xb, w, scale, bias, bias_f32, out, out_f32, mi, n, k, stream);
  if (m <= 4) return launch_gemv<4, 2>(xb, w, scale, bias, bias_f32, out, out_f32, mi, n, k, stream);
  if (m <= 8) return launch_gemv<8, 2>(xb, w, scale, bias, bias_f32, out, out_f32, mi, n, k, stream);
  return launch_gemv<16, 2>(xb, w, scale, bias, bias_f32, out, out_f32, mi, n, k, stream);
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
