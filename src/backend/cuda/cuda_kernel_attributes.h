// Kernel attributes (more than 48 KiB of dynamic shared memory, non-portable cluster sizes) belong
// to one GPU's context: a process that drives several GPUs (tensor parallelism) must set them on
// each. This sets one on the calling thread's current GPU the first time a launch needs it there.
#pragma once

#include <cuda_runtime_api.h>

namespace specula::cuda {

// Raises `attribute` of `kernel` on the current GPU to at least `value` (cudaFuncSetAttribute
// when this GPU's setting is lower or unset). Cheap after the first call per thread and GPU.
cudaError_t raise_kernel_attribute(const void* kernel, cudaFuncAttribute attribute, int value);

template <class Kernel>
cudaError_t raise_kernel_attribute(Kernel* kernel, cudaFuncAttribute attribute, int value) {
  return raise_kernel_attribute(reinterpret_cast<const void*>(kernel), attribute, value);
}

}  // namespace specula::cuda
