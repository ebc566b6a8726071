#include "spec_decode/staged_tensor.h"

namespace specula {

void StagedTensor::allocate(Backend& backend, int64_t n, DType type) {
  host = backend.empty_host({n}, type);
  device = backend.empty({n}, type);
}

Tensor StagedTensor::upload(Backend& backend, int64_t n) {
  Tensor dst = device.slice(0, n);
  if (n > 0) backend.copy(host.slice(0, n), dst);
  return dst;
}

}  // namespace specula
