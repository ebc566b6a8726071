// A MoE router's logits at decode batch sizes: out[m, e] = sum_k float(x[m, k]) * w[e, k] with
// bf16 rows, fp32 router weights (routers stay in full precision) and fp32 products and sums.
// One launch, overlapped with its neighbours, for 0.5 MB of weights (DeepSeek-V2-Lite: 64 x 2048),
// where a cast of the rows and a library fp32 GEMV would be two launches that are not.
//
// Shape: one block per expert e, its four warps splitting the weight row (thread t takes 4-float
// chunks t, t + 128, ...): the call is one memory round trip long, and 64 experts on 64 SMs keep
// 4x more loads in flight than a warp per expert on 16 SMs (whose loads queue behind each SM's).
// The first kPreloaded chunks (all of a 2048-wide row) are requested before the wait for the kernel
// that wrote x, since the weights are load-time constants. Each thread adds its chunks in order,
// then a warp reduction per row and the four warps' sums in warp order.
#include "backend/cuda/cuda_deepseek_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = kWarpsPerBlock * 32;
constexpr int kPreloaded = 4;  // float4 chunks a thread: 2048 weights of a row

__device__ __forceinline__ void add_chunk(const bf16* __restrict__ x, int64_t k, int m, int kk, const float4& w,
                                          float (&acc)[kRouterGemvMaxRows]) {
#pragma unroll
  for (int r = 0; r < kRouterGemvMaxRows; ++r) {
    if (r >= m) break;
    const uint2 raw = *reinterpret_cast<const uint2*>(x + r * k + kk);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    acc[r] += a.x * w.x;
    acc[r] += a.y * w.y;
    acc[r] += b.x * w.z;
    acc[r] += b.y * w.w;
  }
}

__global__ void __launch_bounds__(kThreads)
    router_gemv_kernel(const bf16* __restrict__ x, const float* __restrict__ w, float* __restrict__ out, int m, int n,
                       int k) {
  allow_next_kernel_start();
  __shared__ float partial[kWarpsPerBlock][kRouterGemvMaxRows];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int e = blockIdx.x;
  const float* row = w + static_cast<int64_t>(e) * k;
  float4 pre[kPreloaded];
#pragma unroll
  for (int i = 0; i < kPreloaded; ++i) {
    const int kk = (threadIdx.x + kThreads * i) * 4;
    pre[i] = kk < k ? __ldg(reinterpret_cast<const float4*>(row + kk)) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  wait_for_previous_kernels();  // x is the previous kernel's output
  float acc[kRouterGemvMaxRows];
#pragma unroll
  for (int r = 0; r < kRouterGemvMaxRows; ++r) acc[r] = 0.0f;
#pragma unroll
  for (int i = 0; i < kPreloaded; ++i) {
    const int kk = (threadIdx.x + kThreads * i) * 4;
    if (kk < k) add_chunk(x, k, m, kk, pre[i], acc);
  }
  for (int kk = (threadIdx.x + kThreads * kPreloaded) * 4; kk < k; kk += kThreads * 4) {
    add_chunk(x, k, m, kk, __ldg(reinterpret_cast<const float4*>(row + kk)), acc);
  }
#pragma unroll
  for (int r = 0; r < kRouterGemvMaxRows; ++r) {
    if (r >= m) break;
    const float sum = warp_sum(acc[r]);
    if (lane == 0) partial[warp][r] = sum;
  }
  __syncthreads();
  if (threadIdx.x < m) {
    float sum = partial[0][threadIdx.x];
#pragma unroll
    for (int i = 1; i < kWarpsPerBlock; ++i) sum += partial[i][threadIdx.x];
    out[static_cast<int64_t>(threadIdx.x) * n + e] = sum;
  }
}

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }

}  // namespace

bool router_gemv_supports(const void* x, const void* w, int64_t m, int64_t n, int64_t k) {
  return m >= 1 && m <= kRouterGemvMaxRows && n >= 1 && n <= 0x7fffffff && k >= 4 && k % 4 == 0 &&
         k <= 0x7fffffff && aligned(x, 8) && aligned(w, 16);
}

cudaError_t launch_router_gemv(const void* x, const float* w, float* out, int64_t m, int64_t n, int64_t k,
                               cudaStream_t stream) {
  if (!router_gemv_supports(x, w, m, n, k)) return cudaErrorInvalidValue;
  const LaunchShape shape{dim3(static_cast<unsigned>(n)), dim3(kThreads)};
  return launch_overlapped(router_gemv_kernel, shape, stream, static_cast<const bf16*>(x), w, out, static_cast<int>(m),
                           static_cast<int>(n), static_cast<int>(k));
}

}  // namespace specula::cuda
