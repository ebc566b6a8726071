// Fused MoE for decode-sized batches (few (token, column) pairs): two GEMV-like passes.
//
// Why this shape: with T * C small every expert row is used by one or two pairs, so the step is
// bound by reading expert weights from HBM and the tensor cores would idle; what matters is
// streaming each selected expert's rows once, with 16-byte loads and enough loads in flight.
//  - pass 1 (gate|up): one warp per (pair, i) reads gate row i and up row i of the pair's expert
//    (2 x hidden bf16), dots them with the token's x (a 16-byte load per lane per row, x from L1),
//    and writes act[pair, i] = silu(gate) * up, each rounded to bf16 as the unfused ops would;
//  - pass 2 (down + weighted sum): a block per (token, 8 rows n); its warps take the token's
//    columns (warp c: column c, c + 8, ...) and read rows n of that pair's expert's w2, all 8
//    rows' loads in flight together, dot them with the pair's act row; then a thread per row sums
//    weight * output over the columns in column order in fp32: a deterministic reduction (no
//    atomics), and the weighted un-permute costs nothing extra. A warp holds 8 rows' loads in
//    flight at once: one row at a time leaves HBM idle between a warp's round trips.
// Pass 1's warps are independent (no block barrier); a block holds 8 of them so that the grid
// stays small.
#include "backend/cuda/cuda_deepseek_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kDownRows = 8;  // pass 2: rows of w2 a block's warps read together
static_assert(kDownRows <= kWarps * 32, "pass 2 sums a row a thread");

// sum_k x[k] * w[k] over n elements, by one warp, for NW weight rows at once (gate and up share
// each load of x, and both rows' loads are in flight together): lane l takes elements l*VEC..,
// l*VEC + 32*VEC.. (VEC = 8: one 16-byte load per lane per row per step; VEC = 1: scalar, for
// odd sizes). Every lane gets the sums.
template <int VEC, int NW>
__device__ __forceinline__ void warp_dots(const bf16* __restrict__ x, const bf16* const (&w)[NW], int n, int lane,
                                          float (&out)[NW]) {
#pragma unroll
  for (int r = 0; r < NW; ++r) out[r] = 0.0f;
  if constexpr (VEC == 8) {
#pragma unroll 2
    for (int k = lane * 8; k < n; k += 32 * 8) {
      float xv[8];
      load_vec(x + k, xv);
#pragma unroll
      for (int r = 0; r < NW; ++r) {
        float wv[8];
        load_vec(w[r] + k, wv);
#pragma unroll
        for (int e = 0; e < 8; ++e) out[r] += xv[e] * wv[e];
      }
    }
  } else {
    for (int k = lane; k < n; k += 32) {
      const float xv = __bfloat162float(x[k]);
#pragma unroll
      for (int r = 0; r < NW; ++r) out[r] += xv * __bfloat162float(w[r][k]);
    }
  }
#pragma unroll
  for (int r = 0; r < NW; ++r) out[r] = warp_sum(out[r]);
}

// grid (pairs, ceil(inter / kWarps)); warp -> (pair, i).
template <int VEC>
__global__ void __launch_bounds__(kWarps * 32) moe_gate_up_kernel(FusedMoeParams p, bf16* __restrict__ act) {
  allow_next_kernel_start();
  wait_for_previous_kernels();  // x and the router's ids
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t pair = blockIdx.x;
  const int i = blockIdx.y * kWarps + warp;
  if (i >= p.inter) return;
  const int64_t token = pair / p.columns;
  const int e = p.ids[pair];
  bf16* dst = act + pair * p.inter + i;
  if (e < 0 || e >= p.experts) {  // not an expert: the pair contributes nothing (pass 2 skips it)
    if (lane == 0) *dst = __float2bfloat16_rn(0.0f);
    return;
  }
  const bf16* x = static_cast<const bf16*>(p.x) + token * p.hidden;
  const bf16* gate = static_cast<const bf16*>(p.w13) + (static_cast<int64_t>(e) * 2 * p.inter + i) * p.hidden;
  const bf16* const rows[2] = {gate, gate + static_cast<int64_t>(p.inter) * p.hidden};  // gate row i, up row i
  float dots[2];
  warp_dots<VEC, 2>(x, rows, p.hidden, lane, dots);
  const float g = round_bf16(dots[0]), u = round_bf16(dots[1]);
  if (lane == 0) *dst = __float2bfloat16_rn(silu(g) * u);
}

