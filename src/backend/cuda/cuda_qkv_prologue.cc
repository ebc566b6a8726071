// CUDA backend: argument checks and launch of the fused Llama attention prologue
// (Backend::qkv_prologue; kernel in cuda_qkv_prologue.cu).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_engine_kernels.h"

namespace specula {

void CudaBackend::qkv_prologue(const Tensor& qkv, const QkvPrologue& p, KVCacheLayer& cache,
                               const Tensor& slot_mapping, Tensor& q_out) {
  const char* op = "qkv_prologue";
  cuda_check::float_tensor(qkv, op, "qkv");
  cuda_check::on_gpu(q_out, op, "q_out");
  cuda_check::on_gpu(cache.k, op, "cache.k");
  cuda_check::on_gpu(cache.v, op, "cache.v");
  cuda_check::same_dtype(qkv, q_out, op, "qkv", "q_out");
  const bool fp8 = cache.k.dtype() == DType::kF8E4M3;  // else the cache is in the compute type
  if (!fp8) cuda_check::same_dtype(qkv, cache.k, op, "qkv", "cache.k");
  cuda_check::same_dtype(cache.k, cache.v, op, "cache.k", "cache.v");
  SPECULA_CHECK(!fp8 || (cache.k_scale > 0.0f && cache.v_scale > 0.0f),
                "qkv_prologue: the fp8 cache's scales must be positive (k {}, v {})", cache.k_scale, cache.v_scale);
  cuda_check::index_vector(slot_mapping, DType::kI64, op, "slot_mapping");
  SPECULA_CHECK(p.positions != nullptr && p.cos_sin != nullptr, "qkv_prologue: positions and cos_sin are required");
  cuda_check::index_vector(*p.positions, DType::kI32, op, "positions");
  cuda_check::dtype(*p.cos_sin, DType::kF32, op, "cos_sin");
  SPECULA_CHECK(qkv.ndim() == 2 && p.num_q_heads > 0 && p.num_kv_heads > 0,
                "qkv_prologue: qkv {} must be [T, (Hq + 2 Hk) D] with positive head counts ({} q, {} kv)",
                qkv.describe(), p.num_q_heads, p.num_kv_heads);
  const int64_t t = qkv.size(0), hq = p.num_q_heads, hk = p.num_kv_heads, heads = hq + 2 * hk;
  SPECULA_CHECK(qkv.size(1) % heads == 0, "qkv_prologue: qkv {} is not {} heads per token", qkv.describe(), heads);
  const int64_t d = qkv.size(1) / heads;
  SPECULA_CHECK(d > 0 && d <= cuda::kMaxPrologueHeadDim, "qkv_prologue: head dim {} must be in (0, {}] on CUDA", d,
                cuda::kMaxPrologueHeadDim);
  SPECULA_CHECK(q_out.numel() == t * hq * d, "qkv_prologue: q_out {} must be [{}, {}, {}]", q_out.describe(), t, hq,
                d);
  SPECULA_CHECK(cache.k.ndim() == 4 && cache.v.ndim() == 4 && cache.k.size(2) == hk && cache.k.size(3) == d &&
                    cache.v.size(2) == hk && cache.v.size(3) == d && cache.k.size(0) == cache.v.size(0) &&
                    cache.k.size(1) == cache.v.size(1),
                "qkv_prologue: cache.k {} / cache.v {} must be [num_blocks, block_size, {}, {}]", cache.k.describe(),
                cache.v.describe(), hk, d);
  SPECULA_CHECK(p.positions->size(0) >= t && slot_mapping.size(0) >= t,
                "qkv_prologue: positions {} / slot_mapping {} have fewer than the {} rows of qkv",
                p.positions->describe(), slot_mapping.describe(), t);
  SPECULA_CHECK(p.rotary_dim >= 0 && p.rotary_dim % 2 == 0 && p.rotary_dim <= d,
                "qkv_prologue: rotary_dim {} must be even and in [0, head_dim = {}]", p.rotary_dim, d);
  SPECULA_CHECK(p.cos_sin->ndim() == 2 && p.cos_sin->size(1) == p.rotary_dim,
                "qkv_prologue: cos_sin {} must be [max_positions, rotary_dim = {}]", p.cos_sin->describe(),
                p.rotary_dim);
  for (const Tensor* norm : {p.q_norm, p.k_norm}) {
    if (norm == nullptr) continue;
    cuda_check::on_gpu(*norm, op, "q_norm / k_norm");
    cuda_check::same_dtype(qkv, *norm, op, "qkv", "q_norm / k_norm");
    SPECULA_CHECK(norm->ndim() == 1 && norm->size(0) == d, "qkv_prologue: norm weight {} must be [{}]",
                  norm->describe(), d);
  }
  cuda::QkvPrologueParams kp;
  kp.qkv = qkv.data();
  kp.q_norm = p.q_norm ? p.q_norm->data() : nullptr;
  kp.k_norm = p.k_norm ? p.k_norm->data() : nullptr;
  kp.positions = p.positions->data_as<int32_t>();
  kp.cos_sin = p.cos_sin->data_as<float>();
  kp.slots = slot_mapping.data_as<int64_t>();
  kp.q_out = q_out.data();
  kp.k_cache = cache.k.data();
  kp.v_cache = cache.v.data();
  kp.cache_fp8 = fp8;
  kp.k_scale = cache.k_scale;
  kp.v_scale = cache.v_scale;
  kp.tokens = t;
  kp.max_pos = p.cos_sin->size(0);
  kp.num_slots = cache.k.size(0) * cache.k.size(1);
  kp.num_q_heads = static_cast<int>(hq);
  kp.num_kv_heads = static_cast<int>(hk);
  kp.head_dim = static_cast<int>(d);
  kp.rotary_dim = p.rotary_dim;
  kp.neox = p.neox;
  kp.eps = p.eps;
  check_cuda(cuda::launch_qkv_prologue(kp, qkv.dtype(), stream_), op);
}

}  // namespace specula
