// Element types of tensors, and the conversions between the storage formats checkpoints use
// (bf16, f16) and the fp32 the CPU backend computes in.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace specula {

enum class DType : uint8_t { kF32, kF16, kBF16, kF8E4M3, kI64, kI32, kI16, kI8, kU8, kBool };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // safetensors spelling: "F32", "BF16", ...
// Parses the safetensors dtype string; returns false when the string names no supported type.
bool parse_dtype(std::string_view name, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round-to-nearest-even, as torch does when it casts fp32 to bf16; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float f8e4m3_to_f32(uint8_t v);
// Round to nearest even, saturating at +-448 (e4m3fn has no infinity), as CUDA's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); NaN stays NaN.
uint8_t f32_to_f8e4m3(float f);

// Converts n elements of `src` (of type `from`) to fp32.
void convert_to_f32(const void* src, DType from, float* dst, size_t n);
// Converts n fp32 values to `to` (F32, F16, BF16 or F8_E4M3).
void convert_from_f32(const float* src, DType to, void* dst, size_t n);

}  // namespace specula
