#include "engine/kv_cache_sizing.h"

#include <algorithm>

#include "core/error.h"

namespace specula {

KVCachePlan plan_kv_cache(const EngineConfig& config, size_t bytes_per_token, Device device, int max_model_len,
                          int max_num_seqs, std::optional<size_t> device_kv_budget) {
  const int bs = config.block_size;
  SPECULA_CHECK(bytes_per_token > 0, "the model's KV cache spec is empty");
  const size_t bytes_per_block = bytes_per_token * static_cast<size_t>(bs);
  KVCachePlan plan;
  if (config.num_gpu_blocks_override) {
    SPECULA_CHECK(*config.num_gpu_blocks_override > 0, "num_gpu_blocks_override must be positive, got {}",
                  *config.num_gpu_blocks_override);
    plan.num_blocks = *config.num_gpu_blocks_override;
    plan.source = "num_gpu_blocks_override";
  } else {
    size_t budget;
    if (device != Device::kCPU && device_kv_budget) {
      budget = *device_kv_budget;
      plan.source = "gpu_memory_utilization";
    } else if (device == Device::kCPU && config.cpu_kv_cache_bytes > 0) {
      budget = config.cpu_kv_cache_bytes;
      plan.source = "cpu_kv_cache_bytes";
    } else {
      // The whole batch at full length, within a cap (a device without a memory plan).
      const size_t want = static_cast<size_t>(max_num_seqs) * static_cast<size_t>(max_model_len) * bytes_per_token;
      const size_t cap = device == Device::kCPU ? kDefaultCpuKvCacheCap : kDefaultCudaKvCacheCap;
      budget = std::min(want, cap);
      plan.source = want <= cap ? "max_num_seqs x max_model_len" : "default cap";
    }
    plan.num_blocks = static_cast<int>(std::min<size_t>(budget / bytes_per_block, 1u << 30));
  }
  plan.bytes = static_cast<size_t>(plan.num_blocks) * bytes_per_block;
  const int64_t capacity = static_cast<int64_t>(plan.num_blocks) * bs;
  SPECULA_CHECK(capacity >= max_model_len,
                "The model's max seq len ({}) is larger than the maximum number of tokens that can be stored in the "
                "KV cache ({}, {:.2f} GiB chosen by {}). Decrease --max-model-len or give the KV cache more memory.",
                max_model_len, capacity, static_cast<double>(plan.bytes) / (1 << 30), plan.source);
  return plan;
}

}  // namespace specula
