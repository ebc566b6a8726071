// Registers the CUDA backend and the GPU allocator at static-initialisation time (the library is
// linked whole-archive into the binary, so this runs whenever CUDA was built).
#include <cuda_runtime_api.h>

#include "backend/backend_registry.h"
#include "backend/cuda/cuda_allocator.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/nccl_communicator.h"

namespace specula {
namespace {

bool gpu_visible() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  if (!ok) (void)cudaGetLastError();  // "no device" must not stick to later calls
  return ok;
}

const bool kRegistered = [] {
  register_allocator(Device::kCUDA, &CudaCachingAllocator::instance());
  register_cuda_backend_factory(CudaBackendFactory{
      gpu_visible,
      [] {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) (void)cudaGetLastError();
        return n;
      },
      [](int device_index) -> std::unique_ptr<Backend> { return std::make_unique<CudaBackend>(device_index); },
      make_nccl_communicators,
  });
  return true;
}();

}  // namespace
}  // namespace specula
