#include "core/tensor.h"

#include <array>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace specula {
namespace {

class CpuAllocator : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    // 64-byte alignment: whole cache lines, and what AVX-512 loads want.
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    SPECULA_CHECK(p != nullptr, "out of host memory allocating {} bytes", bytes);
    return p;
  }
  void deallocate(void* ptr, size_t) override { std::free(ptr); }
};

std::array<Allocator*, 2>& allocators() {
  static CpuAllocator cpu;
  static std::array<Allocator*, 2> table = {&cpu, nullptr};
  return table;
}

int64_t product(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

}  // namespace

std::string_view device_name(Device d) { return d == Device::kCPU ? "cpu" : "cuda"; }

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

void register_allocator(Device device, Allocator* allocator) {
  allocators()[static_cast<size_t>(device)] = allocator;
}

Allocator* allocator_for(Device device) {
  Allocator* a = allocators()[static_cast<size_t>(device)];
  SPECULA_CHECK(a != nullptr, "no allocator for device {} (was specula built with CUDA?)",
                device_name(device));
  return a;
}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  for (int64_t d : shape) SPECULA_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  size_t bytes = t.nbytes();
  Allocator* alloc = allocator_for(device);
  void* p = alloc->allocate(bytes == 0 ? 1 : bytes);
  t.data_ = p;
  t.owner_ = std::shared_ptr<void>(p, [alloc, bytes](void* q) { alloc->deallocate(q, bytes); });
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype, Device::kCPU);
  std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::from_blob(void* data, Shape shape, DType dtype, Device device, std::shared_ptr<void> owner) {
  Tensor t;
  t.data_ = data;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.owner_ = std::move(owner);
  return t;
}

template <class T>
static Tensor from_values(const std::vector<T>& v, Shape shape, DType dtype) {
  if (shape.empty()) shape = {static_cast<int64_t>(v.size())};
  SPECULA_CHECK(product(shape) == static_cast<int64_t>(v.size()), "shape {} does not hold {} values",
                shape_str(shape), v.size());
  Tensor t = Tensor::empty(std::move(shape), dtype);
  if (!v.empty()) std::memcpy(t.data(), v.data(), v.size() * sizeof(T));
  return t;
}

Tensor Tensor::from_f32(const std::vector<float>& v, Shape shape) { return from_values(v, std::move(shape), DType::kF32); }
Tensor Tensor::from_i32(const std::vector<int32_t>& v, Shape shape) { return from_values(v, std::move(shape), DType::kI32); }
Tensor Tensor::from_i64(const std::vector<int64_t>& v, Shape shape) { return from_values(v, std::move(shape), DType::kI64); }

int64_t Tensor::size(int dim) const {
  int n = ndim();
  if (dim < 0) dim += n;
  SPECULA_CHECK(dim >= 0 && dim < n, "dimension {} out of range for {}", dim, describe());
  return shape_[dim];
}

int64_t Tensor::numel() const { return product(shape_); }

size_t Tensor::row_bytes() const {
  SPECULA_ASSERT(ndim() >= 1);
  return shape_[0] == 0 ? 0 : nbytes() / static_cast<size_t>(shape_[0]);
}

Tensor Tensor::reshape(Shape shape) const {
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      SPECULA_CHECK(infer < 0, "reshape {} has more than one -1", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) shape[infer] = known == 0 ? 0 : numel() / known;
  SPECULA_CHECK(product(shape) == numel(), "cannot reshape {} to {}", describe(), shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  SPECULA_CHECK(ndim() >= 1 && begin >= 0 && begin <= end && end <= shape_[0],
                "slice [{}, {}) out of range for {}", begin, end, describe());
  Tensor t = *this;
  size_t rb = row_bytes();
  t.data_ = static_cast<char*>(data_) + rb * static_cast<size_t>(begin);
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::view_as(DType dtype) const {
  SPECULA_CHECK(dtype_size(dtype) == dtype_size(dtype_), "cannot view {} as {}", describe(), dtype_name(dtype));
  Tensor t = *this;
  t.dtype_ = dtype;
  return t;
}

std::string Tensor::describe() const {
  return fmt::format("{}{} on {}", dtype_name(dtype_), shape_str(shape_), device_name(device_));
}

std::vector<float> Tensor::to_f32_vector() const {
  SPECULA_CHECK(is_cpu(), "to_f32_vector needs a CPU tensor, got {}", describe());
  std::vector<float> out(static_cast<size_t>(numel()));
  if (dtype_ == DType::kI32) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(data_as<int32_t>()[i]);
  } else {
    convert_to_f32(data_, dtype_, out.data(), out.size());
  }
  return out;
}

std::vector<int32_t> Tensor::to_i32_vector() const {
  SPECULA_CHECK(is_cpu(), "to_i32_vector needs a CPU tensor, got {}", describe());
  std::vector<int32_t> out(static_cast<size_t>(numel()));
  if (dtype_ == DType::kI32) {
    std::memcpy(out.data(), data_, out.size() * 4);
  } else if (dtype_ == DType::kI64) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<int32_t>(data_as<int64_t>()[i]);
  } else {
    throw Error(fmt::format("to_i32_vector: {} is not an integer tensor", describe()));
  }
  return out;
}

}  // namespace specula
