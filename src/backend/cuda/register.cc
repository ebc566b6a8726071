// Registers the CUDA backend with the backend registry at static-initialisation time (the library
// is linked whole-archive into the binary, so this runs whenever CUDA was built).
#include <cuda_runtime.h>

#include "backend/backend_registry.h"

namespace specula {
namespace {

bool gpu_visible() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

const bool kRegistered = [] {
  register_cuda_backend_factory(CudaBackendFactory{
      gpu_visible,
      [](int) -> std::unique_ptr<Backend> { throw Error("the CUDA backend is not implemented yet"); },
  });
  return true;
}();

}  // namespace
}  // namespace specula
