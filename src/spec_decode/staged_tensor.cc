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

Tensor StagedUploads::add(StagedTensor& t, int64_t n) {
  Tensor dst = t.device.slice(0, n);
  if (n > 0) pairs_.push_back({t.host.slice(0, n), dst});
  return dst;
}

void StagedUploads::run() {
  if (!pairs_.empty()) backend_.copy_many(pairs_);
  pairs_.clear();
}

}  // namespace specula
