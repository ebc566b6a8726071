// Backend::gather_columns: an EAGLE-3 head's logits over its draft vocabulary (32k for Llama-3.1-8B's)
// spread over the target's (128k), -inf where the head cannot draft. Memory bound: each thread
// writes consecutive output columns of one row (coalesced stores) and reads through the column map,
// whose reads are mostly ascending, so the L2 serves the scattered loads of the small source row.
#include <algorithm>

#include "backend/cuda/cuda_kernels.h"

namespace specula::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void gather_columns_kernel(const float* __restrict__ x, int64_t x_cols, const int32_t* __restrict__ columns,
                                      int64_t n, float fill, float* __restrict__ out) {
  const int64_t r = blockIdx.y;
  const float* src = x + r * x_cols;
  float* dst = out + r * n;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int32_t c = columns[j];
    dst[j] = c >= 0 ? src[c] : fill;
  }
}

}  // namespace

cudaError_t launch_gather_columns(const float* x, int64_t rows, int64_t x_cols, const int32_t* columns, int64_t n,
                                  float fill, float* out, cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 128);
  gather_columns_kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(rows)), kThreads, 0, stream>>>(
      x, x_cols, columns, n, fill, out);
  return cudaGetLastError();
}

}  // namespace specula::cuda
