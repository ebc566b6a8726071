// The peer all-reduce's kernel; see peer_all_reduce.h.
#include <algorithm>

#include "backend/cuda/cuda_utils.cuh"
#include "backend/cuda/peer_all_reduce.h"

namespace specula {
namespace cuda {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ void store_release(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Block b sums the 16-byte units [b * per_block, (b + 1) * per_block) of `data`. Every launch has
// kPeerMaxBlocks blocks, so that every block's epoch (and with it the staging buffer's parity) is
// the call count: were a block's epoch to lag behind block 0's, its buffer could be the one that
// a peer still reads at the same offsets for another block of the previous call (block slices
// move with the tensor's size). Blocks past the tensor only raise their flags.
template <class T>
__global__ void __launch_bounds__(kThreads)
    peer_all_reduce_kernel(PeerAllReduceView v, uint4* __restrict__ data, int64_t units, int64_t per_block) {
  constexpr int kN = Vec16<T>::kN;
  const int b = blockIdx.x;
  __shared__ uint32_t epoch_shared;
  if (threadIdx.x == 0) epoch_shared = v.epochs[b] + 1;
  __syncthreads();
  const uint32_t epoch = epoch_shared;
  const int buf = static_cast<int>(epoch & 1u);
  const int64_t first = b * per_block, last = min(units, first + per_block);
  if (first >= last) {  // no slice: the flags keep the peers' waits for this block in step
    if (threadIdx.x < v.size) store_release(v.flags[threadIdx.x] + b * kPeerMaxRanks + v.rank, epoch);
    if (threadIdx.x == 0) v.epochs[b] = epoch;
    return;
  }

  uint4* mine = static_cast<uint4*>(v.staging[v.rank][buf]);
  for (int64_t i = first + threadIdx.x; i < last; i += blockDim.x) mine[i] = data[i];
  // The block's stores are ordered before the flag by the barrier and the release (cumulative).
  __syncthreads();
  if (threadIdx.x < v.size) {
    store_release(v.flags[threadIdx.x] + b * kPeerMaxRanks + v.rank, epoch);
    const uint32_t* flag = v.flags[v.rank] + b * kPeerMaxRanks + threadIdx.x;
    // Wrap-safe "not there yet": a peer is at most one epoch ahead.
    for (uint32_t spins = 0; static_cast<int32_t>(load_acquire(flag) - epoch) < 0; ++spins)
      if ((spins & 1023u) == 1023u && *v.abort) break;  // mapped host memory: read it rarely
  }
  __syncthreads();

  for (int64_t i = first + threadIdx.x; i < last; i += blockDim.x) {
    float acc[kN] = {};
    for (int p = 0; p < v.size; ++p) {  // rank order: the same bits on every rank
      Vec16<T> x;
      x.raw = __ldcg(static_cast<const uint4*>(v.staging[p][buf]) + i);  // L2, never a stale L1 line
#pragma unroll
      for (int k = 0; k < kN; ++k) acc[k] += to_float(x.elems[k]);
    }
    Vec16<T> out;
#pragma unroll
    for (int k = 0; k < kN; ++k) out.elems[k] = from_float<T>(acc[k]);
    data[i] = out.raw;
  }
  if (threadIdx.x == 0) v.epochs[b] = epoch;
}

}  // namespace

cudaError_t launch_peer_all_reduce(const PeerAllReduceView& view, void* data, int64_t n, DType dtype,
                                   cudaStream_t stream) {
  const int64_t bytes = n * static_cast<int64_t>(dtype_size(dtype));
  if (bytes == 0) return cudaSuccess;
  const int64_t units = bytes / 16;
  // A slice of 512 units (8 KB) per block up to kPeerMaxBlocks slices: a batch-1 row of 4096 bf16
  // is one; the other blocks only keep their epochs in step.
  const int64_t slices = std::clamp<int64_t>((units + kThreads - 1) / kThreads, 1, kPeerMaxBlocks);
  const int64_t per_block = (units + slices - 1) / slices;
  auto* d = static_cast<uint4*>(data);
  if (dtype == DType::kBF16) {
    peer_all_reduce_kernel<bf16><<<kPeerMaxBlocks, kThreads, 0, stream>>>(view, d, units, per_block);
  } else if (dtype == DType::kF32) {
    peer_all_reduce_kernel<float><<<kPeerMaxBlocks, kThreads, 0, stream>>>(view, d, units, per_block);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace cuda

}  // namespace specula
