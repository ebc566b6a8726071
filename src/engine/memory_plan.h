// The device memory plan (vLLM's "profile run"): how much of the GPU the KV cache gets.
//
//   1. weights: measured as the memory the model's load allocated;
//   2. activations: one forward of max_num_batched_tokens tokens spread over max_num_seqs
//      sequences (as vLLM profiles), on a one-block KV cache, then a sampling call over its logits
//      rows; the scratch arena keeps the step's peak, and the sampler's buffers are allocated;
//   3. the KV cache gets gpu_memory_utilization * total device memory, minus everything in use
//      after the profile (weights, activations, the CUDA context and libraries' own memory), minus
//      a reserve for CUDA graphs and the runner's buffers.
// When that is less than one max_model_len sequence needs, the error names every size.
#pragma once

#include <cstddef>
#include <string>

#include "backend/backend.h"
#include "sampling/sampler.h"
#include "model/model.h"

namespace specula {

struct MemoryPlanConfig {
  int max_num_batched_tokens = 8192;
  int max_num_seqs = 256;
  int max_model_len = 2048;
  int block_size = 16;
  int num_speculative_tokens = 0;
  double gpu_memory_utilization = 0.9;
  size_t reserve_bytes = 0;  // CUDA graphs, the runner's persistent buffers, allocation rounding
};

struct DeviceMemoryPlan {
  size_t total = 0;        // device memory
  size_t requested = 0;    // gpu_memory_utilization * total
  size_t weights = 0;
  size_t activations = 0;  // scratch arena at the profiled peak + sampler buffers
  size_t other = 0;        // in use but not through the allocator (CUDA context, cuBLAS, ...)
  size_t reserve = 0;
  size_t kv_budget = 0;    // what the KV cache may take
  int profiled_tokens = 0;
  double profile_seconds = 0;
};

// before_weights / after_weights: backend.memory_info() before the model was loaded and right
// after (before the sampler was made: its buffers count as activations).
DeviceMemoryPlan plan_device_memory(Model& model, Backend& backend, Sampler& sampler, const MemoryPlanConfig& config,
                                    const DeviceMemoryInfo& before_weights, const DeviceMemoryInfo& after_weights);

// Throws specula::Error naming weights, activations, the available memory and what one
// max_model_len sequence needs when the budget cannot hold that one sequence.
void check_kv_budget_fits(const DeviceMemoryPlan& plan, const MemoryPlanConfig& config, size_t kv_bytes_per_token);

// What the plan keeps back beside the KV cache for memory allocated after it: the runner's input
// buffers and block tables, the KV tensors' allocation rounding, and the instantiated CUDA graphs
// (their actual footprint is logged after capture).
size_t graph_and_buffer_reserve(const MemoryPlanConfig& config, const KVCacheSpec& kv_spec);

std::string gib(size_t bytes);  // "12.34 GiB"

}  // namespace specula
