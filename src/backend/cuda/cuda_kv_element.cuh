// The paged cache's element types as kernels write and read them: bf16, or fp8 (e4m3fn) holding
// x / scale, whose readers multiply by the layer's scale (attention folds it into q for K and
// into the output for V). Readers take eight consecutive elements of a row a load (16 bytes of
// bf16, 8 of fp8) and widen them to fp32.
#pragma once

#include <cuda_fp8.h>

#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {

using fp8 = __nv_fp8_e4m3;

__device__ __forceinline__ float to_float(fp8 x) { return static_cast<float>(x); }
// Round to nearest even, saturating at +-448 (e4m3fn has no infinity), as the CPU's f32_to_f8e4m3.
template <>
__device__ __forceinline__ fp8 from_float<fp8>(float x) {
  return fp8(x);
}

template <class C>
struct KvSlice;
template <>
struct KvSlice<bf16> {
  using Raw = uint4;
};
template <>
struct KvSlice<fp8> {
  using Raw = uint2;
};

// ld.global.nc: the cache is not written while attention reads it.
template <class C>
__device__ __forceinline__ typename KvSlice<C>::Raw load_kv_slice(const C* p) {
  return __ldg(reinterpret_cast<const typename KvSlice<C>::Raw*>(p));
}

__device__ __forceinline__ void kv_slice_to_float(const uint4& raw, float (&f)[8]) {
  Vec16<bf16> v;
  v.raw = raw;
#pragma unroll
  for (int e = 0; e < 8; ++e) f[e] = to_float(v.elems[e]);
}

// Two e4m3 values a conversion instruction (cvt.rn.f16x2.e4m3x2 on sm_89+), then exact f16 -> f32.
__device__ __forceinline__ void kv_slice_to_float(const uint2& raw, float (&f)[8]) {
  const uint32_t words[2] = {raw.x, raw.y};
#pragma unroll
  for (int w = 0; w < 2; ++w) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>(words[w] >> (16 * h));
      const __half2 halves = __half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3));
      const float2 values = __half22float2(halves);
      f[4 * w + 2 * h] = values.x;
      f[4 * w + 2 * h + 1] = values.y;
    }
  }
}

}  // namespace specula::cuda
