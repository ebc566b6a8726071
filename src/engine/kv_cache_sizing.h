// How many KV cache blocks to allocate.
//
// CPU: EngineConfig::cpu_kv_cache_bytes, or by default enough for max_num_seqs sequences of
// max_model_len tokens, capped at kDefaultCpuKvCacheCap (host RAM is shared with the weights).
// CUDA: HOOK for the CUDA memory plan (profile a max-size forward, then take
// gpu_memory_utilization * total - used); until it lands, the CPU rule with a larger cap.
// num_gpu_blocks_override wins on any device. Either way the cache must hold one max_model_len
// sequence, or the engine refuses to start (as vLLM does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "engine/llm_engine.h"
#include "model/model.h"

namespace specula {

inline constexpr size_t kDefaultCpuKvCacheCap = size_t{4} << 30;
inline constexpr size_t kDefaultCudaKvCacheCap = size_t{16} << 30;

struct KVCachePlan {
  int num_blocks = 0;
  size_t bytes = 0;        // K and V over all layers
  std::string source;      // how the size was chosen, for the log
};

KVCachePlan plan_kv_cache(const EngineConfig& config, const KVCacheSpec& spec, DType dtype, Device device,
                          int max_model_len, int max_num_seqs);

}  // namespace specula
