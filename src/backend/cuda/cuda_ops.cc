// CUDA backend: argument checks and launches of the row-wise ops (the EAGLE-3 layer input among
// them), rope and KV-cache writes.
// Device-resident indices (token ids, positions, slots, gather indices) cannot be validated on
// the host without a synchronisation; the kernels treat out-of-range values as documented in
// cuda_kernels.h (zero rows, untouched rows, skipped slots) instead of reading out of bounds.
#include <cstdlib>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"

namespace specula {
namespace {
int64_t rows_of(const Tensor& t, int64_t h) { return h == 0 ? 0 : t.numel() / h; }
}  // namespace

void CudaBackend::embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  cuda_check::index_vector(ids, DType::kI32, "embedding", "ids");
  cuda_check::on_gpu(table, "embedding", "table");
  cuda_check::on_gpu(out, "embedding", "out");
  cuda_check::same_dtype(table, out, "embedding", "table", "out");
  SPECULA_CHECK(table.ndim() == 2, "embedding: table must be [V, H], got {}", table.describe());
  const int64_t t = ids.size(0), h = table.size(1);
  SPECULA_CHECK(out.numel() == t * h && (t == 0 || out.size(-1) == h), "embedding: out {} must be [{}, {}]",
                out.describe(), t, h);
  check_cuda(cuda::launch_gather_rows(table.data(), table.size(0), table.row_bytes(), ids.data_as<int32_t>(), t,
                                      out.data(), stream_),
             "embedding");
}

void CudaBackend::vocab_parallel_embedding(const Tensor& ids, const Tensor& table, int64_t first_id, Tensor& out) {
  cuda_check::index_vector(ids, DType::kI32, "vocab_parallel_embedding", "ids");
  cuda_check::on_gpu(table, "vocab_parallel_embedding", "table");
  cuda_check::on_gpu(out, "vocab_parallel_embedding", "out");
  cuda_check::same_dtype(table, out, "vocab_parallel_embedding", "table", "out");
  SPECULA_CHECK(table.ndim() == 2 && first_id >= 0, "vocab_parallel_embedding: table must be [V', H] from id >= 0, got {} "
                "from {}", table.describe(), first_id);
  const int64_t t = ids.size(0), h = table.size(1);
  SPECULA_CHECK(out.numel() == t * h && (t == 0 || out.size(-1) == h),
                "vocab_parallel_embedding: out {} must be [{}, {}]", out.describe(), t, h);
  check_cuda(cuda::launch_gather_rows(table.data(), table.size(0), table.row_bytes(), ids.data_as<int32_t>(), t,
                                      out.data(), stream_, first_id),
             "vocab_parallel_embedding");
}

void CudaBackend::gather_rows(const Tensor& x, const Tensor& indices, Tensor& out) {
  cuda_check::index_vector(indices, DType::kI32, "gather_rows", "indices");
  cuda_check::on_gpu(x, "gather_rows", "x");
  cuda_check::on_gpu(out, "gather_rows", "out");
  cuda_check::same_dtype(x, out, "gather_rows", "x", "out");
  SPECULA_CHECK(x.ndim() >= 1, "gather_rows: x {} has no rows", x.describe());
  const int64_t n = indices.size(0);
  const size_t row_bytes = x.row_bytes();
  SPECULA_CHECK(out.ndim() >= 1 && out.size(0) == n && (n == 0 || out.row_bytes() == row_bytes),
                "gather_rows: out {} must have {} rows shaped like those of x {}", out.describe(), n, x.describe());
  check_cuda(cuda::launch_gather_rows(x.data(), x.size(0), row_bytes, indices.data_as<int32_t>(), n, out.data(),
                                      stream_),
             "gather_rows");
}

void CudaBackend::argmax_rows(const Tensor& x, const Tensor* rows, Tensor& out) {
  cuda_check::on_gpu(x, "argmax_rows", "x");
  cuda_check::index_vector(out, DType::kI32, "argmax_rows", "out");
  SPECULA_CHECK(x.dtype() == DType::kF32 && x.ndim() == 2, "argmax_rows: x must be F32 [R, V], got {}", x.describe());
  const int64_t n = out.size(0);
  if (rows) {
    cuda_check::index_vector(*rows, DType::kI32, "argmax_rows", "rows");
    SPECULA_CHECK(rows->size(0) == n, "argmax_rows: rows {} and out {} differ in length", rows->describe(),
                  out.describe());
  } else {
    SPECULA_CHECK(n <= x.size(0), "argmax_rows: out {} is longer than x {} has rows", out.describe(), x.describe());
  }
  check_cuda(cuda::launch_argmax_rows(x.data_as<float>(), x.size(0), x.size(1), rows ? rows->data_as<int32_t>() : nullptr,
                                      n, out.data_as<int32_t>(), stream_),
             "argmax_rows");
}

