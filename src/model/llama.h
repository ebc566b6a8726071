// The Llama family forward: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM (q/k/v bias)
// and Qwen3ForCausalLM (per-head q/k RMSNorm). One decoder, differing only in which optional
// weights exist; see llama.cc.
#pragma once

#include <memory>

#include "model/model.h"
#include "model/tensor_parallel_plan.h"
#include "model/weight_quantization.h"

namespace specula {

// Loads every weight of a Llama-family checkpoint (HF names) through `weights` onto `backend`.
// Throws specula::Error naming the tensor when one is missing or mis-shaped. A tensor-parallel
// rank (tp.size > 1) loads its shard (`weights` is then the rank's ShardedWeightSource) and
// computes its heads, channels and vocabulary rows; its forward takes part in the group's
// collectives and returns the full outputs (tensor_parallel_model.h runs the ranks together).
std::unique_ptr<Model> create_llama_model(const ModelConfig& config, WeightSource& weights, Backend& backend,
                                          const WeightQuantization& quantization = {},
                                          const TensorParallelRank& tp = {});

}  // namespace specula
