// The CUDA backend lives in its own library (built only when nvcc is found) and registers its
// factory here from a static initialiser, so the CPU-only layers never reference CUDA symbols.
#pragma once

#include <functional>
#include <memory>

#include "backend/backend.h"

namespace specula {

struct CudaBackendFactory {
  std::function<bool()> available;
  std::function<std::unique_ptr<Backend>(int device_index)> make;
};
void register_cuda_backend_factory(CudaBackendFactory factory);

}  // namespace specula
