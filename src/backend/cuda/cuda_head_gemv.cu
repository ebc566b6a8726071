// head_linear at decode batch sizes: out[t, h, n] = sum_{k < K} x[t, h, k] w[h, n, k] for at most
// kHeadGemvMaxRows tokens. MLA's two absorbed maps (V2-Lite: 16 heads of 512 x 128 and 128 x 512,
// 2 MB each) went through cuBLAS's batched GEMM, whose kernels are not launched overlapped with
// their neighbours; at one token each map is a few thousand short dot products.
//
// Shape: a warp per kRowsPerWarp consecutive rows n of one head, lane l taking the 8-element
// chunks l, l + 32, ... of K for every row and token; the first kPreloaded chunks of its weight
// rows (K <= 512) are requested before the wait for the kernel that wrote x, since weights are
// load-time constants. fp32 sums (each lane's chunks in order, then a warp reduction) rounded
// once to bf16.
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_deepseek_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kRowsPerWarp = 4;
constexpr int kPreloaded = 2;  // 8-element chunks a lane: K <= 512

__device__ __forceinline__ void dot_chunk(const uint4& w, const uint4& x, float& acc) {
  const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&w);
  const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&x);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = __bfloat1622float2(xp[i]), b = __bfloat1622float2(wp[i]);
    acc += a.x * b.x;
    acc += a.y * b.y;
  }
}

__global__ void __launch_bounds__(kWarpsPerBlock * 32) head_gemv_kernel(HeadGemvParams p) {
  allow_next_kernel_start();
  const int lane = threadIdx.x % 32;
  const int64_t group = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int groups_per_head = p.n / kRowsPerWarp;
  const bool live = group < static_cast<int64_t>(p.heads) * groups_per_head;
  const int head = live ? static_cast<int>(group / groups_per_head) : 0;
  const int n0 = live ? static_cast<int>(group % groups_per_head) * kRowsPerWarp : 0;
  const int chunks = p.k / 8;
  const bf16* w = static_cast<const bf16*>(p.w) + (static_cast<int64_t>(head) * p.n + n0) * p.k;
  uint4 pre[kPreloaded][kRowsPerWarp];
#pragma unroll
  for (int j = 0; j < kPreloaded; ++j) {
    const int c = lane + 32 * j;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      pre[j][r] = live && c < chunks ? __ldg(reinterpret_cast<const uint4*>(w + static_cast<int64_t>(r) * p.k) + c)
                                     : make_uint4(0, 0, 0, 0);
    }
  }
  wait_for_previous_kernels();  // x is the previous kernel's output
  if (!live) return;
  float acc[kHeadGemvMaxRows][kRowsPerWarp];
#pragma unroll
  for (int t = 0; t < kHeadGemvMaxRows; ++t) {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) acc[t][r] = 0.0f;
  }
  auto add = [&](int c, const uint4 (&wc)[kRowsPerWarp]) {
#pragma unroll
    for (int t = 0; t < kHeadGemvMaxRows; ++t) {
      if (t >= p.tokens) break;
      const bf16* xt = static_cast<const bf16*>(p.x) + (static_cast<int64_t>(t) * p.heads + head) * p.kx;
      const uint4 xc = *(reinterpret_cast<const uint4*>(xt) + c);
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) dot_chunk(wc[r], xc, acc[t][r]);
    }
  };
#pragma unroll
  for (int j = 0; j < kPreloaded; ++j) {
    const int c = lane + 32 * j;
    if (c < chunks) add(c, pre[j]);
  }
  for (int c = lane + 32 * kPreloaded; c < chunks; c += 32) {
    uint4 wc[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) wc[r] = __ldg(reinterpret_cast<const uint4*>(w + static_cast<int64_t>(r) * p.k) + c);
    add(c, wc);
  }
#pragma unroll
  for (int t = 0; t < kHeadGemvMaxRows; ++t) {
    if (t >= p.tokens) break;
    bf16* out = static_cast<bf16*>(p.out) + (static_cast<int64_t>(t) * p.heads + head) * p.no + n0;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const float sum = warp_sum(acc[t][r]);
      if (lane == 0) out[r] = __float2bfloat16_rn(sum);
    }
  }
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

}  // namespace

bool head_gemv_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("SPECULA_HEAD_GEMV");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return enabled;
}

bool head_gemv_supports(const HeadGemvParams& p) {
  return head_gemv_enabled() && p.tokens >= 1 && p.tokens <= kHeadGemvMaxRows && p.heads >= 1 && p.n >= 1 &&
         p.n % kRowsPerWarp == 0 && p.k >= 8 && p.k % 8 == 0 && p.kx % 8 == 0 && aligned16(p.x) && aligned16(p.w) &&
         static_cast<int64_t>(p.heads) * (p.n / kRowsPerWarp) <= int64_t{65535} * kWarpsPerBlock;
}

cudaError_t launch_head_gemv(const HeadGemvParams& p, cudaStream_t stream) {
  if (!head_gemv_supports(p)) return cudaErrorInvalidValue;
  const int64_t groups = static_cast<int64_t>(p.heads) * (p.n / kRowsPerWarp);
  const LaunchShape shape{dim3(static_cast<unsigned>((groups + kWarpsPerBlock - 1) / kWarpsPerBlock)),
                          dim3(kWarpsPerBlock * 32)};
  return launch_overlapped(head_gemv_kernel, shape, stream, p);
}

}  // namespace specula::cuda
