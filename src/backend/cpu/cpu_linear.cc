// CPU backend: linear layers through OpenBLAS.
//
// HF stores a Linear weight as [out_features, in_features] row-major, so out = x W^T is one
// row-major SGEMM with the second operand transposed; no copy of the weight is ever made.
//
// Threads: OpenBLAS runs single-threaded (see CpuBackend's constructor) and we split the output
// columns over our OpenMP threads instead, each thread one SGEMM on its own rows of W. One thread
// pool for the whole backend: two pools (OpenMP's and OpenBLAS's) that each busy-wait between
// ops fight over the cores when small ops alternate quickly, as in decode. Splitting N also
// suits decode, where M is tiny and the cost is streaming W: each thread streams its own slice.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace specula {

namespace {

// Runs gemm_columns(n0, n1) over slices of the N output columns, in parallel when the GEMM is big
// enough to pay for the fork. Slices have at least 64 columns (whole cache lines of out, enough
// work per call) and start on multiples of 16 columns (a cache line of out).
template <class GemmColumns>
void for_column_slices(int threads, int64_t m, int64_t n, int64_t k, const GemmColumns& gemm_columns) {
  constexpr int64_t kMinColumns = 64, kMinParallelMacs = 1 << 18;
  const int64_t parts = std::min<int64_t>(threads, n / kMinColumns);
  if (parts <= 1 || m * n * k < kMinParallelMacs) {
    gemm_columns(0, n);
    return;
  }
#pragma omp parallel for num_threads(static_cast<int>(parts)) schedule(static)
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t n0 = p == 0 ? 0 : (n * p / parts) / 16 * 16;
    const int64_t n1 = p == parts - 1 ? n : (n * (p + 1) / parts) / 16 * 16;
    gemm_columns(n0, n1);
  }
}

// Shapes shared by linear and linear_fp8; returns M.
int64_t check_linear_shapes(const Tensor& x, const Tensor& weight, const Tensor* bias, const Tensor& out,
                            const char* op) {
  cpu_check::f32(x, op, "x");
  cpu_check::f32(out, op, "out");
  SPECULA_CHECK(weight.ndim() == 2, "{}: weight must be [N, K], got {}", op, weight.describe());
  const int64_t n = weight.size(0), k = weight.size(1);
  SPECULA_CHECK(x.ndim() >= 1 && x.size(-1) == k, "{}: x {} must end in K = {} (weight {})", op, x.describe(), k,
                weight.describe());
  int64_t m = 1;  // rows: every dim of x but the last
  for (int i = 0; i + 1 < x.ndim(); ++i) m *= x.size(i);
  SPECULA_CHECK(out.numel() == m * n && out.size(-1) == n, "{}: out {} must be [{}, {}]", op, out.describe(), m, n);
  if (bias != nullptr) {
    cpu_check::f32(*bias, op, "bias");
    SPECULA_CHECK(bias->ndim() == 1 && bias->size(0) == n, "{}: bias {} must be [{}]", op, bias->describe(), n);
  }
  return m;
}

// out starts as the bias broadcast over rows (the GEMM then accumulates onto it: beta 1) or zero.
float init_with_bias(const Tensor* bias, int64_t m, int64_t n, float* o) {
  if (bias == nullptr) return 0.0f;
  const float* b = bias->data_as<float>();
  for (int64_t r = 0; r < m; ++r) std::memcpy(o + r * n, b, n * sizeof(float));
  return 1.0f;
}

}  // namespace

void CpuBackend::linear(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out) {
  cpu_check::f32(weight, "linear", "weight");
  const int64_t m = check_linear_shapes(x, weight, bias, out, "linear");
  const int64_t n = weight.size(0), k = weight.size(1);
  if (m == 0) return;
  float* o = out.data_as<float>();
  const float beta = init_with_bias(bias, m, n, o);
  if (k == 0) {
    if (bias == nullptr) std::memset(o, 0, out.nbytes());
    return;
  }
  const float* xp = x.data_as<float>();
  const float* wp = weight.data_as<float>();
  // out[:, n0:n1] = x @ W[n0:n1, :]^T, written in place with leading dimension n.
  for_column_slices(threads_, m, n, k, [&](int64_t n0, int64_t n1) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m), static_cast<blasint>(n1 - n0),
                static_cast<blasint>(k), 1.0f, xp, static_cast<blasint>(k), wp + n0 * k, static_cast<blasint>(k), beta,
                o + n0, static_cast<blasint>(n));
  });
}

