// What --shared-expert-fusion N means once the model and the device are known: N >= 0 as given
// (0 = off); -1 ("auto") = one replica on CUDA for a model with shared experts, where one fused
// MoE call for routed + shared experts is the faster path, and off on the CPU, where the separate
// shared MLP costs the same and fusion only adds routing work. Models without shared experts
// ignore it either way (model.h: ModelOptions).
#pragma once

#include "core/error.h"
#include "core/tensor.h"
#include "model/config.h"

namespace specula {

inline int resolve_shared_expert_fusion(int requested, const ModelConfig& config, Device device) {
  SPECULA_CHECK(requested >= -1, "--shared-expert-fusion must be -1 (auto), 0 (off) or a number of replicas, got {}",
                requested);
  if (requested >= 0) return requested;
  return device == Device::kCUDA && config.is_deepseek() && config.n_shared_experts > 0 ? 1 : 0;
}

}  // namespace specula
