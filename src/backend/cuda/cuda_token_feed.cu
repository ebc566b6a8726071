// Async scheduling's draft feed (Backend::feed_tokens): a step's input ids that name a draft by its
// index in the previous step's device output get its value. One thread per input id: a step has
// at most a few thousand, so the launch is the whole cost (~2 us), far below the host round trip
// the feed replaces.
#include "backend/cuda/cuda_kernels.h"

namespace specula::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void feed_tokens_kernel(int32_t* __restrict__ token_ids, int64_t n, const int32_t* __restrict__ source,
                                   int64_t source_len) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t id = token_ids[i];
  if (id >= 0) return;
  const int64_t at = -(static_cast<int64_t>(id) + 1);
  token_ids[i] = at < source_len ? source[at] : 0;
}

}  // namespace

cudaError_t launch_feed_tokens(int32_t* token_ids, int64_t n, const int32_t* source, int64_t source_len,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  feed_tokens_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(token_ids, n, source, source_len);
  return cudaGetLastError();
}

}  // namespace specula::cuda
