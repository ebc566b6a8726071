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
  const size_t at = offset_;
  if (at + bytes <= capacity_) {
    offset_ = at + bytes;
    peak_ = std::max(peak_, offset_);
    return Tensor::from_blob(static_cast<char*>(chunk_.get()) + at, shape, dtype, Device::kCUDA, chunk_);
  }
  SPECULA_CHECK(!capturing(),
                "scratch: {} bytes for {} {} do not fit the {}-byte arena during CUDA graph capture; run the "
                "same step once without capture first so that the arena grows to fit it",
                bytes, dtype_name(dtype), shape_str(shape), capacity_);
  offset_ = at + bytes;
  peak_ = std::max(peak_, offset_);
  return Tensor::empty(shape, dtype, Device::kCUDA);
}

void CudaScratchArena::release(size_t mark) {
  SPECULA_CHECK(mark <= offset_, "scratch_release: mark {} is above the arena's top {}", mark, offset_);
  offset_ = mark;
}

void CudaScratchArena::reset() {
  if (peak_ > capacity_ && capturing()) {  // no allocation during capture: grow at the next reset
    offset_ = 0;
    return;
  }
  if (peak_ > capacity_) {
    const size_t needed = peak_;
    capacity_ = align_up(needed + needed / 4);  // headroom so that a slightly larger step fits too
    Tensor storage = Tensor::empty({static_cast<int64_t>(capacity_)}, DType::kU8, Device::kCUDA);
    auto holder = std::make_shared<Tensor>(storage);
    chunk_ = std::shared_ptr<void>(holder, storage.data());  // keeps the storage alive
  }
  offset_ = 0;
  peak_ = 0;
}

}  // namespace specula
