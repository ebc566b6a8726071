// Device memory for Device::kCUDA tensors: a caching allocator over cudaMalloc.
//
// cudaMalloc/cudaFree are slow and cudaFree synchronises the whole device, so freed blocks are
// kept in per-device free lists (sizes rounded to 512 B below 1 MiB, to 2 MiB above) and handed
// out again. Reuse is safe because every kernel and copy of a device runs on its backend's one
// stream: a block freed on the host while kernels that read it are still queued is only written
// again by work queued after them. (Code that uses another stream must synchronise before
// freeing.) Cached blocks go back to the driver only when an allocation would otherwise fail.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_map>

#include "core/tensor.h"

namespace specula {

struct CudaMemoryStats {
  size_t in_use_bytes = 0;     // handed out to tensors
  size_t cached_bytes = 0;     // freed, kept for reuse
  size_t peak_in_use_bytes = 0;
  size_t cuda_malloc_calls = 0;
};

class CudaCachingAllocator final : public Allocator {
 public:
  // The process-wide instance (never destroyed: tensors in static storage may outlive main).
  static CudaCachingAllocator& instance();

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;

  // Returns every cached (free) block to the driver.
  void release_cached();
  // The whole process's figures, or one device's (what a memory plan beside cudaMemGetInfo of
  // that device needs: with tensor parallelism every GPU's blocks are in this one allocator).
  CudaMemoryStats stats() const;
  CudaMemoryStats stats(int device) const;

 private:
  struct Block {
    size_t size;
    int device;
  };
  void release_cached_locked(int device);
  void count_in_use(int device, size_t bytes);

  mutable std::mutex mu_;
  std::unordered_map<void*, Block> in_use_;
  std::map<int, std::multimap<size_t, void*>> free_;  // device -> size -> block
  CudaMemoryStats stats_;
  std::map<int, CudaMemoryStats> device_stats_;
};

}  // namespace specula
