// How many KV cache blocks to allocate.
//
// CPU: EngineConfig::cpu_kv_cache_bytes, or by default enough for max_num_seqs sequences of
// max_model_len tokens, capped at kDefaultCpuKvCacheCap (host RAM is shared with the weights).
// CUDA: the memory plan's budget (memory_plan.h: gpu_memory_utilization * total minus weights,
// profiled activations and the rest in use); without one, the CPU rule with a larger cap.
// num_gpu_blocks_override wins on any device. Either way the cache must hold one max_model_len
// sequence, or the engine refuses to start (as vLLM does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "engine/llm_engine.h"

namespace specula {

inline constexpr size_t kDefaultCpuKvCacheCap = size_t{4} << 30;
inline constexpr size_t kDefaultCudaKvCacheCap = size_t{16} << 30;

struct KVCachePlan {
  int num_blocks = 0;
  size_t bytes = 0;        // K and V over all layers
  std::string source;      // how the size was chosen, for the log
};

// bytes_per_token: K and V of every layer of every cache a block holds (target and draft);
// device_kv_budget: bytes the device memory plan leaves for the KV cache (CUDA).
KVCachePlan plan_kv_cache(const EngineConfig& config, size_t bytes_per_token, Device device, int max_model_len,
                          int max_num_seqs, std::optional<size_t> device_kv_budget = std::nullopt);

}  // namespace specula
