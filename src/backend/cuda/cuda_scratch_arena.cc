#include "backend/cuda/cuda_scratch_arena.h"

#include <algorithm>

#include "core/error.h"

namespace specula {
namespace {
size_t align_up(size_t n) { return (n + CudaScratchArena::kAlign - 1) / CudaScratchArena::kAlign * CudaScratchArena::kAlign; }
}  // namespace

bool CudaScratchArena::capturing() const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream_, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone;
}

Tensor CudaScratchArena::allocate(const Shape& shape, DType dtype) {
  int64_t n = 1;
  for (int64_t d : shape) {
    SPECULA_CHECK(d >= 0, "scratch: negative dimension in shape {}", shape_str(shape));
    n *= d;
  }
  // At least one unit, so that even an empty tensor has a distinct, non-null address.
  const size_t bytes = align_up(std::max<size_t>(static_cast<size_t>(n) * dtype_size(dtype), 1));
  if (offset_ + bytes <= capacity_) {
    void* p = static_cast<char*>(chunk_.get()) + offset_;
    offset_ += bytes;
    return Tensor::from_blob(p, shape, dtype, Device::kCUDA, chunk_);
  }
  SPECULA_CHECK(!capturing(),
                "scratch: {} bytes for {} {} do not fit the {}-byte arena during CUDA graph capture; run the "
                "same step once without capture first so that the arena grows to fit it",
                bytes, dtype_name(dtype), shape_str(shape), capacity_);
  overflow_bytes_ += bytes;
  return Tensor::empty(shape, dtype, Device::kCUDA);
}

void CudaScratchArena::reset() {
  if (overflow_bytes_ > 0 && !capturing()) {
    const size_t needed = offset_ + overflow_bytes_;
    capacity_ = align_up(needed + needed / 4);  // headroom so that a slightly larger step fits too
    Tensor storage = Tensor::empty({static_cast<int64_t>(capacity_)}, DType::kU8, Device::kCUDA);
    auto holder = std::make_shared<Tensor>(storage);
    chunk_ = std::shared_ptr<void>(holder, storage.data());  // keeps the storage alive
    overflow_bytes_ = 0;
  }
  offset_ = 0;
}

}  // namespace specula
