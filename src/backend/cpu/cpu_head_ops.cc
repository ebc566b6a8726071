// CPU backend: the two ops MLA needs beyond a dense model's: strided column copies (to cut a
// fused projection's output into its parts and to assemble the latent cache entry and query) and
// per-head linear maps (the absorbed kv_b_proj halves).
#include <cblas.h>

#include <cstring>

#include "backend/cpu/cpu_backend.h"

namespace specula {

void CpuBackend::copy_columns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width) {
  SPECULA_CHECK(src.defined() && dst.defined() && src.is_cpu() && dst.is_cpu(),
                "copy_columns: src {} and dst {} must be CPU tensors", src.describe(), dst.describe());
  SPECULA_CHECK(src.dtype() == dst.dtype(), "copy_columns: src {} and dst {} differ in dtype", src.describe(),
                dst.describe());
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
  const auto* s = static_cast<const char*>(src.data()) + src_col * elem;
  auto* d = static_cast<char*>(dst.data()) + dst_col * elem;
  const size_t bytes = static_cast<size_t>(width) * elem;
#pragma omp parallel for num_threads(threads_) schedule(static) if (rows * width > 65536)
  for (int64_t r = 0; r < rows; ++r) std::memcpy(d + r * wd * elem, s + r * ws * elem, bytes);
}

// One SGEMM per head, each reading its head's columns of x and writing its head's columns of out
// in place through the leading dimensions (no transposed copies). Heads are split over threads;
// each SGEMM runs single-threaded (OpenBLAS is single-threaded, see cpu_linear.cc).
void CpuBackend::head_linear(const Tensor& x, const Tensor& weight, Tensor& out) {
  cpu_check::f32(x, "head_linear", "x");
  cpu_check::f32(weight, "head_linear", "weight");
  cpu_check::f32(out, "head_linear", "out");
  const HeadLinearShape shape = head_linear_shape(x, weight, out);
  const int64_t t = shape.tokens, heads = shape.heads, kx = shape.kx, no = shape.no, n = shape.n, k = shape.k;
  if (t == 0 || n == 0) return;
  const float* xp = x.data_as<float>();
  const float* wp = weight.data_as<float>();
  float* op = out.data_as<float>();
  if (k == 0) {  // an empty sum: each head's window is zero
    for (int64_t r = 0; r < t * heads; ++r) std::memset(op + r * no, 0, static_cast<size_t>(n) * sizeof(float));
    return;
  }
#pragma omp parallel for num_threads(threads_) schedule(static) if (t * n * k * heads > (1 << 18))
  for (int64_t h = 0; h < heads; ++h) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(t), static_cast<blasint>(n),
                static_cast<blasint>(k), 1.0f, xp + h * kx, static_cast<blasint>(heads * kx), wp + h * n * k,
                static_cast<blasint>(k), 0.0f, op + h * no, static_cast<blasint>(heads * no));
  }
}

}  // namespace specula
