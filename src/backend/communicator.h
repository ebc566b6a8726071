// The collectives a tensor-parallel model needs between its ranks (Megatron-style sharding: a
// row-parallel projection's partial sums are all-reduced, a vocab-parallel lm_head's logits
// columns all-gathered). One Communicator per rank; every rank calls the same collectives in the
// same order, each on its own backend's tensors.
//
// Implementations: threads of one process over host memory (the CPU backend, so that the whole
// tensor-parallel path runs in CI without a GPU), and NCCL on CUDA (backend/cuda).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace specula {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // t = the element-wise sum of every rank's t, in place. Every rank gets bitwise the same result
  // (the ranks' tensors are summed in rank order), so replicated activations stay identical.
  virtual void all_reduce_sum(Tensor& t) = 0;
  // Concatenates the ranks' [R, C] blocks along the columns, rank order: out [R, size * C] with
  // out[r, k * C + c] = in_k[r, c]. A vocab-parallel lm_head's logits become the full rows.
  virtual void all_gather_columns(const Tensor& in, Tensor& out) = 0;
  // Ends every collective waiting now or later with specula::Error, on every rank: a rank whose
  // forward failed calls it so that the others do not wait for it forever.
  virtual void abort() = 0;

  // While on, every collective returns at once and leaves its tensors as they are: a rehearsal
  // (model/tensor_parallel_rehearsals.h), whose activations are thrown away, runs each rank
  // without waiting for the others, so that it may do what waits for the device's queue to drain
  // (allocate device memory, load a library's kernel), which a peer's collective waiting for this
  // rank would never let happen.
  void set_rehearsal(bool on) { rehearsing_ = on; }

  // The collectives this rank has entered (a rehearsal's not counted): when a step stalls, how
  // far each rank's host got (any thread may read it).
  uint64_t collectives_entered() const { return entered_.load(std::memory_order_relaxed); }

 protected:
  void count_entered() { entered_.fetch_add(1, std::memory_order_relaxed); }
  bool rehearsing_ = false;

 private:
  std::atomic<uint64_t> entered_{0};
};

class Backend;  // backend/backend.h

// `size` communicators over threads of this process, one per rank (index = rank), for CPU
// tensors (F32). Rank k's collectives must be called from one thread at a time.
std::vector<std::unique_ptr<Communicator>> make_thread_communicators(int size);

// One communicator per rank for the ranks' backends (index = rank): threads for CPU backends,
// NCCL for CUDA backends of distinct GPUs (collectives enqueued on each rank's stream; with
// `custom_all_reduce`, small all-reduces as one peer-to-peer kernel where the GPUs allow it).
// Throws specula::Error for mixed devices or a build without what the device needs.
std::vector<std::unique_ptr<Communicator>> make_communicators(const std::vector<Backend*>& ranks,
                                                              bool custom_all_reduce = true);

}  // namespace specula
