// CUDA backend: argument checks and launch of the fused Llama attention prologue
// (Backend::qkv_prologue; kernel in cuda_qkv_prologue.cu), and of the same prologue in the
// epilogue of its qkv projection (Backend::qkv_projection; kernel in cuda_qkv_projection.cu).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_engine_kernels.h"

namespace specula {
namespace {

// The prologue's checks and kernel parameters (all but qkv) for `t` qkv rows of `width` =
// (Hq + 2 Hk) D elements of `dtype` (the compute type).
cuda::QkvPrologueParams prologue_params(const char* op, int64_t t, int64_t width, DType dtype,
                                        const Backend::QkvPrologue& p, KVCacheLayer& cache,
                                        const Tensor& slot_mapping, Tensor& q_out) {
  cuda_check::on_gpu(q_out, op, "q_out");
  cuda_check::on_gpu(cache.k, op, "cache.k");
  cuda_check::on_gpu(cache.v, op, "cache.v");
  SPECULA_CHECK(q_out.dtype() == dtype, "{}: q_out {} must be {} like qkv", op, q_out.describe(), dtype_name(dtype));
  const bool fp8 = cache.k.dtype() == DType::kF8E4M3;  // else the cache is in the compute type
  SPECULA_CHECK(fp8 || cache.k.dtype() == dtype, "{}: cache.k {} must be {} like qkv, or F8_E4M3", op,
                cache.k.describe(), dtype_name(dtype));
  cuda_check::same_dtype(cache.k, cache.v, op, "cache.k", "cache.v");
  SPECULA_CHECK(!fp8 || (cache.k_scale > 0.0f && cache.v_scale > 0.0f),
                "{}: the fp8 cache's scales must be positive (k {}, v {})", op, cache.k_scale, cache.v_scale);
  cuda_check::index_vector(slot_mapping, DType::kI64, op, "slot_mapping");
  SPECULA_CHECK(p.positions != nullptr && p.cos_sin != nullptr, "{}: positions and cos_sin are required", op);
  cuda_check::index_vector(*p.positions, DType::kI32, op, "positions");
  cuda_check::dtype(*p.cos_sin, DType::kF32, op, "cos_sin");
  SPECULA_CHECK(p.num_q_heads > 0 && p.num_kv_heads > 0, "{}: head counts must be positive ({} q, {} kv)", op,
                p.num_q_heads, p.num_kv_heads);
  const int64_t hq = p.num_q_heads, hk = p.num_kv_heads, heads = hq + 2 * hk;
  SPECULA_CHECK(width % heads == 0, "{}: qkv rows of {} are not {} heads per token", op, width, heads);
  const int64_t d = width / heads;
  SPECULA_CHECK(d > 0 && d <= cuda::kMaxPrologueHeadDim, "{}: head dim {} must be in (0, {}] on CUDA", op, d,
                cuda::kMaxPrologueHeadDim);
  SPECULA_CHECK(q_out.numel() == t * hq * d, "{}: q_out {} must be [{}, {}, {}]", op, q_out.describe(), t, hq, d);
  SPECULA_CHECK(cache.k.ndim() == 4 && cache.v.ndim() == 4 && cache.k.size(2) == hk && cache.k.size(3) == d &&
                    cache.v.size(2) == hk && cache.v.size(3) == d && cache.k.size(0) == cache.v.size(0) &&
                    cache.k.size(1) == cache.v.size(1),
                "{}: cache.k {} / cache.v {} must be [num_blocks, block_size, {}, {}]", op, cache.k.describe(),
                cache.v.describe(), hk, d);
  SPECULA_CHECK(p.positions->size(0) >= t && slot_mapping.size(0) >= t,
                "{}: positions {} / slot_mapping {} have fewer than the {} rows of qkv", op, p.positions->describe(),
                slot_mapping.describe(), t);
  SPECULA_CHECK(p.rotary_dim >= 0 && p.rotary_dim % 2 == 0 && p.rotary_dim <= d,
                "{}: rotary_dim {} must be even and in [0, head_dim = {}]", op, p.rotary_dim, d);
  SPECULA_CHECK(p.cos_sin->ndim() == 2 && p.cos_sin->size(1) == p.rotary_dim,
                "{}: cos_sin {} must be [max_positions, rotary_dim = {}]", op, p.cos_sin->describe(), p.rotary_dim);
  for (const Tensor* norm : {p.q_norm, p.k_norm}) {
    if (norm == nullptr) continue;
    cuda_check::on_gpu(*norm, op, "q_norm / k_norm");
    SPECULA_CHECK(norm->dtype() == dtype && norm->ndim() == 1 && norm->size(0) == d,
                  "{}: norm weight {} must be {} [{}]", op, norm->describe(), dtype_name(dtype), d);
  }
  cuda::QkvPrologueParams kp;
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
  return kp;
}

}  // namespace

void CudaBackend::qkv_prologue(const Tensor& qkv, const QkvPrologue& p, KVCacheLayer& cache,
                               const Tensor& slot_mapping, Tensor& q_out) {
  const char* op = "qkv_prologue";
  cuda_check::float_tensor(qkv, op, "qkv");
  SPECULA_CHECK(qkv.ndim() == 2, "qkv_prologue: qkv {} must be [T, (Hq + 2 Hk) D]", qkv.describe());
  cuda::QkvPrologueParams kp =
      prologue_params(op, qkv.size(0), qkv.size(1), qkv.dtype(), p, cache, slot_mapping, q_out);
  kp.qkv = qkv.data();
  check_cuda(cuda::launch_qkv_prologue(kp, qkv.dtype(), stream_), op);
}

bool CudaBackend::fp8_qkv_projection(const Tensor& x, const LinearPrologue& input_norm, const LinearWeight& weight,
                                     const Tensor* bias, const QkvPrologue& params, KVCacheLayer& cache,
                                     const Tensor& slot_mapping, Tensor& q_out) {
  // Where fused_linear would take cuBLASLt's FP8 GEMM (cuda_linear.cc), with bf16 rows as the
  // two ops' scratch qkv would hold.
  if (!cuda::fused_qkv_projection_enabled() || !weight.fp8() || !x.defined() || x.ndim() != 2 || x.dtype() != DType::kBF16 ||
      x.size(0) <= gemv_max_rows(DType::kF8E4M3) || weight.weight.ndim() != 2 || weight.weight.size(1) != x.size(1))
    return false;
  const char* op = "qkv_projection";
  const int64_t m = x.size(0), n = weight.weight.size(0), k = x.size(1);
  cuda_check::on_gpu(x, op, "x");
  SPECULA_CHECK(input_norm.norm_weight == nullptr ||
                    (input_norm.norm_weight->dtype() == DType::kBF16 && input_norm.norm_weight->numel() == k),
                "{}: the RMSNorm weight must be BF16 [{}]", op, k);
  if (bias != nullptr) cuda_check::float_tensor(*bias, op, "bias");
  SPECULA_CHECK(!bias || (bias->ndim() == 1 && bias->size(0) == n), "{}: bias must be [{}]", op, n);
  SPECULA_CHECK(weight.scale.defined() && weight.scale.dtype() == DType::kF32 && weight.scale.numel() == n,
                "{}: the FP8 weight's scale must be F32 [{}]", op, n);
  cuda::QkvPrologueParams kp = prologue_params(op, m, n, DType::kBF16, params, cache, slot_mapping, q_out);
  const size_t mark = scratch_mark();
  Tensor x_scale = scratch({m}, DType::kF32), product = scratch({m, n}, DType::kBF16);
  if (!fp8_gemm_product(x, input_norm, weight, product, x_scale)) {
    scratch_release(mark);
    return false;
  }
  kp.qkv = product.data();
  kp.x_scale = x_scale.data_as<float>();
  kp.w_scale = weight.scale.data_as<float>();
  kp.bias = bias ? bias->data() : nullptr;
  kp.bias_f32 = bias && bias->dtype() == DType::kF32;
  check_cuda(cuda::launch_qkv_prologue(kp, DType::kBF16, stream_), op);
  scratch_release(mark);
  return true;
}

void CudaBackend::qkv_projection(const Tensor& x, const LinearPrologue& input_norm, const LinearWeight& weight,
                                 const Tensor* bias, const QkvPrologue& params, KVCacheLayer& cache,
                                 const Tensor& slot_mapping, Tensor& q_out) {
  // One bf16 decode row; anything else runs the two ops.
  const bool one_row = x.defined() && x.ndim() == 2 && x.size(0) == 1 && x.dtype() == DType::kBF16 &&
                       weight.weight.defined() && weight.weight.ndim() == 2 && weight.weight.size(1) == x.size(1) &&
                       (weight.weight.dtype() == DType::kBF16 || weight.fp8());
  if (!one_row) {
    if (!fp8_qkv_projection(x, input_norm, weight, bias, params, cache, slot_mapping, q_out))
      Backend::qkv_projection(x, input_norm, weight, bias, params, cache, slot_mapping, q_out);
    return;
  }
  const char* op = "qkv_projection";
  cuda_check::on_gpu(x, op, "x");
  cuda_check::on_gpu(weight.weight, op, "weight");
  const int64_t n = weight.weight.size(0), k = x.size(1);
  SPECULA_CHECK(input_norm.norm_weight == nullptr ||
                    (input_norm.norm_weight->dtype() == DType::kBF16 && input_norm.norm_weight->numel() == k),
                "{}: the RMSNorm weight must be BF16 [{}]", op, k);
  if (bias != nullptr) cuda_check::float_tensor(*bias, op, "bias");
  SPECULA_CHECK(!bias || (bias->ndim() == 1 && bias->size(0) == n), "{}: bias must be [{}]", op, n);
  SPECULA_CHECK(!weight.fp8() || (weight.scale.defined() && weight.scale.dtype() == DType::kF32 &&
                                  weight.scale.numel() == n),
                "{}: the FP8 weight's scale must be F32 [{}]", op, n);
  cuda::QkvProjectionParams kp;
  kp.prologue = prologue_params(op, 1, n, DType::kBF16, params, cache, slot_mapping, q_out);
  kp.x = x.data();
  kp.norm_weight = input_norm.norm_weight ? input_norm.norm_weight->data() : nullptr;
  kp.norm_eps = input_norm.eps;
  kp.w = weight.weight.data();
  kp.w_fp8 = weight.fp8();
  kp.w_scale = weight.fp8() ? weight.scale.data_as<float>() : nullptr;
  kp.bias = bias ? bias->data() : nullptr;
  kp.bias_dtype = bias ? bias->dtype() : DType::kF32;
  kp.k = k;
  if (!cuda::qkv_projection_supports(kp)) {
    Backend::qkv_projection(x, input_norm, weight, bias, params, cache, slot_mapping, q_out);
    return;
  }
  check_cuda(cuda::launch_qkv_projection(kp, stream_), op);
}

}  // namespace specula
