// Speculative decoding's launch-ahead (Backend::shift_by_accepted): a thread per request counts
// its accepted drafts and moves its few staged entries. A step has at most max_num_seqs requests
// of up to k + 1 entries, so the launch is the whole cost (~2 us), against the host round trip
// (read the verification, stage, upload) it takes off the device's critical path.
#include "backend/cuda/cuda_engine_kernels.h"

namespace specula::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void shift_by_accepted_kernel(AcceptedShiftParams p) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.num_requests) return;
  const int64_t row = static_cast<int64_t>(i) * (p.k + 1);
  int accepted = 0;
  while (accepted < p.k && p.inputs[row + accepted + 1] == p.sampled[row + accepted]) ++accepted;
  for (int e = 0; e < p.entries; ++e) {
    const int64_t at = static_cast<int64_t>(i) * p.request_stride + static_cast<int64_t>(e) * p.entry_stride;
    const int32_t pos = p.positions[at] + accepted;
    p.positions[at] = pos;
    if (p.slots && p.slots[at] >= 0) {
      const int64_t block = pos / p.block_size;
      p.slots[at] = block < p.width
                        ? static_cast<int64_t>(p.block_tables[i * p.width + block]) * p.block_size + pos % p.block_size
                        : -1;
    }
    if (p.tokens) p.tokens[at] = e == 0 ? p.inputs[row + accepted] : p.sampled[row + accepted];
    if (p.seq_lens && (e == 0 || p.seq_lens_entry_stride != 0))
      p.seq_lens[static_cast<int64_t>(i) * p.seq_lens_request_stride +
                 static_cast<int64_t>(e) * p.seq_lens_entry_stride] += accepted;
  }
}

}  // namespace

cudaError_t launch_shift_by_accepted(const AcceptedShiftParams& p, cudaStream_t stream) {
  if (p.num_requests == 0) return cudaSuccess;
  const int blocks = (p.num_requests + kThreads - 1) / kThreads;
  shift_by_accepted_kernel<<<blocks, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace specula::cuda
