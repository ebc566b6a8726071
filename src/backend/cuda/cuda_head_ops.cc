// CUDA backend: the MLA ops. copy_columns is one strided 2-D copy: a kernel launched overlapped
// at forward sizes (cuda_copy_columns.cu), cudaMemcpy2DAsync on the copy engines beyond;
// head_linear is one cuBLASLt strided-batched GEMM with batch = head, reading and writing each
// head's columns in place through the leading dimensions (cuda_batched_gemm.h), or at up to 4
// tokens a GEMV launched overlapped (cuda_head_gemv.cu); mla_prologue is one kernel
// (cuda_mla_prologue.cu), or the separate ops for shapes it does not take.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_batched_gemm.h"
#include "backend/cuda/cuda_deepseek_kernels.h"
#include "backend/cuda/cuda_kernels.h"

namespace specula {

void CudaBackend::copy_columns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width) {
  cuda_check::on_gpu(src, "copy_columns", "src");
  cuda_check::on_gpu(dst, "copy_columns", "dst");
  cuda_check::same_dtype(src, dst, "copy_columns", "src", "dst");
  SPECULA_CHECK(src.ndim() >= 1 && dst.ndim() >= 1, "copy_columns: src {} / dst {} need a row width", src.describe(),
                dst.describe());
  const int64_t ws = src.size(-1), wd = dst.size(-1);
  const int64_t rows = ws == 0 ? 0 : src.numel() / ws;
  SPECULA_CHECK((wd == 0 ? 0 : dst.numel() / wd) == rows, "copy_columns: src {} and dst {} differ in rows",
                src.describe(), dst.describe());
  SPECULA_CHECK(width >= 0 && src_col >= 0 && dst_col >= 0 && src_col + width <= ws && dst_col + width <= wd,
                "copy_columns: columns [{}, {}) of src {} -> [{}, {}) of dst {} are out of range", src_col,
                src_col + width, src.describe(), dst_col, dst_col + width, dst.describe());
  if (rows == 0 || width == 0) return;
  const size_t elem = dtype_size(src.dtype());
  if (cuda::device_copy_as_kernel(rows * width * static_cast<int64_t>(elem))) {
    check_cuda(cuda::launch_copy_columns(static_cast<const char*>(src.data()) + src_col * elem, ws * elem,
                                         static_cast<char*>(dst.data()) + dst_col * elem, wd * elem, rows,
                                         width * elem, elem, stream_),
               "copy_columns");
    return;
  }
  check_cuda(cudaMemcpy2DAsync(static_cast<char*>(dst.data()) + dst_col * elem, static_cast<size_t>(wd) * elem,
                               static_cast<const char*>(src.data()) + src_col * elem, static_cast<size_t>(ws) * elem,
                               static_cast<size_t>(width) * elem, static_cast<size_t>(rows), cudaMemcpyDeviceToDevice,
                               stream_),
             "copy_columns");
}

void CudaBackend::head_linear(const Tensor& x, const Tensor& weight, Tensor& out) {
  cuda_check::float_tensor(x, "head_linear", "x");
  cuda_check::on_gpu(weight, "head_linear", "weight");
  cuda_check::on_gpu(out, "head_linear", "out");
  cuda_check::same_dtype(x, weight, "head_linear", "x", "weight");
  cuda_check::same_dtype(x, out, "head_linear", "x", "out");
  const HeadLinearShape shape = head_linear_shape(x, weight, out);
  const int64_t t = shape.tokens, heads = shape.heads, kx = shape.kx, no = shape.no, n = shape.n, k = shape.k;
  SPECULA_CHECK(heads <= 0x7fffffff, "head_linear: {} heads is more than a GEMM batch holds", heads);
  if (t == 0 || n == 0 || heads == 0) return;
  if (k == 0) {  // an empty sum
    SPECULA_CHECK(n == no, "head_linear: an empty sum into a window of out {} is not supported", out.describe());
    zero(out);
    return;
  }
  if (x.dtype() == DType::kBF16 && t <= cuda::kHeadGemvMaxRows && n <= 0x7fffffff && k <= 0x7fffffff &&
      kx <= 0x7fffffff && no <= 0x7fffffff) {
    cuda::HeadGemvParams hp;
    hp.x = x.data();
    hp.w = weight.data();
    hp.out = out.data();
    hp.tokens = static_cast<int>(t);
    hp.heads = static_cast<int>(heads);
    hp.n = static_cast<int>(n);
    hp.k = static_cast<int>(k);
    hp.kx = static_cast<int>(kx);
    hp.no = static_cast<int>(no);
    if (cuda::head_gemv_supports(hp)) {
      check_cuda(cuda::launch_head_gemv(hp, stream_), "head_linear");
      return;
    }
  }
  // Head h: x rows are [T, K] with leading dimension Hh Kx at offset h Kx; the weight is a plain
  // [N, K] matrix at offset h N K; out rows are [T, N] with leading dimension Hh No at offset h No.
  batched_gemm_->matmul({x.data(), heads * kx, kx}, {weight.data(), k, n * k}, out.data(), heads * no, no, x.dtype(), t,
                        n, k, static_cast<int>(heads), "head_linear");
}

