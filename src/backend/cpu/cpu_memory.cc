// CPU backend: construction, memory (persistent, scratch arena), copies and casts.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_backend.h"

namespace specula {
namespace {

constexpr size_t kAlign = 64;  // a cache line; also what AVX-512 loads like
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

bool is_float_dtype(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

}  // namespace

// ---- scratch arena ----

Tensor ScratchArena::allocate(const Shape& shape, DType dtype) {
  int64_t n = 1;
  for (int64_t d : shape) {
    SPECULA_CHECK(d >= 0, "scratch: negative dimension in shape {}", shape_str(shape));
    n *= d;
  }
  // At least one line, so that even an empty tensor has a distinct, non-null address.
  size_t bytes = align_up(std::max<size_t>(static_cast<size_t>(n) * dtype_size(dtype), 1));
  const size_t at = offset_;
  offset_ += bytes;
  peak_ = std::max(peak_, offset_);
  if (offset_ <= capacity_) return Tensor::from_blob(static_cast<char*>(chunk_.get()) + at, shape, dtype, Device::kCPU, chunk_);
  // Does not fit: serve it on its own this step and grow the chunk at the next reset.
  return Tensor::empty(shape, dtype, Device::kCPU);
}

void ScratchArena::release(size_t mark) {
  SPECULA_CHECK(mark <= offset_, "scratch_release: mark {} is above the arena's top {}", mark, offset_);
  offset_ = mark;
}

void ScratchArena::reset() {
  if (peak_ > capacity_) {
    const size_t needed = peak_;
    capacity_ = align_up(needed + needed / 4);  // headroom so a slightly larger step still fits
    Tensor storage = Tensor::empty({static_cast<int64_t>(capacity_)}, DType::kU8, Device::kCPU);
    // Keep the storage alive through the chunk pointer (an aliasing shared_ptr to its bytes).
    auto holder = std::make_shared<Tensor>(storage);
    chunk_ = std::shared_ptr<void>(holder, storage.data());
  }
  offset_ = 0;
  peak_ = 0;
}

// ---- backend basics ----

CpuBackend::CpuBackend(int threads) : threads_(threads > 0 ? threads : omp_get_max_threads()) {
  // One thread pool: linear splits its GEMMs over our OpenMP threads (cpu_linear.cc says why), so
  // OpenBLAS itself runs each call single-threaded, in the calling thread. (Process-wide setting.)
  openblas_set_num_threads(1);
}

std::string CpuBackend::name() const { return fmt::format("cpu ({} threads, fp32)", threads_); }

Tensor CpuBackend::empty(Shape shape, DType dtype) { return Tensor::empty(std::move(shape), dtype, Device::kCPU); }

Tensor CpuBackend::scratch(Shape shape, DType dtype) { return arena_.allocate(shape, dtype); }

void CpuBackend::reset_scratch() { arena_.reset(); }

void CpuBackend::copy(const Tensor& src, Tensor& dst) {
  SPECULA_CHECK(src.is_cpu() && dst.is_cpu(),
                "copy: the CPU backend copies between CPU tensors only (got {} -> {}); use the CUDA "
                "backend for transfers to or from a GPU", src.describe(), dst.describe());
  SPECULA_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel(),
                "copy: source {} and destination {} differ in dtype or element count", src.describe(),
                dst.describe());
  if (src.data() != dst.data() && src.nbytes() > 0) std::memmove(dst.data(), src.data(), src.nbytes());
}

void CpuBackend::cast(const Tensor& src, Tensor& dst) {
  SPECULA_CHECK(src.is_cpu() && dst.is_cpu(), "cast: expected CPU tensors, got {} -> {}", src.describe(),
                dst.describe());
  SPECULA_CHECK(is_float_dtype(src.dtype()) && is_float_dtype(dst.dtype()),
                "cast: only F32/F16/BF16 convert, got {} -> {}", src.describe(), dst.describe());
  SPECULA_CHECK(src.numel() == dst.numel(), "cast: source {} and destination {} differ in element count",
                src.describe(), dst.describe());
  if (src.dtype() == dst.dtype()) {
    copy(src, dst);
    return;
  }
  const int64_t n = src.numel();
  constexpr int64_t kChunk = 4096;
  const size_t in_size = dtype_size(src.dtype()), out_size = dtype_size(dst.dtype());
  const char* in = static_cast<const char*>(src.data());
  char* out = static_cast<char*>(dst.data());
#pragma omp parallel for num_threads(threads_) schedule(static) if (n > 4 * kChunk)
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    float buf[kChunk];
    size_t len = static_cast<size_t>(std::min(kChunk, n - begin));
    convert_to_f32(in + begin * in_size, src.dtype(), buf, len);
    convert_from_f32(buf, dst.dtype(), out + begin * out_size, len);
  }
}

void CpuBackend::zero(Tensor& t) {
  SPECULA_CHECK(t.is_cpu(), "zero: expected a CPU tensor, got {}", t.describe());
  if (t.nbytes() > 0) std::memset(t.data(), 0, t.nbytes());
}

// ---- shared argument checks ----

namespace cpu_check {

void f32(const Tensor& t, const char* op, const char* param) {
  SPECULA_CHECK(t.defined(), "{}: {} is an empty tensor", op, param);
  SPECULA_CHECK(t.is_cpu() && t.dtype() == DType::kF32, "{}: {} must be an F32 CPU tensor, got {}", op, param,
                t.describe());
}

void index_vector(const Tensor& t, DType dtype, const char* op, const char* param) {
  SPECULA_CHECK(t.defined(), "{}: {} is an empty tensor", op, param);
  SPECULA_CHECK(t.is_cpu() && t.dtype() == dtype && t.ndim() == 1, "{}: {} must be a 1-d {} CPU tensor, got {}",
                op, param, dtype_name(dtype), t.describe());
}

void same_shape(const Tensor& a, const Tensor& b, const char* op, const char* pa, const char* pb) {
  SPECULA_CHECK(a.shape() == b.shape(), "{}: {} {} and {} {} must have the same shape", op, pa, a.describe(), pb,
                b.describe());
}

}  // namespace cpu_check

std::unique_ptr<Backend> make_cpu_backend(int threads) {
  SPECULA_CHECK(threads >= 0, "make_cpu_backend: threads must be >= 0, got {}", threads);
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace specula
