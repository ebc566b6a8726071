// A one-shot all-reduce for the small tensors of tensor-parallel decode, between GPUs of one
// process that map each other's memory (peer access over NVLink or PCIe).
//
// Why: a batch-1 decode step of an 8B model all-reduces 64 rows of 8 KB; NCCL's ring needs several
// hops and protocol steps per call (~10 us each, more than the layer's GEMVs at TP 4). Here every
// rank copies its tensor into a staging buffer the others can read, raises a flag in each peer's
// memory, waits for every peer's flag, and then reads all staging buffers and sums them itself:
// one kernel, one round trip of flags. The sum runs in fp32 in rank order on every rank, so the
// ranks get bitwise the same result.
//
// Ordering: each block of the kernel owns one slice of the tensor and has its own flags and epoch
// counter (in device memory, so that a CUDA graph's replays advance it); every call runs every
// block, so all epochs equal the call count. Staging buffers alternate with the epoch: a rank
// writes buffer (e & 1) at call e only after its block 0 saw every peer's flag for call e - 1,
// which a peer raises after it finished reading call e - 2 (its kernels run in stream order).
// Larger tensors go to NCCL.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"

namespace specula {

class Tensor;  // core/tensor.h (not included: nvcc compiles this header, and fmt with it fails)

namespace cuda {

constexpr int kPeerMaxRanks = 8;
constexpr int kPeerMaxBlocks = 32;

// What one rank's kernel reads: every rank's staging buffers and flags (peer pointers), its own
// epoch counters, and a host-mapped word that ends the waits when set (an aborted group).
struct PeerAllReduceView {
  int rank = 0;
  int size = 0;
  void* staging[kPeerMaxRanks][2] = {};
  uint32_t* flags[kPeerMaxRanks] = {};  // rank p's [kPeerMaxBlocks][kPeerMaxRanks]: [block][from]
  uint32_t* epochs = nullptr;           // this rank's [kPeerMaxBlocks]
  const volatile int* abort = nullptr;
};

// data (n elements of F32 or BF16, 16-byte aligned, n * element size a multiple of 16 and at most
// the staging size) = the sum over the ranks of theirs, in place. Every rank must launch it with
// the same n, in the same order relative to its other collectives.
cudaError_t launch_peer_all_reduce(const PeerAllReduceView& view, void* data, int64_t n, DType dtype,
                                   cudaStream_t stream);

}  // namespace cuda

// The buffers of one group of ranks (index = rank, GPU devices[rank]).
class PeerAllReduceGroup {
 public:
  // nullptr unless there are 2..kPeerMaxRanks GPUs and each maps every other's memory (peer access
  // must already be enabled).
  static std::unique_ptr<PeerAllReduceGroup> create(const std::vector<int>& devices, size_t max_bytes);
  ~PeerAllReduceGroup();
  PeerAllReduceGroup(const PeerAllReduceGroup&) = delete;
  PeerAllReduceGroup& operator=(const PeerAllReduceGroup&) = delete;

  // Whether `t` takes this path (dtype, size and alignment); else the caller uses NCCL.
  bool fits(const Tensor& t) const;
  // Rank `rank`'s part: enqueues the kernel on `stream` (of GPU devices[rank]).
  void all_reduce_sum(int rank, Tensor& t, cudaStream_t stream);
  // Every rank's waiting kernel returns (with a wrong sum): a failed rank will never raise its flag.
  void abort();

 private:
  PeerAllReduceGroup() = default;
  std::vector<int> devices_;
  size_t max_bytes_ = 0;
  std::vector<cuda::PeerAllReduceView> views_;  // by rank
  std::vector<void*> allocations_;              // by rank: staging x 2, flags, epochs in one
  volatile int* abort_ = nullptr;               // host-mapped
};

}  // namespace specula
