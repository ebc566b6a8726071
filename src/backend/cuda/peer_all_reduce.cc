// The peer all-reduce's buffers (one allocation per rank, read by every rank); see
// peer_all_reduce.h.
#include "backend/cuda/peer_all_reduce.h"

#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/tensor.h"

namespace specula {

std::unique_ptr<PeerAllReduceGroup> PeerAllReduceGroup::create(const std::vector<int>& devices, size_t max_bytes) {
  const int size = static_cast<int>(devices.size());
  if (size < 2 || size > cuda::kPeerMaxRanks) return nullptr;
  for (int a : devices)
    for (int b : devices) {
      int can = 0;
      if (a != b && (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || !can)) return nullptr;
    }
  int current = 0;
  cudaGetDevice(&current);
  std::unique_ptr<PeerAllReduceGroup> g(new PeerAllReduceGroup());
  g->devices_ = devices;
  g->max_bytes_ = max_bytes / 16 * 16;
  void* host = nullptr;
  check_cuda(cudaHostAlloc(&host, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable), "peer all-reduce: abort word");
  g->abort_ = static_cast<volatile int*>(host);
  *g->abort_ = 0;
  void* abort_on_device = nullptr;
  check_cuda(cudaHostGetDevicePointer(&abort_on_device, host, 0), "peer all-reduce: abort word's device address");
  // Per rank, one allocation: two staging buffers, then the flags and the epoch counters.
  const size_t flags_bytes = sizeof(uint32_t) * cuda::kPeerMaxBlocks * cuda::kPeerMaxRanks;
  const size_t epochs_bytes = sizeof(uint32_t) * cuda::kPeerMaxBlocks;
  const size_t total = 2 * g->max_bytes_ + flags_bytes + epochs_bytes;
  g->views_.resize(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    check_cuda(cudaSetDevice(devices[static_cast<size_t>(r)]), "peer all-reduce: cudaSetDevice");
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, total), "peer all-reduce: buffers");
    g->allocations_.push_back(p);
    check_cuda(cudaMemset(p, 0, total), "peer all-reduce: zeroing");
    check_cuda(cudaDeviceSynchronize(), "peer all-reduce: zeroing");  // flags at 0 before any kernel reads them
  }
  for (int r = 0; r < size; ++r) {
    cuda::PeerAllReduceView& v = g->views_[static_cast<size_t>(r)];
    v.rank = r;
    v.size = size;
    for (int p = 0; p < size; ++p) {
      auto* base = static_cast<uint8_t*>(g->allocations_[static_cast<size_t>(p)]);
      v.staging[p][0] = base;
      v.staging[p][1] = base + g->max_bytes_;
      v.flags[p] = reinterpret_cast<uint32_t*>(base + 2 * g->max_bytes_);
    }
    v.epochs = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(g->allocations_[static_cast<size_t>(r)]) +
                                           2 * g->max_bytes_ + flags_bytes);
    v.abort = static_cast<const volatile int*>(abort_on_device);
  }
  cudaSetDevice(current);
  return g;
}

PeerAllReduceGroup::~PeerAllReduceGroup() {
  int current = 0;
  cudaGetDevice(&current);
  for (size_t r = 0; r < allocations_.size(); ++r) {
    cudaSetDevice(devices_[r]);
    cudaDeviceSynchronize();  // no kernel of the group may still run
    cudaFree(allocations_[r]);
  }
  cudaSetDevice(current);
  if (abort_) cudaFreeHost(const_cast<int*>(abort_));
}

bool PeerAllReduceGroup::fits(const Tensor& t) const {
  const size_t bytes = static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
  return (t.dtype() == DType::kBF16 || t.dtype() == DType::kF32) && bytes > 0 && bytes <= max_bytes_ &&
         bytes % 16 == 0 && (reinterpret_cast<uintptr_t>(t.data()) & 15u) == 0;
}

void PeerAllReduceGroup::all_reduce_sum(int rank, Tensor& t, cudaStream_t stream) {
  check_cuda(cuda::launch_peer_all_reduce(views_[static_cast<size_t>(rank)], t.data(), t.numel(), t.dtype(), stream),
             "peer all-reduce");
}

void PeerAllReduceGroup::abort() { *abort_ = 1; }

}  // namespace specula