void CudaBackend::gather_columns(const Tensor& x, const Tensor& columns, float fill, Tensor& out) {
  cuda_check::on_gpu(x, "gather_columns", "x");
  cuda_check::on_gpu(out, "gather_columns", "out");
  cuda_check::index_vector(columns, DType::kI32, "gather_columns", "columns");
  SPECULA_CHECK(x.dtype() == DType::kF32 && x.ndim() == 2 && out.dtype() == DType::kF32 && out.ndim() == 2 &&
                    out.size(0) == x.size(0) && out.size(1) == columns.size(0),
                "gather_columns: x {} and out {} must be F32 [R, C] and [R, N], columns {} I32 [N]", x.describe(),
                out.describe(), columns.describe());
  check_cuda(cuda::launch_gather_columns(x.data_as<float>(), x.size(0), x.size(1), columns.data_as<int32_t>(),
                                         out.size(1), fill, out.data_as<float>(), stream_),
             "gather_columns");
}

void CudaBackend::feed_tokens(Tensor& token_ids, const Tensor& source) {
  cuda_check::index_vector(token_ids, DType::kI32, "feed_tokens", "token_ids");
  cuda_check::index_vector(source, DType::kI32, "feed_tokens", "source");
  check_cuda(cuda::launch_feed_tokens(token_ids.data_as<int32_t>(), token_ids.numel(), source.data_as<int32_t>(),
                                      source.numel(), stream_),
             "feed_tokens");
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  cuda_check::float_tensor(x, "rms_norm", "x");
  cuda_check::on_gpu(weight, "rms_norm", "weight");
  cuda_check::on_gpu(out, "rms_norm", "out");
  cuda_check::same_dtype(x, weight, "rms_norm", "x", "weight");
  cuda_check::same_dtype(x, out, "rms_norm", "x", "out");
  SPECULA_CHECK(weight.ndim() == 1 && x.ndim() >= 1 && x.size(-1) == weight.size(0),
                "rms_norm: weight {} must be [H] with H the last dim of x {}", weight.describe(), x.describe());
  SPECULA_CHECK(out.numel() == x.numel(), "rms_norm: out {} must match x {}", out.describe(), x.describe());
  const int64_t h = weight.size(0);
  check_cuda(cuda::launch_rms_norm(x.data(), weight.data(), out.data(), rows_of(x, h), h, eps, x.dtype(), stream_),
             "rms_norm");
}

void CudaBackend::add_rms_norm(Tensor& x, Tensor& residual, const Tensor& weight, float eps) {
  cuda_check::float_tensor(x, "add_rms_norm", "x");
  cuda_check::on_gpu(residual, "add_rms_norm", "residual");
  cuda_check::on_gpu(weight, "add_rms_norm", "weight");
  cuda_check::same_dtype(x, residual, "add_rms_norm", "x", "residual");
  cuda_check::same_dtype(x, weight, "add_rms_norm", "x", "weight");
  cuda_check::same_shape(x, residual, "add_rms_norm", "x", "residual");
  SPECULA_CHECK(weight.ndim() == 1 && x.ndim() >= 1 && x.size(-1) == weight.size(0),
                "add_rms_norm: weight {} must be [H] with H the last dim of x {}", weight.describe(), x.describe());
  const int64_t h = weight.size(0);
  check_cuda(cuda::launch_add_rms_norm(x.data(), residual.data(), weight.data(), rows_of(x, h), h, eps, x.dtype(),
                                       stream_),
             "add_rms_norm");
}

