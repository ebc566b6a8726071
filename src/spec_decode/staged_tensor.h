// A host staging buffer and its device twin, the input path of every static buffer the
// model-running proposers refill per step (catch-up rows, draft-step rows, greedy-chain indices).
// The host side is pinned where the backend has it, so uploads are asynchronous: a pageable one
// waits for the stream, some fifteen of them a step. Rewriting the host side must therefore wait
// for the copies out of it (Backend::synchronize).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace specula {

struct StagedTensor {
  Tensor host, device;
  void allocate(Backend& backend, int64_t n, DType type);
  // Copies host[0, n) into device[0, n) (nothing when n == 0); returns device[0, n).
  Tensor upload(Backend& backend, int64_t n);
};

// The uploads of one launch's staged inputs, issued together (Backend::copy_many: one kernel on
// CUDA where each copy of its own costs the stream ~1 us and a gap).
class StagedUploads {
 public:
  explicit StagedUploads(Backend& backend) : backend_(backend) {}
  // Queues host[0, n) -> device[0, n) (nothing when n == 0) and returns device[0, n), which
  // holds the values once run() has been called.
  Tensor add(StagedTensor& t, int64_t n);
  // Issues the queued copies.
  void run();

 private:
  Backend& backend_;
  std::vector<Backend::CopyPair> pairs_;
};

}  // namespace specula
