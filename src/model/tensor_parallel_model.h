// A model split over tensor-parallel ranks, driven as one Model: one rank model per backend
// (rank 0 on the engine's backend, the others on backends of their own), each loaded from its
// ShardedWeightSource, and one thread per rank beyond the caller's. forward() runs every rank's
// forward at once; the ranks meet in their communicators' collectives, and rank 0's outputs
// (full logits, replicated hidden states) are the model's. Each rank keeps a KV cache of its own
// kv heads shaped like the engine's, which is rank 0's.
//
// On the CPU the ranks share the step's inputs and meet through the thread communicator; on CUDA
// each rank is a GPU (rank r: device r), copies the inputs to its device, and meets the others in
// NCCL collectives on its stream. A CUDA graph of the split model is one graph per GPU, each
// recorded by its rank's thread and launched together (capture_graph).
#pragma once

#include <functional>
#include <memory>

#include "model/model.h"

namespace specula {

using RankBackendFactory = std::function<std::unique_ptr<Backend>(int rank)>;

// `size` > 1 ranks of a Llama-family or DeepSeek model (check_tensor_parallel's constraints), each
// made by create_model's per-architecture factory from its ShardedWeightSource; `options`'
// make_rank_backend gives the backend of each rank from 1 on. Throws specula::Error naming what
// cannot be split.
std::unique_ptr<Model> create_tensor_parallel_model(const ModelConfig& config, WeightSource& weights,
                                                    Backend& rank0_backend, const ModelOptions& options);

}  // namespace specula