// One kernel where its shapes allow (bf16, a row of at most 4096), else the ops one by one.
// SPECULA_FUSED_EAGLE3_INPUT=0 always runs the ops (A/B runs).
void CudaBackend::eagle3_layer_input(const Tensor& token_ids, const Tensor& g, const Eagle3LayerInput& p, Tensor& x,
                                     Tensor& residual) {
  static const bool enabled = [] {
    const char* v = std::getenv("SPECULA_FUSED_EAGLE3_INPUT");
    return !(v && v[0] == '0');
  }();
  const bool shapes = p.embed_tokens && p.input_norm && p.hidden_norm && g.defined() && g.ndim() == 2 &&
                      g.dtype() == DType::kBF16 && p.embed_tokens->ndim() == 2 && p.embed_tokens->size(1) == g.size(1) &&
                      p.embed_tokens->dtype() == DType::kBF16 && p.input_norm->dtype() == DType::kBF16 &&
                      p.hidden_norm->dtype() == DType::kBF16 && p.input_norm->numel() == g.size(1) &&
                      p.hidden_norm->numel() == g.size(1) && x.defined() && x.dtype() == DType::kBF16 &&
                      x.ndim() == 2 && x.size(0) == g.size(0) && x.size(1) == 2 * g.size(1) && residual.defined() &&
                      residual.dtype() == DType::kBF16 && residual.numel() == g.numel();
  if (!enabled || !shapes ||
      !cuda::eagle3_layer_input_supports(p.embed_tokens->data(), g.data(), p.input_norm->data(), p.hidden_norm->data(),
                                         x.data(), residual.data(), g.size(1))) {
    Backend::eagle3_layer_input(token_ids, g, p, x, residual);
    return;
  }
  const char* op = "eagle3_layer_input";
  cuda_check::on_gpu(g, op, "g");
  cuda_check::on_gpu(*p.embed_tokens, op, "embed_tokens");
  cuda_check::on_gpu(*p.input_norm, op, "input_norm");
  cuda_check::on_gpu(*p.hidden_norm, op, "hidden_norm");
  cuda_check::on_gpu(x, op, "x");
  cuda_check::on_gpu(residual, op, "residual");
  cuda_check::index_vector(token_ids, DType::kI32, op, "token_ids");
  SPECULA_CHECK(token_ids.size(0) == g.size(0), "{}: {} token ids for {} rows of g", op, token_ids.size(0),
                g.size(0));
  check_cuda(cuda::launch_eagle3_layer_input(token_ids.data_as<int32_t>(), p.embed_tokens->data(),
                                             p.embed_tokens->size(0), g.data(), p.input_norm->data(),
                                             p.hidden_norm->data(), g.size(0), g.size(1), p.eps,
                                             p.norm_before_residual, x.data(), residual.data(), stream_),
             op);
}

void CudaBackend::silu_mul(const Tensor& gate_up, Tensor& out) {
  cuda_check::float_tensor(gate_up, "silu_mul", "gate_up");
  cuda_check::on_gpu(out, "silu_mul", "out");
  cuda_check::same_dtype(gate_up, out, "silu_mul", "gate_up", "out");
  SPECULA_CHECK(gate_up.ndim() >= 1 && gate_up.size(-1) % 2 == 0, "silu_mul: gate_up {} must be [T, 2I]",
                gate_up.describe());
  const int64_t inter = gate_up.size(-1) / 2, rows = rows_of(gate_up, 2 * inter);
  SPECULA_CHECK(out.numel() == rows * inter && (rows == 0 || out.size(-1) == inter),
                "silu_mul: out {} must be [{}, {}]", out.describe(), rows, inter);
  check_cuda(cuda::launch_silu_mul(gate_up.data(), out.data(), rows, inter, out.dtype(), stream_), "silu_mul");
}

void CudaBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  cuda_check::float_tensor(a, "add", "a");
  cuda_check::on_gpu(b, "add", "b");
  cuda_check::on_gpu(out, "add", "out");
  cuda_check::same_dtype(a, b, "add", "a", "b");
  cuda_check::same_dtype(a, out, "add", "a", "out");
  cuda_check::same_shape(a, b, "add", "a", "b");
  SPECULA_CHECK(out.numel() == a.numel(), "add: out {} must match a {}", out.describe(), a.describe());
  check_cuda(cuda::launch_add(a.data(), b.data(), out.data(), a.numel(), a.dtype(), stream_), "add");
}

void CudaBackend::rope(Tensor& q, Tensor& k, const Tensor& positions, const Tensor& cos_sin, int rotary_dim,
                       bool neox) {
  cuda_check::float_tensor(q, "rope", "q");
  cuda_check::on_gpu(k, "rope", "k");
  cuda_check::same_dtype(q, k, "rope", "q", "k");
  cuda_check::dtype(cos_sin, DType::kF32, "rope", "cos_sin");
  cuda_check::index_vector(positions, DType::kI32, "rope", "positions");
  SPECULA_CHECK(q.ndim() == 3 && k.ndim() == 3 && q.size(0) == k.size(0) && q.size(2) == k.size(2),
                "rope: q {} and k {} must be [T, Hq, D] and [T, Hk, D]", q.describe(), k.describe());
  const int64_t t = q.size(0), d = q.size(2);
  SPECULA_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= d,
                "rope: rotary_dim {} must be even and in (0, head_dim = {}]", rotary_dim, d);
  SPECULA_CHECK(cos_sin.ndim() == 2 && cos_sin.size(1) == rotary_dim,
                "rope: cos_sin {} must be [max_positions, rotary_dim = {}]", cos_sin.describe(), rotary_dim);
  SPECULA_CHECK(positions.size(0) >= t, "rope: positions {} has fewer than the {} rows of q", positions.describe(),
                t);
  check_cuda(cuda::launch_rope(q.data(), k.data(), positions.data_as<int32_t>(), cos_sin.data_as<float>(),
                               cos_sin.size(0), t, static_cast<int>(q.size(1)), static_cast<int>(k.size(1)),
                               static_cast<int>(d), rotary_dim, neox, q.dtype(), stream_),
             "rope");
}

