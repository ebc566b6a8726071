// How a model is split over tensor-parallel ranks (Megatron-style), decided from its config:
// which shapes a rank computes with and which part of each checkpoint tensor it holds.
//
// Llama family: q/k/v and gate/up are column-parallel (a rank holds its heads' and its
// intermediate channels' rows), o_proj and down_proj row-parallel (the matching columns; the
// ranks' partial sums are all-reduced, and their biases live on rank 0 only so that the sum adds
// them once), the embedding and lm_head vocab-parallel (a rank's rows of the vocabulary; the
// embeddings are summed, the logits gathered), the norms replicated. With fewer kv heads than ranks, each rank holds one kv
// head, replicated over the ranks whose query heads share it (rank r: kv head r * Hk / N).
#pragma once

#include <string>

#include "model/config.h"
#include "model/weight_source.h"

namespace specula {

class Communicator;  // backend/communicator.h

// A model's place in its tensor-parallel group. size 1: the whole model, no communicator.
struct TensorParallelRank {
  int rank = 0;
  int size = 1;
  Communicator* communicator = nullptr;
};

// Throws specula::Error naming the constraint that fails: a head count, kv head count (Llama
// family), intermediate size (DeepSeek: dense and MoE) or vocabulary that `size` does not divide.
void check_tensor_parallel(const ModelConfig& config, int size);

// The config one rank's layers compute with: its query heads, kv heads and intermediate channels
// (DeepSeek: also each expert's).
// Hidden size, head_dim, vocabulary and everything else stay the model's.
ModelConfig rank_config(const ModelConfig& config, int size);

// How one rank holds a weight.
struct WeightShard {
  enum class Kind {
    kReplicated,   // the whole tensor
    kSliced,       // `slice` of it; the stored tensor's extent along slice.dim is `full_extent`
    kRankZeroOnly  // rank 0 holds it, every other rank zeros of its shape
  };
  Kind kind = Kind::kReplicated;
  TensorSlice slice{};
  int64_t full_extent = 0;
};

// Rank `rank` of `size`'s shard of the Llama-family weight `name` (HF names).
WeightShard llama_weight_shard(const std::string& name, const ModelConfig& config, int rank, int size);

// DeepSeek-V2/V3 (HF names): MLA by heads (q_proj / q_b_proj and kv_b_proj rows, o_proj columns;
// q_a, kv_a and their norms, which make the latent every head reads, replicated, so each rank
// keeps the whole latent cache); the dense MLP, every routed expert and the shared experts by
// intermediate channels (gate/up rows, down columns), the router replicated; the embedding and
// lm_head by vocabulary rows; FP8 block scales (_scale_inv) with their weight's blocks. Transformers 5's
// fused expert tensors (experts.gate_up_proj: gate and up rows in one) cannot be split by one
// slice: such a checkpoint fails to load with a shape error naming the tensor.
WeightShard deepseek_weight_shard(const std::string& name, const ModelConfig& config, int rank, int size);

}  // namespace specula
