// Per-step activation memory on the GPU: a bump allocator over one device allocation.
//
// CUDA-graph replay re-runs kernels with the pointers they were captured with, so a step must get
// the same addresses every time it makes the same sequence of requests: within a step, requests
// are carved from one chunk in order, as a stack (release(mark) pops everything above the mark,
// for reuse). What does not fit is served by its own allocation that step, and the next reset()
// (outside capture) replaces the chunk by one large enough for the step's highest point. During stream capture nothing may be allocated, so a request that does not fit
// then is an error: run the step once eagerly first (the warm-up the engine does anyway).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "core/tensor.h"

namespace specula {

class CudaScratchArena {
 public:
  explicit CudaScratchArena(cudaStream_t stream) : stream_(stream) {}

  Tensor allocate(const Shape& shape, DType dtype);
  void reset();
  size_t capacity() const { return capacity_; }
  // Backend::scratch_mark / scratch_release: the position in the step's (virtual) stack.
  size_t mark() const { return offset_; }
  void release(size_t mark);

  // 256 bytes: what cudaMalloc guarantees, and more than any vector load or cuBLASLt needs.
  static constexpr size_t kAlign = 256;

 private:
  bool capturing() const;

  cudaStream_t stream_;
  std::shared_ptr<void> chunk_;  // shared with the tensors carved from it
  size_t capacity_ = 0;
  size_t offset_ = 0;  // top of the stack; past capacity_, requests get their own allocation
  size_t peak_ = 0;    // highest top this step: what the chunk must hold from the next reset
};

}  // namespace specula
