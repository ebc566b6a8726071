// DeepseekV2ForCausalLM and DeepseekV3ForCausalLM: MLA attention over a latent paged cache and
// MoE layers with routed and shared experts. The decoder layer itself is in deepseek_layer.h.
#pragma once

#include <memory>

#include "model/model.h"
#include "model/tensor_parallel_plan.h"

namespace specula {

// Loads every weight of a DeepSeek-V2/V3 checkpoint (HF names) through `weights` onto `backend`;
// MTP layers stored after the main ones (model.layers.{num_hidden_layers + i}) are left for the
// MTP proposer. Throws specula::Error naming the tensor when one is missing or mis-shaped. A
// tensor-parallel rank (tp.size > 1) loads its shard through its ShardedWeightSource and takes part
// in the group's collectives (tensor_parallel_plan.h says how DeepSeek splits).
std::unique_ptr<Model> create_deepseek_model(const ModelConfig& config, WeightSource& weights, Backend& backend,
                                             const ModelOptions& options, const TensorParallelRank& tp = {});

}  // namespace specula
