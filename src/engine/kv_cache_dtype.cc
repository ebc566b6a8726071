#include "engine/kv_cache_dtype.h"

#include <optional>

#include "core/error.h"

namespace specula {

DType kv_cache_dtype_of(const std::string& flag, DType compute) {
  if (flag == "auto") return compute;
  if (flag == "fp8" || flag == "fp8_e4m3") return DType::kF8E4M3;
  SPECULA_CHECK(flag != "fp8_e5m2" && flag != "fp8_inc" && flag != "fp8_ds_mla",
                "--kv-cache-dtype {}: not supported; the fp8 cache is e4m3 (use fp8 or fp8_e4m3)", flag);
  std::optional<DType> named;
  if (flag == "half" || flag == "float16") named = DType::kF16;
  if (flag == "bfloat16") named = DType::kBF16;
  if (flag == "float" || flag == "float32") named = DType::kF32;
  SPECULA_CHECK(named.has_value(), "--kv-cache-dtype {}: expected auto, fp8, fp8_e4m3, or the compute type ({})", flag,
                dtype_name(compute));
  SPECULA_CHECK(*named == compute,
                "--kv-cache-dtype {}: the cache is kept in the compute type ({}) or in fp8; use auto, fp8 or fp8_e4m3",
                flag, dtype_name(compute));
  return compute;
}

void check_kv_cache_dtype_fits(DType dtype, DType compute, const KVCacheSpec& spec, const std::string& flag) {
  SPECULA_CHECK(dtype == compute || spec.v_head_dim > 0,
                "--kv-cache-dtype {}: the model's MLA latent cache is kept in the compute type ({}); use auto", flag,
                dtype_name(compute));
}

}  // namespace specula
