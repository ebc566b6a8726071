// A contiguous, row-major n-d array on one device. Tensors share their storage: views (reshape,
// slice of leading rows) keep the storage alive through a shared owner. Compute lives in
// backend/; this type only describes memory.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace specula {

enum class Device : uint8_t { kCPU, kCUDA };
std::string_view device_name(Device d);

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3]"

// Device memory comes from an allocator registered per device (the CUDA backend registers its
// own when it is linked in), so core/ needs no CUDA headers.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
};
void register_allocator(Device device, Allocator* allocator);
Allocator* allocator_for(Device device);  // throws when none is registered

class Tensor {
 public:
  Tensor() = default;

  // Fresh, uninitialised storage from the device's allocator.
  static Tensor empty(Shape shape, DType dtype, Device device = Device::kCPU);
  // CPU tensor filled with zero bytes.
  static Tensor zeros(Shape shape, DType dtype);
  // Wraps memory owned elsewhere; `owner` (may be null) is kept alive as long as the tensor.
  static Tensor from_blob(void* data, Shape shape, DType dtype, Device device,
                          std::shared_ptr<void> owner = nullptr);
  // CPU tensor holding a copy of `values`; shape defaults to [values.size()].
  static Tensor from_f32(const std::vector<float>& values, Shape shape = {});
  static Tensor from_i32(const std::vector<int32_t>& values, Shape shape = {});
  static Tensor from_i64(const std::vector<int64_t>& values, Shape shape = {});

  bool defined() const { return data_ != nullptr; }
  void* data() const { return data_; }
  template <class T> T* data_as() const { return static_cast<T*>(data_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool is_cpu() const { return device_ == Device::kCPU; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int dim) const;  // negative dims count from the end
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  size_t row_bytes() const;  // bytes of one index along dim 0

  // Same storage, new shape (one dim may be -1).
  Tensor reshape(Shape shape) const;
  // Rows [begin, end) along dim 0, sharing storage.
  Tensor slice(int64_t begin, int64_t end) const;
  // Same bytes seen as another dtype of the same size per element.
  Tensor view_as(DType dtype) const;

  std::string describe() const;  // "BF16[4, 8] on cuda"

  // CPU only: copy into a std::vector after converting to fp32 / int.
  std::vector<float> to_f32_vector() const;
  std::vector<int32_t> to_i32_vector() const;

 private:
  std::shared_ptr<void> owner_;
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCPU;
};

}  // namespace specula