void CudaBackend::mla_prologue(const Tensor& q, const Tensor& kv_a, const MlaPrologue& p, KVCacheLayer& cache,
                               const Tensor& slot_mapping, Tensor& q_mla) {
  const char* op = "mla_prologue";
  const MlaPrologueShape shape = mla_prologue_shape(q, kv_a, p, q_mla);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&q, &kv_a, &q_mla, p.kv_norm, &cache.k})
    cuda_check::on_gpu(*t, op, "an operand");
  const DType dt = q.dtype();
  const int64_t hq = p.num_heads, dn = p.nope_dim, dr = p.rope_dim;
  const int64_t t = shape.tokens, latent = shape.latent, entry = latent + dr;
  cuda_check::index_vector(slot_mapping, DType::kI64, op, "slot_mapping");
  cuda_check::index_vector(*p.positions, DType::kI32, op, "positions");
  cuda_check::dtype(*p.cos_sin, DType::kF32, op, "cos_sin");
  SPECULA_CHECK(p.positions->size(0) >= t && slot_mapping.size(0) >= t,
                "{}: positions {} / slot_mapping {} have fewer than the {} rows of q", op, p.positions->describe(),
                slot_mapping.describe(), t);
  SPECULA_CHECK(p.cos_sin->ndim() == 2 && p.cos_sin->size(1) == dr, "{}: cos_sin {} must be [max_positions, {}]", op,
                p.cos_sin->describe(), dr);
  const bool mla_cache = cache.k.ndim() == 4 && cache.k.size(2) * cache.k.size(3) == entry &&
                         (!cache.v.defined() || cache.v.numel() == 0);
  const bool same_types = kv_a.dtype() == dt && q_mla.dtype() == dt && p.kv_norm->dtype() == dt &&
                          cache.k.dtype() == dt && p.kv_norm->numel() == latent;
  cuda::MlaPrologueParams kp;
  kp.q = q.data();
  kp.kv_a = kv_a.data();
  kp.kv_norm = p.kv_norm->data();
  kp.positions = p.positions->data_as<int32_t>();
  kp.cos_sin = p.cos_sin->data_as<float>();
  kp.slots = slot_mapping.data_as<int64_t>();
  kp.q_mla = q_mla.data();
  kp.cache = cache.k.data();
  kp.tokens = t;
  kp.max_pos = p.cos_sin->size(0);
  kp.num_slots = cache.k.size(0) * cache.k.size(1);
  kp.heads = static_cast<int>(hq);
  kp.nope_dim = static_cast<int>(dn);
  kp.rope_dim = static_cast<int>(dr);
  kp.latent = static_cast<int>(latent);
  kp.neox = p.neox;
  kp.eps = p.eps;
  if (!mla_cache || !same_types || !cuda::mla_prologue_supported(kp, dt)) {
    Backend::mla_prologue(q, kv_a, p, cache, slot_mapping, q_mla);  // its checks name what does not fit
    return;
  }
  check_cuda(cuda::launch_mla_prologue(kp, dt, stream_), op);
}

}  // namespace specula
