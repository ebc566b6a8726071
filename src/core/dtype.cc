#include "core/dtype.h"

#include <cmath>

#include "core/error.h"

namespace specula {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: case DType::kI16: return 2;
    case DType::kI64: return 8;
    case DType::kF8E4M3: case DType::kI8: case DType::kU8: case DType::kBool: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kI64: return "I64";
    case DType::kI32: return "I32";
    case DType::kI16: return "I16";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kBool: return "BOOL";
  }
  return "?";
}

bool parse_dtype(std::string_view name, DType* out) {
  static constexpr struct { std::string_view n; DType t; } kTable[] = {
      {"F32", DType::kF32}, {"F16", DType::kF16}, {"BF16", DType::kBF16},
      {"F8_E4M3", DType::kF8E4M3}, {"I64", DType::kI64}, {"I32", DType::kI32},
      {"I16", DType::kI16}, {"I8", DType::kI8}, {"U8", DType::kU8}, {"BOOL", DType::kBool}};
  for (const auto& e : kTable) {
    if (e.n == name) { *out = e.t; return true; }
  }
  return false;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v;
  if (exp == 0) v = std::ldexp(static_cast<float>(mant), -24);
  else if (exp == 31) v = mant ? NAN : INFINITY;
  else v = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t absx = x & 0x7fffffff;
  if (absx > 0x7f800000) return static_cast<uint16_t>(sign | 0x7e00);  // NaN
  if (absx >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // overflow -> inf
  if (absx < 0x38800000) {  // subnormal or zero in half
    float a;
    std::memcpy(&a, &absx, 4);
    // round-to-nearest-even via float arithmetic on the subnormal grid (2^-24)
    float scaled = a * 16777216.0f;
    uint32_t m = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t exp = ((absx >> 23) - 112) << 10;
  uint32_t mant = absx & 0x7fffff;
  uint32_t h = exp | (mant >> 13);
  uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float f8e4m3_to_f32(uint8_t v) {
  uint32_t sign = v >> 7, exp = (v >> 3) & 0xf, mant = v & 7;
  float r;
  if (exp == 0xf && mant == 7) r = NAN;  // e4m3fn has no infinity
  else if (exp == 0) r = std::ldexp(static_cast<float>(mant), -9);
  else r = std::ldexp(static_cast<float>(mant | 8), static_cast<int>(exp) - 10);
  return sign ? -r : r;
}

uint8_t f32_to_f8e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate: e4m3fn's largest finite value
  int e;
  std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1): the leading bit has weight 2^(e - 1)
  if (a == 0.0f || e - 1 < -6) {
    // Subnormal range, steps of 2^-9; 8 steps round up to the smallest normal (encoding 0x08).
    return sign | static_cast<uint8_t>(std::nearbyint(std::ldexp(a, 9)));
  }
  int q = static_cast<int>(std::nearbyint(std::ldexp(a, 4 - e)));  // 1.mmm as an integer in [8, 16]
  int exp_field = e - 1 + 7;
  if (q == 16) {
    q = 8;
    ++exp_field;
  }
  if (exp_field > 15 || (exp_field == 15 && q - 8 == 7)) return sign | 0x7e;
  return sign | static_cast<uint8_t>(exp_field << 3 | (q - 8));
}

void convert_to_f32(const void* src, DType from, float* dst, size_t n) {
  switch (from) {
    case DType::kF32: std::memcpy(dst, src, n * 4); return;
    case DType::kBF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::kF8E4M3: {
      auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f8e4m3_to_f32(s[i]);
      return;
    }
    default: throw Error(fmt::format("cannot convert {} to F32", dtype_name(from)));
  }
}

void convert_from_f32(const float* src, DType to, void* dst, size_t n) {
  switch (to) {
    case DType::kF32: std::memcpy(dst, src, n * 4); return;
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::kF8E4M3: {
      auto* d = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f8e4m3(src[i]);
      return;
    }
    default: throw Error(fmt::format("cannot convert F32 to {}", dtype_name(to)));
  }
}

}  // namespace specula
