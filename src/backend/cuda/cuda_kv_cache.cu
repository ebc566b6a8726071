// Writes the step's new K/V rows into the paged cache.
//
// Shape: one block per token; the token's K row (Hk * D elements) and V row are contiguous both
// in the source and at their cache slot, so the block copies them as 16-byte vectors (fully
// coalesced, the widest access a thread has). Rows with slot -1 (padding, or tokens whose KV is
// not kept) are skipped; so are out-of-range slots, which the host cannot check without a sync.
// An fp8 cache is written element by element (each rounded once from fp32 after the scale): the
// models write K/V through the fused qkv prologue, so this kernel serves the unfused callers only.
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_kv_element.cuh"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

template <class U>
__global__ void write_kv_kernel(const U* __restrict__ k, const U* __restrict__ v, U* __restrict__ k_cache,
                                U* __restrict__ v_cache, const int64_t* __restrict__ slots, int64_t k_units,
                                int64_t v_units, int64_t num_slots) {
  const int64_t token = blockIdx.x;
  const int64_t slot = slots[token];
  if (slot < 0 || slot >= num_slots) return;
  for (int64_t i = threadIdx.x; i < k_units; i += blockDim.x) k_cache[slot * k_units + i] = k[token * k_units + i];
  for (int64_t i = threadIdx.x; i < v_units; i += blockDim.x) v_cache[slot * v_units + i] = v[token * v_units + i];
}

template <class T>
__global__ void write_kv_fp8_kernel(const T* __restrict__ k, const T* __restrict__ v, fp8* __restrict__ k_cache,
                                    fp8* __restrict__ v_cache, const int64_t* __restrict__ slots, int64_t k_row,
                                    int64_t v_row, int64_t num_slots, float inv_k_scale, float inv_v_scale) {
  const int64_t token = blockIdx.x;
  const int64_t slot = slots[token];
  if (slot < 0 || slot >= num_slots) return;
  for (int64_t i = threadIdx.x; i < k_row; i += blockDim.x) {
    k_cache[slot * k_row + i] = from_float<fp8>(to_float(k[token * k_row + i]) * inv_k_scale);
  }
  if (v == nullptr) return;
  for (int64_t i = threadIdx.x; i < v_row; i += blockDim.x) {
    v_cache[slot * v_row + i] = from_float<fp8>(to_float(v[token * v_row + i]) * inv_v_scale);
  }
}

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }

}  // namespace

cudaError_t launch_write_kv_cache(const void* k, const void* v, void* k_cache, void* v_cache, const int64_t* slots,
                                  int64_t tokens, size_t k_row_bytes, size_t v_row_bytes, int64_t num_slots,
                                  cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const bool vec16 = k_row_bytes % 16 == 0 && v_row_bytes % 16 == 0 && aligned(k, 16) && aligned(v, 16) &&
                     aligned(k_cache, 16) && aligned(v_cache, 16);
  const size_t unit = vec16 ? 16 : 2;  // every cache dtype is at least 2 bytes wide
  const int64_t k_units = static_cast<int64_t>(k_row_bytes / unit), v_units = static_cast<int64_t>(v_row_bytes / unit);
  const int64_t widest = k_units > v_units ? k_units : v_units;
  const int threads = widest >= 256 ? 256 : (widest <= 32 ? 32 : static_cast<int>((widest + 31) / 32 * 32));
  if (vec16) {
    write_kv_kernel<<<static_cast<unsigned>(tokens), threads, 0, stream>>>(
        static_cast<const uint4*>(k), static_cast<const uint4*>(v), static_cast<uint4*>(k_cache),
        static_cast<uint4*>(v_cache), slots, k_units, v_units, num_slots);
  } else {
    write_kv_kernel<<<static_cast<unsigned>(tokens), threads, 0, stream>>>(
        static_cast<const uint16_t*>(k), static_cast<const uint16_t*>(v), static_cast<uint16_t*>(k_cache),
        static_cast<uint16_t*>(v_cache), slots, k_units, v_units, num_slots);
  }
  return cudaGetLastError();
}

cudaError_t launch_write_kv_cache_fp8(const void* k, const void* v, DType from, void* k_cache, void* v_cache,
                                      const int64_t* slots, int64_t tokens, int64_t k_row, int64_t v_row,
                                      int64_t num_slots, float k_scale, float v_scale, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const int64_t widest = k_row > v_row ? k_row : v_row;
  const int threads = widest >= 256 ? 256 : static_cast<int>((widest + 31) / 32 * 32);
  const float inv_k = 1.0f / k_scale, inv_v = 1.0f / v_scale;
  if (from == DType::kBF16) {
    write_kv_fp8_kernel<<<static_cast<unsigned>(tokens), threads, 0, stream>>>(
        static_cast<const bf16*>(k), static_cast<const bf16*>(v), static_cast<fp8*>(k_cache),
        static_cast<fp8*>(v_cache), slots, k_row, v_row, num_slots, inv_k, inv_v);
  } else if (from == DType::kF32) {
    write_kv_fp8_kernel<<<static_cast<unsigned>(tokens), threads, 0, stream>>>(
        static_cast<const float*>(k), static_cast<const float*>(v), static_cast<fp8*>(k_cache),
        static_cast<fp8*>(v_cache), slots, k_row, v_row, num_slots, inv_k, inv_v);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace specula::cuda
