// The Llama attention prologue in one launch: split the fused qkv GEMM output into heads,
// RMS-normalise q and k heads (Qwen3's q_norm / k_norm), rope them, write q out and k, v into
// their cache slots. On a decode step this replaces 3 gather_rows + 2 rms_norm + rope +
// write_kv_cache launches per layer by one: at batch 1 each of those moves a few kilobytes and
// costs only its launch, so the launches were the cost.
//
// Shape: one warp per (token, head); a head (D <= 256 elements) is at most 8 elements a lane, so
// the norm is one warp reduction with no shared memory or barriers across warps. Rope pairs
// (i, i + rotary_dim / 2) (neox) or (2i, 2i + 1) live in different lanes, so the normalised head
// is staged in the warp's own slice of shared memory and each lane then computes whole pairs
// (prologue_head, cuda_qkv_prologue.cuh). An fp8 cache gets the fp32 result divided by its
// scale, rounded once. After an FP8 GEMM the prologue applies the product's scales as it reads
// it, so that the scale pass is not a launch of its own.
#include <type_traits>

#include "backend/cuda/cuda_engine_kernels.h"
#include "backend/cuda/cuda_fp8_scale.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_kv_element.cuh"
#include "backend/cuda/cuda_qkv_prologue.cuh"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

// T: the compute type (qkv, q_out); C: the cache's (T, or fp8).
template <class T, class C>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) qkv_prologue_kernel(QkvPrologueParams p) {
  __shared__ float stage[kWarpsPerBlock][kMaxPrologueHeadDim];
  allow_next_kernel_start();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int hq = p.num_q_heads, hk = p.num_kv_heads, d = p.head_dim;
  const int heads = hq + 2 * hk;
  const int head = blockIdx.y * kWarpsPerBlock + warp;
  const int64_t token = blockIdx.x;
  const bool is_q = head < hq, is_v = head >= hq + hk;
  // Before the wait: the token's slot and position (forward inputs, written before the forward's
  // first launch that is not overlapped: cuda_launch.cuh), the rotation its position selects and
  // the norm weights, so that after it only the head's own elements are a round trip away (the
  // slot, then the position, then its rotation were three in a row).
  const int64_t slot = p.slots[token];
  const int32_t pos = p.positions[token];
  const T* norm = static_cast<const T*>(is_q ? p.q_norm : p.k_norm);
  const bool normed = !is_v && head < heads && norm != nullptr, rotated = !is_v && head < heads && prologue_rotates(p, pos);
  float gamma[kPrologueElemsPerLane];
  float2 rotation[kProloguePairsPerLane];
#pragma unroll
  for (int j = 0; j < kPrologueElemsPerLane; ++j) {
    const int i = lane + 32 * j;
    gamma[j] = normed && i < d ? to_float(norm[i]) : 0.0f;
  }
  const float* cos = p.cos_sin + static_cast<int64_t>(rotated ? pos : 0) * p.rotary_dim;
#pragma unroll
  for (int jj = 0; jj < kProloguePairsPerLane; ++jj) {
    const int j = lane + 32 * jj, half = p.rotary_dim / 2;
    rotation[jj] = rotated && j < half ? make_float2(cos[j], cos[half + j]) : make_float2(0.0f, 0.0f);
  }
  wait_for_previous_kernels();  // qkv is the previous kernel's output
  if (head >= heads) return;
  const bool keep_kv = slot >= 0 && slot < p.num_slots;
  if (!is_q && !keep_kv) return;  // padding row or a token whose K/V is not kept

  const T* src = static_cast<const T*>(p.qkv) + (token * heads + head) * d;
  const PrologueDestination<T, C> dst(p, token, head, slot);
  auto store = [&](int i, float x) { dst.store(i, x); };
  const bool unscaled = p.x_scale != nullptr;
  const float xs = unscaled ? p.x_scale[token] : 1.0f;
  auto element = [&](int i) {  // the projection's element i of this head, as stored between the ops
    if (!unscaled) return to_float(src[i]);
    return to_float(from_float<T>(fp8_scaled(to_float(src[i]), xs, p.w_scale, p.bias, p.bias_f32,
                                              static_cast<int64_t>(head) * d + i)));
  };
  if (is_v) {  // v: a plain copy into its cache slot
    for (int i = lane; i < d; i += 32) {
      if constexpr (std::is_same_v<C, T>) {
        dst.cache[i] = unscaled ? from_float<T>(element(i)) : src[i];
      } else {
        store(i, element(i));
      }
    }
    return;
  }

  float x[kPrologueElemsPerLane];
#pragma unroll
  for (int j = 0; j < kPrologueElemsPerLane; ++j) {
    const int i = lane + 32 * j;
    x[j] = i < d ? element(i) : 0.0f;
  }
  prologue_head<T>(
      p, normed, [&](int j) { return gamma[j]; }, rotated, [&](int jj) { return rotation[jj]; }, x, stage[warp], store);
}

template <class T>
cudaError_t launch_typed(const QkvPrologueParams& p, dim3 grid, cudaStream_t stream) {
  const LaunchShape shape{grid, dim3(kWarpsPerBlock * 32)};
  if (p.cache_fp8) return launch_overlapped(qkv_prologue_kernel<T, fp8>, shape, stream, p);
  return launch_overlapped(qkv_prologue_kernel<T, T>, shape, stream, p);
}

}  // namespace

cudaError_t launch_qkv_prologue(const QkvPrologueParams& p, DType dtype, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  if (p.head_dim <= 0 || p.head_dim > kMaxPrologueHeadDim) return cudaErrorInvalidValue;
  const int heads = p.num_q_heads + 2 * p.num_kv_heads;
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(ceil_div(heads, kWarpsPerBlock)));
  if (dtype == DType::kBF16) return launch_typed<bf16>(p, grid, stream);
  if (dtype == DType::kF32) return launch_typed<float>(p, grid, stream);
  return cudaErrorInvalidValue;
}

}  // namespace specula::cuda
