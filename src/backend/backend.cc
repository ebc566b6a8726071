#include "backend/backend.h"

#include "backend/backend_registry.h"

namespace specula {
namespace {
CudaBackendFactory& cuda_factory() {
  static CudaBackendFactory f;
  return f;
}
}  // namespace

void register_cuda_backend_factory(CudaBackendFactory factory) { cuda_factory() = std::move(factory); }

bool cuda_available() { return cuda_factory().available && cuda_factory().available(); }

std::unique_ptr<Backend> make_cuda_backend(int device_index) {
  SPECULA_CHECK(cuda_factory().make, "this specula was built without CUDA (nvcc was not found at build time)");
  SPECULA_CHECK(cuda_available(), "no CUDA GPU is visible");
  return cuda_factory().make(device_index);
}

}  // namespace specula
