// --calculate-kv-scales: an fp8 KV cache's per-layer scales estimated at startup from one batch
// of random tokens (vLLM's on-the-fly calibration), for checkpoints that carry none.
//
// One prefill of the calibration tokens writes their K/V into a temporary cache of the compute
// type; each layer's scales are then its largest |K| / 200 and largest |V| / 100
// (vLLM's K_SCALE_CONSTANT and V_SCALE_CONSTANT): the batch's largest value lands at 200 (K) or
// 100 (V) of e4m3's 448, leaving room for larger values later.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace specula {

inline constexpr float kKScaleConstant = 200.0f;
inline constexpr float kVScaleConstant = 100.0f;

// `count` token ids drawn uniformly from the vocabulary, the same for the same seed.
std::vector<int32_t> calibration_tokens(int64_t vocab_size, int count, uint64_t seed);

// Per layer, the scales of the K/V that one prefill of `token_ids` (one sequence) writes.
std::vector<KVCacheScales> calibrate_kv_cache_scales(Model& model, Backend& backend,
                                                     const std::vector<int32_t>& token_ids, int block_size);

}  // namespace specula
