// CUDA backend: whether kernels start overlapped with their predecessor (cuda_launch.cuh).
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_launch.cuh"

namespace specula::cuda {

bool overlapped_launch_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("SPECULA_PDL");
    if (v && std::strcmp(v, "0") == 0) return false;
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return major >= 9;
  }();
  return on;
}

}  // namespace specula::cuda
