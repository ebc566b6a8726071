// Backend::copy_many's host-to-device form: several small pinned host ranges copied by one kernel
// that reads them over PCIe (pinned memory is mapped into the device's address space under
// unified addressing). A cudaMemcpyAsync of its own costs the stream ~1.1 us and leaves a ~2 us
// gap before the next; a proposer's step stages ~9 inputs of a few hundred bytes each.
#include <cstdint>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"

namespace specula::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kHeld = 4;  // 16-byte pieces a thread reads before it waits: 16 KB a range

// One block a range: each is small (a step's ids, positions, slots, lengths, block tables). The
// host wrote the ranges before the launch, so they are read over PCIe (a ~2 us round trip) while
// the previous kernel drains (programmatic dependent launch); only the stores wait for it, since
// an earlier kernel may still read the destinations.
__global__ void copy_ranges_kernel(CopyRanges r) {
  allow_next_kernel_start();
  const int i = blockIdx.x;
  const char* src = static_cast<const char*>(r.src[i]);
  char* dst = static_cast<char*>(r.dst[i]);
  const int64_t bytes = r.bytes[i];
  const bool aligned = ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0;
  const int64_t pieces = aligned ? bytes / 16 : 0;
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* d = reinterpret_cast<uint4*>(dst);
  uint4 held[kHeld];
#pragma unroll
  for (int c = 0; c < kHeld; ++c) {
    const int64_t j = threadIdx.x + c * kThreads;
    if (j < pieces) held[c] = s[j];
  }
  // The last (fewer than 16) bytes of an aligned range: a byte each for the first threads.
  const int64_t tail = pieces * 16 + threadIdx.x;
  const bool holds_tail = aligned && threadIdx.x < 16 && tail < bytes;
  const char tail_byte = holds_tail ? src[tail] : 0;
  wait_for_previous_kernels();
#pragma unroll
  for (int c = 0; c < kHeld; ++c) {
    const int64_t j = threadIdx.x + c * kThreads;
    if (j < pieces) d[j] = held[c];
  }
  for (int64_t j = threadIdx.x + kHeld * kThreads; j < pieces; j += kThreads) d[j] = s[j];
  if (holds_tail) dst[tail] = tail_byte;
  if (!aligned)
    for (int64_t j = threadIdx.x; j < bytes; j += kThreads) dst[j] = src[j];
}

}  // namespace

cudaError_t launch_copy_ranges(const CopyRanges& ranges, cudaStream_t stream) {
  if (ranges.count == 0) return cudaSuccess;
  LaunchShape shape;
  shape.grid = dim3(static_cast<unsigned>(ranges.count));
  shape.block = dim3(kThreads);
  return launch_overlapped(copy_ranges_kernel, shape, stream, ranges);
}

}  // namespace specula::cuda
