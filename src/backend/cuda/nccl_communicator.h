// NCCL communicators for the ranks of one process, one GPU each (ncclCommInitAll), enqueueing
// their collectives on each rank's CUDA backend stream. libnccl.so.2 is opened when the first
// group is made, so a single-GPU specula runs where NCCL is not installed.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"

namespace specula {

// `ranks` are CudaBackends of distinct GPUs, index = rank. With `custom_all_reduce`, small
// all-reduces run as one peer-to-peer kernel (peer_all_reduce.h) where the GPUs map each other's
// memory (vLLM's custom all-reduce; --disable-custom-all-reduce turns it off). Throws
// specula::Error when NCCL cannot be opened or initialised.
std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(const std::vector<Backend*>& ranks,
                                                                   bool custom_all_reduce);

}  // namespace specula
