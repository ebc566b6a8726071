#include "backend/cuda/cuda_allocator.h"

#include <cuda_runtime_api.h>

#include "core/error.h"

namespace specula {
namespace {

constexpr size_t kSmallLimit = size_t{1} << 20;
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeRound = size_t{2} << 20;

size_t round_size(size_t bytes) {
  if (bytes < kSmallLimit) return (bytes + kSmallRound - 1) / kSmallRound * kSmallRound;
  return (bytes + kLargeRound - 1) / kLargeRound * kLargeRound;
}

// A cached block serves a request when it wastes at most a quarter of the request (or one
// rounding unit for small ones): a cache, not a second-level heap.
bool fits(size_t block, size_t wanted) {
  return block <= wanted + std::max(wanted / 4, wanted < kSmallLimit ? kSmallRound : kLargeRound);
}

std::string mib(size_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

}  // namespace

CudaCachingAllocator& CudaCachingAllocator::instance() {
  static auto* allocator = new CudaCachingAllocator;
  return *allocator;
}

void* CudaCachingAllocator::allocate(size_t bytes) {
  const size_t size = round_size(bytes == 0 ? 1 : bytes);
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  SPECULA_CHECK(err == cudaSuccess, "CUDA allocation of {} bytes: no usable device ({})", bytes,
                cudaGetErrorString(err));
  std::lock_guard<std::mutex> lock(mu_);
  auto& free_list = free_[device];
  auto it = free_list.lower_bound(size);
  if (it != free_list.end() && fits(it->first, size)) {
    void* p = it->second;
    const size_t block = it->first;
    free_list.erase(it);
    in_use_[p] = Block{block, device};
    stats_.cached_bytes -= block;
    device_stats_[device].cached_bytes -= block;
    count_in_use(device, block);
    return p;
  }
  void* p = nullptr;
  err = cudaMalloc(&p, size);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // clear the sticky-free error state of the failed call
    release_cached_locked(device);
    err = cudaMalloc(&p, size);
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    throw Error(fmt::format(
        "CUDA out of memory: cannot allocate {} on device {} ({}; {} free of {}; specula holds {} in tensors)",
        mib(size), device, cudaGetErrorString(err), mib(free_b), mib(total_b),
        mib(device_stats_[device].in_use_bytes)));
  }
  ++stats_.cuda_malloc_calls;
  ++device_stats_[device].cuda_malloc_calls;
  in_use_[p] = Block{size, device};
  count_in_use(device, size);
  return p;
}

void CudaCachingAllocator::count_in_use(int device, size_t bytes) {
  for (CudaMemoryStats* s : {&stats_, &device_stats_[device]}) {
    s->in_use_bytes += bytes;
    s->peak_in_use_bytes = std::max(s->peak_in_use_bytes, s->in_use_bytes);
  }
}

void CudaCachingAllocator::deallocate(void* ptr, size_t) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_use_.find(ptr);
  if (it == in_use_.end()) return;  // not ours (cannot happen through Tensor)
  const Block block = it->second;
  in_use_.erase(it);
  for (CudaMemoryStats* s : {&stats_, &device_stats_[block.device]}) {
    s->in_use_bytes -= block.size;
    s->cached_bytes += block.size;
  }
  free_[block.device].emplace(block.size, ptr);
}

void CudaCachingAllocator::release_cached_locked(int device) {
  auto& free_list = free_[device];
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device);
  for (auto& [size, p] : free_list) {
    cudaFree(p);  // errors ignored: at process exit the runtime may already be gone
    stats_.cached_bytes -= size;
    device_stats_[device].cached_bytes -= size;
  }
  free_list.clear();
  cudaSetDevice(previous);
}

void CudaCachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [device, list] : free_) release_cached_locked(device);
}

CudaMemoryStats CudaCachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

CudaMemoryStats CudaCachingAllocator::stats(int device) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = device_stats_.find(device);
  return it == device_stats_.end() ? CudaMemoryStats{} : it->second;
}

}  // namespace specula
