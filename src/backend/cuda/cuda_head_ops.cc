// CUDA backend: the MLA head ops. copy_columns is one strided 2-D copy (cudaMemcpy2DAsync, which
// the copy engines run at full bandwidth and a graph can capture); head_linear is one cuBLASLt
// strided-batched GEMM with batch = head, reading and writing each head's columns in place through
// the leading dimensions (cuda_batched_gemm.h).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_batched_gemm.h"

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
  SPECULA_CHECK(x.ndim() == 3 && weight.ndim() == 3 && out.ndim() == 3,
                "head_linear: x {}, weight {} and out {} must be [T, Hh, K], [Hh, N, K] and [T, Hh, N]", x.describe(),
                weight.describe(), out.describe());
  const int64_t t = x.size(0), heads = x.size(1), k = x.size(2), n = weight.size(1);
  SPECULA_CHECK(weight.size(0) == heads && weight.size(2) == k && out.size(0) == t && out.size(1) == heads &&
                    out.size(2) == n,
                "head_linear: x {}, weight {} and out {} do not fit [T, Hh, K] x [Hh, N, K] -> [T, Hh, N]",
                x.describe(), weight.describe(), out.describe());
  SPECULA_CHECK(heads <= 0x7fffffff, "head_linear: {} heads is more than a GEMM batch holds", heads);
  if (t == 0 || n == 0 || heads == 0) return;
  if (k == 0) {  // an empty sum
    zero(out);
    return;
  }
  // Head h: x rows are [T, K] with leading dimension Hh K at offset h K; the weight is a plain
  // [N, K] matrix at offset h N K; out rows are [T, N] with leading dimension Hh N at offset h N.
  batched_gemm_->matmul({x.data(), heads * k, k}, {weight.data(), k, n * k}, out.data(), heads * n, n, x.dtype(), t, n,
                        k, static_cast<int>(heads), "head_linear");
}

}  // namespace specula
