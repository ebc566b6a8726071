// RMSNorm and the fused residual-add + RMSNorm.
//
// Shape: one block per row. A row (hidden size 1k-8k) fits one block's threads with a 16-byte
// vector each, so the sum of squares is one block reduction (warp shuffles, then one value per
// warp through shared memory) and each thread re-reads only the elements it loaded itself (from
// L1/L2) for the scaled write. Decode batches have few rows, so a block per row with up to 1024
// threads is what keeps the SMs' load units busy there. fp32 sums; storage rounding as torch
// does in bf16: the fused residual is rounded to the storage type before it is normalised.
#include <algorithm>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

// FUSED: residual += x (stored), then x = norm(residual) * w. Otherwise out = norm(x) * w.
template <class T, bool FUSED>
__global__ void rms_norm_kernel(T* x, T* residual, const T* __restrict__ w, T* out, int64_t h, float eps, bool vec) {
  __shared__ float reduce_buf[32];
  allow_next_kernel_start();
  wait_for_previous_kernels();
  constexpr int kN = Vec16<T>::kN;
  const int64_t row = blockIdx.x;
  T* xr = x + row * h;
  T* rr = FUSED ? residual + row * h : nullptr;
  T* src = FUSED ? rr : xr;  // what gets normalised
  T* dst = FUSED ? xr : out + row * h;

  float sum_sq = 0.0f;
  if (vec) {
    for (int64_t v = threadIdx.x; v < h / kN; v += blockDim.x) {
      float a[kN];
      load_vec(xr + v * kN, a);
      if constexpr (FUSED) {
        float r[kN];
        load_vec(rr + v * kN, r);
#pragma unroll
        for (int i = 0; i < kN; ++i) a[i] = to_float(from_float<T>(a[i] + r[i]));  // as stored
        store_vec(rr + v * kN, a);
      }
#pragma unroll
      for (int i = 0; i < kN; ++i) sum_sq += a[i] * a[i];
    }
  } else {
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
      float a = to_float(xr[i]);
      if constexpr (FUSED) {
        const T stored = from_float<T>(a + to_float(rr[i]));
        rr[i] = stored;
        a = to_float(stored);
      }
      sum_sq += a * a;
    }
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq, reduce_buf) / static_cast<float>(h) + eps);

  // Each thread reads back exactly the elements it wrote above, so no barrier is needed between
  // the residual store and this read, and out may alias x.
  if (vec) {
    for (int64_t v = threadIdx.x; v < h / kN; v += blockDim.x) {
      float a[kN], g[kN];
      load_vec(src + v * kN, a);
      load_vec(w + v * kN, g);
#pragma unroll
      for (int i = 0; i < kN; ++i) a[i] = g[i] * (a[i] * inv_rms);
      store_vec(dst + v * kN, a);
    }
  } else {
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
      dst[i] = from_float<T>(to_float(w[i]) * (to_float(src[i]) * inv_rms));
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <class T, bool FUSED>
cudaError_t launch_typed(void* x, void* residual, const void* w, void* out, int64_t rows, int64_t h, float eps,
                         cudaStream_t stream) {
  constexpr int kN = Vec16<T>::kN;
  const bool vec = h % kN == 0 && aligned16(x) && aligned16(w) && (FUSED ? aligned16(residual) : aligned16(out));
  const int64_t per_thread_items = vec ? h / kN : h;
  // One item per thread up to 1024 threads; a multiple of the warp size for the block reduction.
  const int threads = static_cast<int>(std::clamp<int64_t>((per_thread_items + 31) / 32 * 32, 32, 1024));
  return launch_overlapped(rms_norm_kernel<T, FUSED>, {dim3(static_cast<unsigned>(rows)), dim3(threads)}, stream,
                           static_cast<T*>(x), static_cast<T*>(residual), static_cast<const T*>(w),
                           static_cast<T*>(out), h, eps, vec);
}

}  // namespace

cudaError_t launch_rms_norm(const void* x, const void* w, void* out, int64_t rows, int64_t h, float eps, DType dtype,
                            cudaStream_t stream) {
  if (rows == 0 || h == 0) return cudaSuccess;
  void* xm = const_cast<void*>(x);  // read only when not fused
  if (dtype == DType::kBF16) return launch_typed<bf16, false>(xm, nullptr, w, out, rows, h, eps, stream);
  if (dtype == DType::kF32) return launch_typed<float, false>(xm, nullptr, w, out, rows, h, eps, stream);
  return cudaErrorInvalidValue;
}

cudaError_t launch_add_rms_norm(void* x, void* residual, const void* w, int64_t rows, int64_t h, float eps,
                                DType dtype, cudaStream_t stream) {
  if (rows == 0 || h == 0) return cudaSuccess;
  if (dtype == DType::kBF16) return launch_typed<bf16, true>(x, residual, w, nullptr, rows, h, eps, stream);
  if (dtype == DType::kF32) return launch_typed<float, true>(x, residual, w, nullptr, rows, h, eps, stream);
  return cudaErrorInvalidValue;
}

}  // namespace specula::cuda
