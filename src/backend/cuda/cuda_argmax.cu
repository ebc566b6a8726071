// Row-wise argmax (Backend::argmax_rows): the greedy draft chain's on-device sampler. A block per
// row: a draft step's logits are a few rows of 8k-152k floats, so one row is a few hundred KB at
// most and a block of 256 threads reads it in coalesced strided passes; the launch is what costs
// (~2-3 us), which is why it replaces a host round trip per draft token.
#include <climits>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void argmax_rows_kernel(const float* __restrict__ x, int64_t x_rows, int64_t vocab,
                                   const int32_t* __restrict__ rows, int32_t* __restrict__ out) {
  const int64_t r = rows ? rows[blockIdx.x] : blockIdx.x;
  if (r < 0 || r >= x_rows) {
    if (threadIdx.x == 0) out[blockIdx.x] = 0;
    return;
  }
  const float* row = x + r * vocab;
  float best = -INFINITY;
  int best_i = INT_MAX;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = row[i];
    if (argmax_better(v, static_cast<int>(i), best, best_i)) {
      best = v;
      best_i = static_cast<int>(i);
    }
  }
  // Warp, then block: 8 warps' winners through shared memory.
  warp_argmax(best, best_i);
  __shared__ float sv[kThreads / 32];
  __shared__ int si[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sv[warp] = best;
    si[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w)
      if (argmax_better(sv[w], si[w], best, best_i)) {
        best = sv[w];
        best_i = si[w];
      }
    // Only NaN (or nothing) seen: index 0, as the host's loop leaves it.
    out[blockIdx.x] = best_i == INT_MAX ? 0 : best_i;
  }
}

}  // namespace

cudaError_t launch_argmax_rows(const float* x, int64_t x_rows, int64_t vocab, const int32_t* rows, int64_t n,
                               int32_t* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  argmax_rows_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, x_rows, vocab, rows, out);
  return cudaGetLastError();
}

}  // namespace specula::cuda
