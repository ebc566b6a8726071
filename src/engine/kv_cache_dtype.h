// --kv-cache-dtype: the type the target model's paged KV cache is stored in.
//
// auto (or the backend's compute type by name) keeps the compute type; fp8 / fp8_e4m3 stores
// e4m3 with one scale per layer for K and one for V (calculated at startup with
// --calculate-kv-scales, kv_cache_calibration.h; else the checkpoint's, Model::kv_cache_scales; else
// 1.0 as vLLM uses without calibrated scales), halving the cache's bytes so that twice the tokens
// fit and decode attention streams half as much. Draft models and heads keep their caches in the
// compute type. DeepSeek's MLA latent cache stays in the compute type (its kernel reads bf16
// only): fp8 there is an error.
#pragma once

#include <string>

#include "core/dtype.h"
#include "model/model.h"

namespace specula {

// The cache type `flag` names on a backend computing in `compute`; an unknown or unsupported
// name is an error naming the accepted ones. Checked before any weight loads.
DType kv_cache_dtype_of(const std::string& flag, DType compute);

// Errors when the model's cache cannot be stored in `dtype` (an fp8 MLA cache).
void check_kv_cache_dtype_fits(DType dtype, DType compute, const KVCacheSpec& spec, const std::string& flag);

}  // namespace specula
