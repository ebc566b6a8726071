#include "backend/backend.h"

#include "backend/backend_registry.h"

namespace specula {
namespace {
CudaBackendFactory& cuda_factory() {
  static CudaBackendFactory f;
  return f;
}
}  // namespace

// The MLA / MoE ops are optional per backend: a backend that lacks one says so by name.
void Backend::copy_columns(const Tensor&, int64_t, Tensor&, int64_t, int64_t) {
  throw Error(fmt::format("copy_columns is not implemented by the {} backend", name()));
}
void Backend::head_linear(const Tensor&, const Tensor&, Tensor&) {
  throw Error(fmt::format("head_linear is not implemented by the {} backend", name()));
}
void Backend::moe_route(const Tensor&, const Tensor*, const MoeRouting&, Tensor&, Tensor&) {
  throw Error(fmt::format("moe_route is not implemented by the {} backend", name()));
}
void Backend::fused_moe(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&) {
  throw Error(fmt::format("fused_moe is not implemented by the {} backend", name()));
}

void register_cuda_backend_factory(CudaBackendFactory factory) { cuda_factory() = std::move(factory); }

bool cuda_available() { return cuda_factory().available && cuda_factory().available(); }

std::unique_ptr<Backend> make_cuda_backend(int device_index) {
  SPECULA_CHECK(cuda_factory().make, "this specula was built without CUDA (nvcc was not found at build time)");
  SPECULA_CHECK(cuda_available(), "no CUDA GPU is visible");
  return cuda_factory().make(device_index);
}

}  // namespace specula
