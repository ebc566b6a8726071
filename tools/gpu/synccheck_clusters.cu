// Is compute-sanitizer synccheck's "Divergent thread(s) in warp" in sample_plain_rows_kernel
// (docs/PERFORMANCE.md, the synccheck finding) the kernel's or the tool's? The same block scan
// (block_exclusive_scan_u64, whose barriers every thread reaches converged: full-mask shuffles
// precede them) in a 16-block kernel, launched over `rows` rows with and without thread-block
// clusters. Prints each launch's CUDA status; run under synccheck (synccheck_clusters.sh).
#include <cooperative_groups.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "backend/cuda/cuda_utils.cuh"

namespace {

using u64 = unsigned long long;
constexpr int kThreads = 512, kWarps = kThreads / 32, kCluster = 16;

__global__ void __launch_bounds__(kThreads) scan_kernel(const float* x, int64_t n, u64* out, bool clustered) {
  namespace cg = cooperative_groups;
  __shared__ u64 part[kWarps];
  const int64_t per_block = (n + kCluster - 1) / kCluster;
  const int64_t lo = min(n, static_cast<int64_t>(blockIdx.x) * per_block), hi = min(n, lo + per_block);
  if (clustered) cg::this_cluster().sync();
  u64 local = 0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += kThreads) local += static_cast<u64>(x[i] * 1000.0f);
  u64 total = 0;
  const u64 before = specula::cuda::block_exclusive_scan_u64<kWarps>(local, &total, part);
  if (clustered) cg::this_cluster().sync();
  out[(static_cast<int64_t>(blockIdx.y) * kCluster + blockIdx.x) * kThreads + threadIdx.x] = before + total;
}

cudaError_t launch(const float* x, int64_t n, u64* out, int rows, bool clustered) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = kCluster;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(kCluster, static_cast<unsigned>(rows));
  config.blockDim = dim3(kThreads);
  config.attrs = clustered ? &attribute : nullptr;
  config.numAttrs = clustered ? 1 : 0;
  if (clustered) cudaFuncSetAttribute(scan_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  const cudaError_t e = cudaLaunchKernelEx(&config, scan_kernel, x, n, out, clustered);
  return e != cudaSuccess ? e : cudaDeviceSynchronize();
}

}  // namespace

// synccheck_clusters ROWS clustered|plain [N]
int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s ROWS clustered|plain [N]\n", argv[0]);
    return 2;
  }
  const int rows = std::atoi(argv[1]);
  const bool clustered = std::string_view(argv[2]) == "clustered";
  const int64_t n = argc > 3 ? std::atoll(argv[3]) : 8192;
  float* x = nullptr;
  u64* out = nullptr;
  cudaMalloc(&x, n * sizeof(float));
  cudaMemset(x, 0, n * sizeof(float));
  cudaMalloc(&out, static_cast<size_t>(rows) * kCluster * kThreads * sizeof(u64));
  const cudaError_t e = launch(x, n, out, rows, clustered);
  std::printf("%d rows, %s: %s\n", rows, argv[2], cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
