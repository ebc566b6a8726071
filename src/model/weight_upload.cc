#include "model/weight_upload.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace specula {
namespace {

// 16 Ki elements: the fp32 scratch (64 KiB) stays in L2 while it is converted onward.
constexpr size_t kChunk = 16384;

}  // namespace

bool is_weight_float_dtype(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

void convert_elements(const void* src, DType from, void* dst, DType to, size_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  const size_t in_size = dtype_size(from), out_size = dtype_size(to);
  const int64_t chunks = static_cast<int64_t>((n + kChunk - 1) / kChunk);
  if (from == to) {
    // Parallel copy: for an mmap'd source the page faults are spread over the threads too.
#pragma omp parallel for schedule(static) if (chunks > 4)
    for (int64_t c = 0; c < chunks; ++c) {
      size_t b = static_cast<size_t>(c) * kChunk, m = std::min(kChunk, n - b);
      std::memcpy(d + b * out_size, s + b * in_size, m * out_size);
    }
    return;
  }
  SPECULA_CHECK((is_weight_float_dtype(from) || from == DType::kF8E4M3) && is_weight_float_dtype(to),
                "cannot convert {} to {}", dtype_name(from), dtype_name(to));
#pragma omp parallel if (chunks > 4)
  {
    std::vector<float> f32(kChunk);
    // Aligned copy of the source chunk for when the file places it at an odd address (safetensors
    // does not require alignment; reading uint16/float through a misaligned pointer is UB).
    std::vector<uint8_t> aligned((kChunk + 1) * in_size);
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      size_t b = static_cast<size_t>(c) * kChunk, m = std::min(kChunk, n - b);
      const uint8_t* in = s + b * in_size;
      if (reinterpret_cast<uintptr_t>(in) % in_size != 0) {
        std::memcpy(aligned.data(), in, m * in_size);
        in = aligned.data();
      }
      if (to == DType::kF32) {
        convert_to_f32(in, from, reinterpret_cast<float*>(d + b * out_size), m);
      } else if (from == DType::kF32) {
        convert_from_f32(reinterpret_cast<const float*>(in), to, d + b * out_size, m);
      } else {
        convert_to_f32(in, from, f32.data(), m);
        convert_from_f32(f32.data(), to, d + b * out_size, m);
      }
    }
  }
}

ElementFiller slice_filler(const Shape& full, const TensorSlice& slice, size_t elem, ElementFiller full_fill) {
  slice_shape(full, slice);  // checks that the slice fits
  // Element e of the slice: outer index o (dims before `dim`), then run offset within the slice's
  // count * inner contiguous elements that one outer index holds.
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(slice.dim) + 1; d < full.size(); ++d) inner *= full[d];
  const size_t run = static_cast<size_t>(slice.count * inner);
  const size_t stride = static_cast<size_t>(full[static_cast<size_t>(slice.dim)] * inner);
  const size_t offset = static_cast<size_t>(slice.begin * inner);
  return [=, fill = std::move(full_fill)](void* out, size_t begin, size_t count) {
    auto* dst = static_cast<uint8_t*>(out);
    while (count > 0) {
      const size_t o = begin / run, within = begin % run, m = std::min(count, run - within);
      fill(dst, o * stride + offset + within, m);
      dst += m * elem;
      begin += m;
      count -= m;
    }
  };
}

void fill_backend_tensor(Backend& backend, Tensor& dst, const ElementFiller& fill, size_t staging_bytes) {
  const size_t n = static_cast<size_t>(dst.numel());
  if (n == 0) return;
  if (dst.is_cpu()) {
    fill(dst.data(), 0, n);
    return;
  }
  const size_t elem = dtype_size(dst.dtype());
  const size_t chunk = std::max<size_t>(1, std::min(n, staging_bytes / elem));
  Tensor flat = dst.reshape({static_cast<int64_t>(n)});
  Tensor staging = Tensor::empty({static_cast<int64_t>(chunk)}, dst.dtype(), Device::kCPU);
  for (size_t b = 0; b < n; b += chunk) {
    size_t m = std::min(chunk, n - b);
    Tensor host = staging.slice(0, static_cast<int64_t>(m));
    fill(host.data(), b, m);
    Tensor part = flat.slice(static_cast<int64_t>(b), static_cast<int64_t>(b + m));
    backend.copy(host, part);
    // The staging buffer is refilled next round: wait until the device has taken this chunk.
    backend.synchronize();
  }
}

Tensor stack_rows(Backend& backend, DType dtype, const StackedParts& parts,
                  const std::function<Tensor(const std::string& name, const Shape& shape)>& load_part) {
  Shape fused_shape = parts.front().second;
  fused_shape[0] = 0;
  for (const auto& [name, shape] : parts) fused_shape[0] += shape[0];
  Tensor fused = backend.empty(fused_shape, dtype);
  int64_t row = 0;
  for (const auto& [name, shape] : parts) {
    Tensor part = load_part(name, shape);
    Tensor rows = fused.slice(row, row + shape[0]);
    backend.copy(part, rows);
    row += shape[0];
  }
  return fused;
}

}  // namespace specula