void CudaBackend::write_kv_cache(const Tensor& k, const Tensor& v, KVCacheLayer& cache, const Tensor& slot_mapping) {
  // MLA form (cache.v undefined or empty): only K is written; v is ignored and may be undefined.
  const bool mla = !cache.v.defined() || cache.v.numel() == 0;
  // An fp8 cache takes rows of the compute type and stores x / scale (KVCacheLayer).
  const bool fp8 = cache.k.dtype() == DType::kF8E4M3;
  cuda_check::on_gpu(k, "write_kv_cache", "k");
  cuda_check::on_gpu(cache.k, "write_kv_cache", "cache.k");
  if (fp8) {
    cuda_check::float_tensor(k, "write_kv_cache", "k");
  } else {
    cuda_check::same_dtype(k, cache.k, "write_kv_cache", "k", "cache.k");
  }
  cuda_check::index_vector(slot_mapping, DType::kI64, "write_kv_cache", "slot_mapping");
  SPECULA_CHECK(cache.k.ndim() == 4, "write_kv_cache: cache.k {} must be [num_blocks, block_size, Hk, D]",
                cache.k.describe());
  if (!mla) {
    cuda_check::on_gpu(v, "write_kv_cache", "v");
    cuda_check::on_gpu(cache.v, "write_kv_cache", "cache.v");
    cuda_check::same_dtype(cache.k, cache.v, "write_kv_cache", "cache.k", "cache.v");
    cuda_check::same_dtype(k, v, "write_kv_cache", "k", "v");
    SPECULA_CHECK(cache.v.ndim() == 4 && cache.k.size(0) == cache.v.size(0) && cache.k.size(1) == cache.v.size(1) &&
                      cache.k.size(2) == cache.v.size(2),
                  "write_kv_cache: cache.k {} and cache.v {} must be [num_blocks, block_size, Hk, D]",
                  cache.k.describe(), cache.v.describe());
    SPECULA_CHECK(k.ndim() >= 1 && v.ndim() >= 1 && k.size(0) == v.size(0),
                  "write_kv_cache: k {} and v {} differ in rows", k.describe(), v.describe());
  }
  SPECULA_CHECK(k.ndim() >= 1, "write_kv_cache: k {} has no rows", k.describe());
  const int64_t t = k.size(0);
  const int64_t k_row = cache.k.size(2) * cache.k.size(3), v_row = mla ? 0 : cache.v.size(2) * cache.v.size(3);
  SPECULA_CHECK(k.numel() == t * k_row && (mla || v.numel() == t * v_row),
                "write_kv_cache: k {} / v {} rows must match the cache's [Hk, D] ({} / {})", k.describe(),
                v.describe(), cache.k.describe(), cache.v.describe());
  SPECULA_CHECK(slot_mapping.size(0) >= t, "write_kv_cache: slot_mapping {} has fewer than {} rows",
                slot_mapping.describe(), t);
  const int64_t num_slots = cache.k.size(0) * cache.k.size(1);
  if (fp8) {
    SPECULA_CHECK(cache.k_scale > 0.0f && cache.v_scale > 0.0f,
                  "write_kv_cache: the fp8 cache's scales must be positive (k {}, v {})", cache.k_scale,
                  cache.v_scale);
    check_cuda(cuda::launch_write_kv_cache_fp8(k.data(), mla ? nullptr : v.data(), k.dtype(), cache.k.data(),
                                               mla ? nullptr : cache.v.data(), slot_mapping.data_as<int64_t>(), t,
                                               k_row, v_row, num_slots, cache.k_scale, cache.v_scale, stream_),
               "write_kv_cache");
    return;
  }
  const size_t elem = dtype_size(k.dtype());
  check_cuda(cuda::launch_write_kv_cache(k.data(), mla ? nullptr : v.data(), cache.k.data(),
                                         mla ? nullptr : cache.v.data(), slot_mapping.data_as<int64_t>(), t,
                                         k_row * elem, mla ? 0 : v_row * dtype_size(v.dtype()), num_slots, stream_),
             "write_kv_cache");
}

}  // namespace specula
