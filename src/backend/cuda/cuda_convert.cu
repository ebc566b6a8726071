// Dtype conversion between the float storage formats (F32, F16, BF16) on the device.
// Memory-bound: a grid-stride loop with enough blocks to cover every SM a few times.
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

template <class In, class Out>
__global__ void cast_kernel(const In* __restrict__ src, Out* __restrict__ dst, int64_t n) {
  allow_next_kernel_start();
  wait_for_previous_kernels();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = from_float<Out>(to_float(src[i]));
  }
}

template <class In>
cudaError_t cast_from(const In* src, void* dst, DType to, int64_t n, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int blocks = static_cast<int>(n / kThreads + 1 < 8192 ? n / kThreads + 1 : 8192);
  const LaunchShape shape{dim3(blocks), dim3(kThreads)};
  switch (to) {
    case DType::kF32: return launch_overlapped(cast_kernel<In, float>, shape, stream, src, static_cast<float*>(dst), n);
    case DType::kF16: return launch_overlapped(cast_kernel<In, __half>, shape, stream, src, static_cast<__half*>(dst), n);
    case DType::kBF16: return launch_overlapped(cast_kernel<In, bf16>, shape, stream, src, static_cast<bf16*>(dst), n);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_cast(const void* src, DType from, void* dst, DType to, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (from) {
    case DType::kF32: return cast_from(static_cast<const float*>(src), dst, to, n, stream);
    case DType::kF16: return cast_from(static_cast<const __half*>(src), dst, to, n, stream);
    case DType::kBF16: return cast_from(static_cast<const bf16*>(src), dst, to, n, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace specula::cuda