// grid (tokens, ceil(hidden / kDownRows)); warp -> columns warp, warp + kWarps, ... of the token for
// the block's kDownRows rows. Dynamic shared memory: columns x kDownRows dots.
template <int VEC>
__global__ void __launch_bounds__(kWarps * 32) moe_down_sum_kernel(FusedMoeParams p, const bf16* __restrict__ act) {
  extern __shared__ float dots[];  // [columns][kDownRows]
  allow_next_kernel_start();
  wait_for_previous_kernels();  // act and the router's ids and weights
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t token = blockIdx.x;
  const int n0 = blockIdx.y * kDownRows;
  const int rows = min(kDownRows, p.hidden - n0);
  for (int c = warp; c < p.columns; c += kWarps) {
    const int64_t pair = token * p.columns + c;
    const int e = p.ids[pair];
    if (e < 0 || e >= p.experts) continue;  // uniform across the warp; the sum skips it
    const bf16* w = static_cast<const bf16*>(p.w2) + (static_cast<int64_t>(e) * p.hidden + n0) * p.inter;
    const bf16* row_ptrs[kDownRows];
#pragma unroll
    for (int r = 0; r < kDownRows; ++r) row_ptrs[r] = w + static_cast<int64_t>(min(r, rows - 1)) * p.inter;
    float out[kDownRows];
    warp_dots<VEC, kDownRows>(act + pair * p.inter, row_ptrs, p.inter, lane, out);
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kDownRows; ++r) dots[c * kDownRows + r] = round_bf16(out[r]);
    }
  }
  __syncthreads();
  const int r = threadIdx.x;
  if (r >= rows) return;
  float acc = 0.0f;
  for (int c = 0; c < p.columns; ++c) {
    const int64_t pair = token * p.columns + c;
    const int e = p.ids[pair];
    if (e < 0 || e >= p.experts) continue;
    acc += p.weights[pair] * dots[c * kDownRows + r];
  }
  static_cast<bf16*>(p.out)[token * p.hidden + n0 + r] = __float2bfloat16_rn(acc);
}

template <int VEC>
cudaError_t launch_vec(const FusedMoeParams& p, void* act, cudaStream_t stream) {
  const int64_t pairs = p.tokens * p.columns;
  const cudaError_t err =
      launch_overlapped(moe_gate_up_kernel<VEC>, {dim3(static_cast<unsigned>(pairs), ceil_div(p.inter, kWarps)),
                                                  dim3(kWarps * 32)},
                        stream, p, static_cast<bf16*>(act));
  if (err != cudaSuccess) return err;
  const size_t shared = static_cast<size_t>(p.columns) * kDownRows * sizeof(float);
  return launch_overlapped(moe_down_sum_kernel<VEC>,
                           {dim3(static_cast<unsigned>(p.tokens), ceil_div(p.hidden, kDownRows)), dim3(kWarps * 32),
                            shared},
                           stream, p, static_cast<const bf16*>(act));
}

}  // namespace

cudaError_t launch_fused_moe_gemv(const FusedMoeParams& p, void* act, bool vec16, cudaStream_t stream) {
  if (p.tokens == 0 || p.hidden == 0) return cudaSuccess;
  if (p.columns < 1 || p.inter < 1 || ceil_div(p.inter, kWarps) > 65535 || ceil_div(p.hidden, kDownRows) > 65535 ||
      p.tokens * p.columns > 0x7fffffff || static_cast<size_t>(p.columns) * kDownRows * sizeof(float) > 48 * 1024) {
    return cudaErrorInvalidValue;  // the caller zero-fills out for columns == 0 or inter == 0
  }
  return vec16 ? launch_vec<8>(p, act, stream) : launch_vec<1>(p, act, stream);
}

}  // namespace specula::cuda
