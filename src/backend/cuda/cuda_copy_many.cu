// Backend::copy_many's host-to-device form: several small pinned host ranges copied by one kernel
// that reads them over PCIe (pinned memory is mapped into the device's address space under
// unified addressing). A cudaMemcpyAsync of its own costs the stream ~1.1 us and leaves a ~2 us
// gap before the next; a proposer's step stages ~9 inputs of a few hundred bytes each.
#include <cstdint>

#include "backend/cuda/cuda_kernels.h"

namespace specula::cuda {
namespace {

constexpr int kThreads = 256;

// One block a range: each is small (a step's ids, positions, slots, lengths, block tables), so a
// block's 16-byte loads cover it in one or two rounds of PCIe reads.
__global__ void copy_ranges_kernel(CopyRanges r) {
  const int i = blockIdx.x;
  const char* src = static_cast<const char*>(r.src[i]);
  char* dst = static_cast<char*>(r.dst[i]);
  const int64_t bytes = r.bytes[i];
  int64_t vector_bytes = 0;
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0) {
    vector_bytes = bytes & ~int64_t{15};
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (int64_t j = threadIdx.x; j < vector_bytes / 16; j += kThreads) d[j] = s[j];
  }
  for (int64_t j = vector_bytes + threadIdx.x; j < bytes; j += kThreads) dst[j] = src[j];
}

}  // namespace

cudaError_t launch_copy_ranges(const CopyRanges& ranges, cudaStream_t stream) {
  if (ranges.count == 0) return cudaSuccess;
  copy_ranges_kernel<<<ranges.count, kThreads, 0, stream>>>(ranges);
  return cudaGetLastError();
}

}  // namespace specula::cuda
