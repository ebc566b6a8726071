// The EAGLE-3 head's layer input in one kernel (Backend::eagle3_layer_input): the embedding's
// gather, both RMSNorms, the residual's copy and the two column copies that place the normed
// rows side by side.
//
// Why: those six ops move a few kilobytes a step and each costs a dependent launch (~1-2 us on
// the H200), in every head forward: the catch-up after each verification and every draft step
// that is not fused.
//
// Shape: a block per row, its two halves of W threads the two norms, each half the thread count
// and element layout rms_norm_kernel gives a row of H (one 16-byte vector a thread), reduced in
// block_reduce's order over its own warps: the outputs are those ops' bits. Launched normally,
// not overlapped: it takes the place of the embedding's gather, the forward's first launch that
// is not overlapped, which cuda_launch.cuh's contract relies on for the attention metadata.
#include <algorithm>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

constexpr int kN = Vec16<bf16>::kN;
constexpr int kMaxHalfThreads = 512;  // two halves in a block of at most 1024

__global__ void eagle3_layer_input_kernel(const int32_t* __restrict__ token_ids, const bf16* __restrict__ table,
                                          int64_t vocab, const bf16* __restrict__ g, const bf16* __restrict__ input_norm,
                                          const bf16* __restrict__ hidden_norm, int64_t h, float eps,
                                          bool norm_before_residual, bf16* __restrict__ x, bf16* __restrict__ residual) {
  __shared__ float reduce_buf[32];
  allow_next_kernel_start();
  wait_for_previous_kernels();
  const int64_t row = blockIdx.x;
  const int half_threads = blockDim.x / 2, half = threadIdx.x / half_threads, tid = threadIdx.x % half_threads;
  const int lane = tid % 32, warp = tid / 32, warps = half_threads / 32;
  const bool hidden = half == 1;
  const bool item = tid < h / kN;  // one 16-byte vector a thread (h / kN <= half_threads)

  // This half's source row: the token's embedding (a zero row for an id outside the table, as
  // the gather writes) or g's row.
  const bf16* src = nullptr;
  if (hidden) {
    src = g + row * h;
  } else {
    const int64_t id = token_ids[row];
    src = id >= 0 && id < vocab ? table + id * h : nullptr;
  }
  float a[kN];
  if (item && src != nullptr) {
    load_vec(src + tid * kN, a);
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) a[i] = 0.0f;
  }
  float sum_sq = 0.0f;
#pragma unroll
  for (int i = 0; i < kN; ++i) sum_sq += a[i] * a[i];
  // block_reduce over this half's warps alone, in its order.
  sum_sq = warp_sum(sum_sq);
  if (lane == 0) reduce_buf[half * 16 + warp] = sum_sq;
  __syncthreads();
  sum_sq = warp_sum(lane < warps ? reduce_buf[half * 16 + lane] : 0.0f);
  const float inv_rms = rsqrtf(sum_sq / static_cast<float>(h) + eps);
  if (!item) return;

  if (hidden && !norm_before_residual) store_vec(residual + row * h + tid * kN, a);  // g as it is (exact)
  float w[kN];
  load_vec((hidden ? hidden_norm : input_norm) + tid * kN, w);
#pragma unroll
  for (int i = 0; i < kN; ++i) a[i] = w[i] * (a[i] * inv_rms);
  store_vec(x + row * 2 * h + (hidden ? h : 0) + tid * kN, a);
  if (hidden && norm_before_residual) store_vec(residual + row * h + tid * kN, a);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

bool eagle3_layer_input_supports(const void* table, const void* g, const void* input_norm, const void* hidden_norm,
                                 const void* x, const void* residual, int64_t h) {
  return h > 0 && h % kN == 0 && h / kN <= kMaxHalfThreads && aligned16(table) && aligned16(g) &&
         aligned16(input_norm) && aligned16(hidden_norm) && aligned16(x) && aligned16(residual);
}

cudaError_t launch_eagle3_layer_input(const int32_t* token_ids, const void* table, int64_t vocab, const void* g,
                                      const void* input_norm, const void* hidden_norm, int64_t rows, int64_t h,
                                      float eps, bool norm_before_residual, void* x, void* residual,
                                      cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  // rms_norm's threads for a row of h: one vector each, a multiple of the warp size.
  const int half_threads = static_cast<int>(std::clamp<int64_t>((h / kN + 31) / 32 * 32, 32, kMaxHalfThreads));
  eagle3_layer_input_kernel<<<dim3(static_cast<unsigned>(rows)), dim3(2 * half_threads), 0, stream>>>(
      token_ids, static_cast<const bf16*>(table), vocab, static_cast<const bf16*>(g),
      static_cast<const bf16*>(input_norm), static_cast<const bf16*>(hidden_norm), h, eps, norm_before_residual,
      static_cast<bf16*>(x), static_cast<bf16*>(residual));
  return cudaGetLastError();
}

}  // namespace specula::cuda
