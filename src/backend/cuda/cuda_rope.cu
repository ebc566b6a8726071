// Rotary position embedding, in place on q [T, Hq, D] and k [T, Hk, D].
//
// Shape: one block per token. A token's rotations all use one row of the cos/sin table, which the
// block reads once into L1; its threads then walk the (head, pair) list of both q and k, so a
// token's q and k heads are rotated by one launch. Each pair reads and writes two elements; the
// op is tiny next to the GEMMs around it, so plain scalar access is enough. fp32 math.
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

template <class T>
__global__ void rope_kernel(T* q, T* k, const int32_t* __restrict__ positions, const float* __restrict__ cos_sin,
                            int64_t max_pos, int hq, int hk, int head_dim, int rotary_dim, bool neox) {
  const int64_t token = blockIdx.x;
  const int32_t pos = positions[token];
  if (pos < 0 || pos >= max_pos) return;
  const int half = rotary_dim / 2;
  const float* cos = cos_sin + static_cast<int64_t>(pos) * rotary_dim;
  const float* sin = cos + half;
  const int pairs = (hq + hk) * half;
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int head = i / half, j = i % half;
    T* base = head < hq ? q + (token * hq + head) * head_dim : k + (token * hk + (head - hq)) * head_dim;
    T* pa = neox ? base + j : base + 2 * j;
    T* pb = neox ? base + j + half : base + 2 * j + 1;
    const float a = to_float(*pa), b = to_float(*pb), c = cos[j], s = sin[j];
    *pa = from_float<T>(a * c - b * s);
    *pb = from_float<T>(b * c + a * s);
  }
}

template <class T>
cudaError_t rope_typed(void* q, void* k, const int32_t* positions, const float* cos_sin, int64_t max_pos,
                       int64_t tokens, int hq, int hk, int head_dim, int rotary_dim, bool neox, cudaStream_t stream) {
  const int pairs = (hq + hk) * (rotary_dim / 2);
  const int threads = pairs >= 256 ? 256 : (pairs <= 32 ? 32 : (pairs + 31) / 32 * 32);
  rope_kernel<T><<<static_cast<unsigned>(tokens), threads, 0, stream>>>(static_cast<T*>(q), static_cast<T*>(k),
                                                                       positions, cos_sin, max_pos, hq, hk, head_dim,
                                                                       rotary_dim, neox);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_rope(void* q, void* k, const int32_t* positions, const float* cos_sin, int64_t max_pos,
                        int64_t tokens, int hq, int hk, int head_dim, int rotary_dim, bool neox, DType dtype,
                        cudaStream_t stream) {
  if (tokens == 0 || rotary_dim == 0) return cudaSuccess;
  if (dtype == DType::kBF16) {
    return rope_typed<bf16>(q, k, positions, cos_sin, max_pos, tokens, hq, hk, head_dim, rotary_dim, neox, stream);
  }
  if (dtype == DType::kF32) {
    return rope_typed<float>(q, k, positions, cos_sin, max_pos, tokens, hq, hk, head_dim, rotary_dim, neox, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace specula::cuda
