// The paged cache's element types as kernels write and read them: bf16, or fp8 (e4m3fn) holding
// x / scale, whose readers multiply by the layer's scale (attention folds it into q for K and
// into the output for V). Readers take a slice of consecutive elements of a row a load (8 of
// bf16, 8 or 16 of fp8) and widen them to fp32.
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

// Four e4m3 values (one 32-bit word) to fp32: two a conversion instruction (cvt.rn.f16x2.e4m3x2
// on sm_89+), then exact f16 -> f32.
__device__ __forceinline__ void fp8x4_to_float(uint32_t word, float* f) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>(word >> (16 * h));
    const float2 values = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
    f[2 * h] = values.x;
    f[2 * h + 1] = values.y;
  }
}

// E consecutive elements of a cache row of type C, read with one load (Raw) and widened to fp32.
template <class C, int E>
struct KvSlice;
template <>
struct KvSlice<bf16, 8> {
  using Raw = uint4;
  __device__ __forceinline__ static void widen(const Raw& raw, float (&f)[8]) {
    Vec16<bf16> v;
    v.raw = raw;
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = to_float(v.elems[e]);
  }
};
template <>
struct KvSlice<fp8, 8> {
  using Raw = uint2;
  __device__ __forceinline__ static void widen(const Raw& raw, float (&f)[8]) {
    fp8x4_to_float(raw.x, f);
    fp8x4_to_float(raw.y, f + 4);
  }
};
template <>
struct KvSlice<fp8, 16> {
  using Raw = uint4;
  __device__ __forceinline__ static void widen(const Raw& raw, float (&f)[16]) {
    fp8x4_to_float(raw.x, f);
    fp8x4_to_float(raw.y, f + 4);
    fp8x4_to_float(raw.z, f + 8);
    fp8x4_to_float(raw.w, f + 12);
  }
};

// ld.global.nc: the cache is not written while attention reads it. p must be aligned to Raw.
template <class C, int E>
__device__ __forceinline__ typename KvSlice<C, E>::Raw load_kv_slice(const C* p) {
  return __ldg(reinterpret_cast<const typename KvSlice<C, E>::Raw*>(p));
}

}  // namespace specula::cuda
