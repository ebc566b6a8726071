// The attention prologue's arithmetic on one head (cuda_qkv_prologue.cu), shared with the qkv
// projection that runs it in its epilogue (cuda_qkv_projection.cu), so that both produce the same
// bits as the separate ops.
#pragma once

#include <type_traits>

#include "backend/cuda/cuda_engine_kernels.h"
#include "backend/cuda/cuda_kv_element.cuh"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {

constexpr int kPrologueElemsPerLane = kMaxPrologueHeadDim / 32;
constexpr int kProloguePairsPerLane = kPrologueElemsPerLane / 2;

// Where one head of a token goes: q heads to q_out, k and v heads into the cache slot `slot`
// (the compute type T, or C = fp8 holding x / scale, rounded once from fp32).
template <class T, class C>
struct PrologueDestination {
  T* q = nullptr;
  C* cache = nullptr;
  float inv_scale = 1.0f;

  __device__ PrologueDestination(const QkvPrologueParams& p, int64_t token, int head, int64_t slot) {
    const int hq = p.num_q_heads, hk = p.num_kv_heads, d = p.head_dim;
    if (head < hq) {
      q = static_cast<T*>(p.q_out) + (token * hq + head) * d;
    } else if (head < hq + hk) {
      cache = static_cast<C*>(p.k_cache) + (slot * hk + (head - hq)) * d;
      inv_scale = 1.0f / p.k_scale;
    } else {
      cache = static_cast<C*>(p.v_cache) + (slot * hk + (head - hq - hk)) * d;
      inv_scale = 1.0f / p.v_scale;
    }
  }
  __device__ __forceinline__ void store(int i, float x) const {
    if (q != nullptr) {
      q[i] = from_float<T>(x);
    } else if constexpr (std::is_same_v<C, T>) {
      cache[i] = from_float<T>(x);
    } else {
      cache[i] = from_float<C>(x * inv_scale);
    }
  }
};

// One rope pair (a, b) rotated by (cos, sin) = cs: the arithmetic of the rope op, in one place so
// that every kernel running the prologue contracts it into the same FMAs (same bits).
__device__ __forceinline__ float2 rope_rotate(float a, float b, float2 cs) {
  return make_float2(a * cs.x - b * cs.y, b * cs.x + a * cs.y);
}

// Whether a token at `pos` is roped (as the rope op: not past the cos / sin table, rotary_dim > 0).
__device__ __forceinline__ bool prologue_rotates(const QkvPrologueParams& p, int32_t pos) {
  return pos >= 0 && pos < p.max_pos && p.rotary_dim > 0;
}

// A q or k head of one token, held by a warp: x[j] is element lane + 32 j (0 past D). RMS-
// normalises it when `normed` (gamma(j): the norm weight of element lane + 32 j), ropes it when
// `rotated` (rotation(jj): cos and sin of pair lane + 32 jj) and hands every element i < D to
// store(i, value). The weights come through callbacks so that a caller may load them before it
// has the head. Arithmetic as the separate ops: fp32 math, the normalised head rounded to T
// before rope (what storing it between the two ops did). `stage`: D floats of the warp's own
// shared memory (rope pairs live in different lanes).
template <class T, class Gamma, class Rotation, class Store>
__device__ __forceinline__ void prologue_head(const QkvPrologueParams& p, bool normed, Gamma&& gamma, bool rotated,
                                              Rotation&& rotation, float (&x)[kPrologueElemsPerLane], float* stage,
                                              Store&& store) {
  const int lane = threadIdx.x % 32, d = p.head_dim;
  if (normed) {
    float sum_sq = 0.0f;
#pragma unroll
    for (int j = 0; j < kPrologueElemsPerLane; ++j) sum_sq += x[j] * x[j];
    const float inv_rms = rsqrtf(warp_sum(sum_sq) / static_cast<float>(d) + p.eps);
#pragma unroll
    for (int j = 0; j < kPrologueElemsPerLane; ++j) {
      const int i = lane + 32 * j;
      if (i < d) x[j] = to_float(from_float<T>(gamma(j) * (x[j] * inv_rms)));  // stored, as the norm op
    }
  }
  if (!rotated) {
#pragma unroll
    for (int j = 0; j < kPrologueElemsPerLane; ++j) {
      const int i = lane + 32 * j;
      if (i < d) store(i, x[j]);
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kPrologueElemsPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i < d) stage[i] = x[j];
  }
  __syncwarp();
  const int half = p.rotary_dim / 2;
#pragma unroll
  for (int jj = 0; jj < kProloguePairsPerLane; ++jj) {
    const int j = lane + 32 * jj;
    if (j >= half) break;
    const int ia = p.neox ? j : 2 * j, ib = p.neox ? j + half : 2 * j + 1;
    const float2 rotated_pair = rope_rotate(stage[ia], stage[ib], rotation(jj));
    store(ia, rotated_pair.x);
    store(ib, rotated_pair.y);
  }
  for (int i = p.rotary_dim + lane; i < d; i += 32) store(i, stage[i]);  // partial rotary
}

}  // namespace specula::cuda
