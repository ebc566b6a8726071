// The CUDA backend lives in its own library (built only when nvcc is found) and registers its
// factory here from a static initialiser, so the CPU-only layers never reference CUDA symbols.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"

namespace specula {

struct CudaBackendFactory {
  std::function<bool()> available;
  std::function<int()> device_count;
  std::function<std::unique_ptr<Backend>(int device_index)> make;
  // NCCL communicators over CUDA backends, one per rank (backend/communicator.h).
  std::function<std::vector<std::unique_ptr<Communicator>>(const std::vector<Backend*>& ranks, bool custom_all_reduce)>
      make_communicators;
};
void register_cuda_backend_factory(CudaBackendFactory factory);

}  // namespace specula
