// The GEMV's building blocks (cuda_gemv.cu), shared with the kernels that fold a GEMV into a
// larger step (cuda_qkv_projection.cu): weight chunks, activation loads and the staged norm.
#pragma once

#include <cuda_fp8.h>

#include "backend/cuda/cuda_engine_kernels.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {

constexpr int kGemvWarps = 4;
constexpr int kGemvThreads = kGemvWarps * 32;
// The next kernel may start (and stream its own weights) while this one runs when its weights
// take at most ~4 us to stream at the H100's 3 TB/s, i.e. when launch latency is a large part of
// it; a larger kernel lets it start once every block is on its last row group (starting early
// slowed the 8B model's batch-1 step by 5%: docs/PERFORMANCE.md).
constexpr int64_t kGemvStartNextEarlyBytes = 12 << 20;

// The GEMV of one normed decode row of a qkv projection with the attention prologue `q` as its
// epilogue (q heads into q_out, k and v into their cache slots; a.out is not written), for a
// prologue without q/k norms over the whole head with neox pairs (Llama's), where the GEMV would
// stream the row in passes (larger weights than the cluster form of cuda_qkv_projection.cu takes).
// Same bits as launch_gemv then launch_qkv_prologue.
bool gemv_rope_epilogue_supports(const GemvArgs& a, const QkvPrologueParams& q);
cudaError_t launch_gemv_rope_epilogue(const GemvArgs& a, const QkvPrologueParams& q, cudaStream_t stream);

// A 16-byte chunk of weights -> floats.
template <class W>
struct WeightChunk;

template <>
struct WeightChunk<bf16> {
  static constexpr int kN = 8;
  __device__ __forceinline__ static void decode(const uint4& v, float (&f)[kN]) {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(words[i] << 16);
      f[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  }
};

template <>
struct WeightChunk<uint8_t> {  // e4m3
  static constexpr int kN = 16;
  __device__ __forceinline__ static float2 pair(uint32_t p) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(p), __NV_E4M3);
    return __half22float2(*reinterpret_cast<const __half2*>(&h));
  }
  __device__ __forceinline__ static void decode(const uint4& v, float (&f)[kN]) {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 lo = pair(words[i] & 0xffffu), hi = pair(words[i] >> 16);
      f[4 * i] = lo.x;
      f[4 * i + 1] = lo.y;
      f[4 * i + 2] = hi.x;
      f[4 * i + 3] = hi.y;
    }
  }
};

// N bf16 activations (N a multiple of 8, 16-byte aligned; global or shared) -> floats.
template <int N>
__device__ __forceinline__ void load_activations(const bf16* p, float (&f)[N]) {
#pragma unroll
  for (int v = 0; v < N / 8; ++v) {
    const uint4 a = *reinterpret_cast<const uint4*>(p + 8 * v);
    const uint32_t words[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[8 * v + 2 * i] = __uint_as_float(words[i] << 16);
      f[8 * v + 2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  }
}

// The block writes rms_norm(x) for rows 0..m-1 into `staged` [m, k] (bf16), exactly as rms_norm
// stores it: every row's sum of squares in one pass, one block reduction per row. Where a row is
// at most one chunk a thread, the chunk and its norm weights stay in registers between the two
// passes, so that the second pass waits on no memory round trip.
template <int MT>
__device__ void stage_norm(const GemvArgs& a, bf16* staged) {
  const auto* x = static_cast<const bf16*>(a.x);
  const auto* gamma = static_cast<const bf16*>(a.norm_weight);
  const int m = static_cast<int>(a.m);
  const int64_t k = a.k, chunks = k / 8;
  const bool kept = chunks <= kGemvThreads;
  __shared__ float partial[kGemvWarps][MT];
  __shared__ float inv_rms[MT];
  float sum_sq[MT], v_kept[MT][8], g_kept[8];
  if (kept && threadIdx.x < chunks) load_activations<8>(gamma + threadIdx.x * 8, g_kept);
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) sum_sq[mi] = 0.0f;
  for (int64_t c = threadIdx.x; c < chunks; c += kGemvThreads) {
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
      if (mi < m) {
        float v[8];
        load_activations<8>(x + mi * k + c * 8, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          sum_sq[mi] += v[i] * v[i];
          v_kept[mi][i] = v[i];
        }
      }
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
    const float s = warp_sum(sum_sq[mi]);
    if (lane == 0) partial[warp][mi] = s;
  }
  __syncthreads();
  if (threadIdx.x < MT) {
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kGemvWarps; ++w) s += partial[w][threadIdx.x];
    inv_rms[threadIdx.x] = rsqrtf(s / static_cast<float>(k) + a.eps);
  }
  __syncthreads();
  auto store = [&](int mi, int64_t c, const float (&v)[8], const float (&g)[8]) {
    const float inv = inv_rms[mi];
    uint32_t packed[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) packed[i] = pack_bf16x2(g[2 * i] * (v[2 * i] * inv), g[2 * i + 1] * (v[2 * i + 1] * inv));
    *reinterpret_cast<uint4*>(staged + mi * k + c * 8) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  };
  if (kept) {
    if (threadIdx.x < chunks) {
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
        if (mi < m) store(mi, threadIdx.x, v_kept[mi], g_kept);
    }
    return;
  }
  for (int mi = 0; mi < m; ++mi) {
    for (int64_t c = threadIdx.x; c < chunks; c += kGemvThreads) {
      float v[8], g[8];
      load_activations<8>(x + mi * k + c * 8, v);
      load_activations<8>(gamma + c * 8, g);
      store(mi, c, v, g);
    }
  }
}

}  // namespace specula::cuda