// Each column slice widens its rows of W to fp32 (exactly: every e4m3 value is an fp32 value) a
// block of rows at a time and runs the same SGEMM on them; the scale multiplies the finished dot
// products, the order in which the GPU applies it.
void CpuBackend::linear_fp8(const Tensor& x, const Tensor& weight, const Tensor& scale, const Tensor* bias,
                            Tensor& out) {
  SPECULA_CHECK(weight.is_cpu() && weight.dtype() == DType::kF8E4M3, "linear_fp8: weight {} must be F8_E4M3 on cpu",
                weight.describe());
  const int64_t m = check_linear_shapes(x, weight, bias, out, "linear_fp8");
  const int64_t n = weight.size(0), k = weight.size(1);
  cpu_check::f32(scale, "linear_fp8", "scale");
  SPECULA_CHECK(scale.ndim() == 1 && scale.size(0) == n, "linear_fp8: scale {} must be [{}]", scale.describe(), n);
  if (m == 0) return;
  float* o = out.data_as<float>();
  if (k == 0) {
    std::memset(o, 0, out.nbytes());
    init_with_bias(bias, m, n, o);
    return;
  }
  const float* xp = x.data_as<float>();
  const uint8_t* wp = weight.data_as<uint8_t>();
  const float* sp = scale.data_as<float>();
  const float* bp = bias ? bias->data_as<float>() : nullptr;
  constexpr int64_t kRowBlock = 64;
  for_column_slices(threads_, m, n, k, [&](int64_t n0, int64_t n1) {
    std::vector<float> rows(static_cast<size_t>(std::min(kRowBlock, n1 - n0) * k));
    for (int64_t r0 = n0; r0 < n1; r0 += kRowBlock) {
      const int64_t r1 = std::min(n1, r0 + kRowBlock);
      convert_to_f32(wp + r0 * k, DType::kF8E4M3, rows.data(), static_cast<size_t>((r1 - r0) * k));
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m), static_cast<blasint>(r1 - r0),
                  static_cast<blasint>(k), 1.0f, xp, static_cast<blasint>(k), rows.data(), static_cast<blasint>(k),
                  0.0f, o + r0, static_cast<blasint>(n));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t c = r0; c < r1; ++c) o[i * n + c] = o[i * n + c] * sp[c] + (bp ? bp[c] : 0.0f);
    }
  });
}

void CpuBackend::quantize_fp8_rows(const Tensor& x, Tensor& out, Tensor& scale) {
  cpu_check::f32(x, "quantize_fp8_rows", "x");
  cpu_check::f32(scale, "quantize_fp8_rows", "scale");
  SPECULA_CHECK(x.ndim() == 2 && out.is_cpu() && out.dtype() == DType::kF8E4M3 && out.shape() == x.shape() &&
                    scale.ndim() == 1 && scale.size(0) == x.size(0),
                "quantize_fp8_rows: x {} must be [R, K], out {} F8_E4M3 [R, K] and scale {} [R]", x.describe(),
                out.describe(), scale.describe());
  const int64_t rows = x.size(0), k = x.size(1);
  const float* xp = x.data_as<float>();
  uint8_t* op = out.data_as<uint8_t>();
  float* sp = scale.data_as<float>();
#pragma omp parallel for num_threads(threads_) schedule(static) if (rows * k >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = xp + r * k;
    float amax = 0.0f;
    for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(row[c]));
    const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
    sp[r] = s;
    for (int64_t c = 0; c < k; ++c) op[r * k + c] = f32_to_f8e4m3(row[c] / s);
  }
}

}  // namespace specula
