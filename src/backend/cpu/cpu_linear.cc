// CPU backend: linear layers through OpenBLAS.
//
// HF stores a Linear weight as [out_features, in_features] row-major, so out = x W^T is one
// row-major SGEMM with the second operand transposed; no copy of the weight is ever made.
#include <cblas.h>

#include <cstring>

#include "backend/cpu/cpu_backend.h"

namespace specula {

void CpuBackend::linear(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out) {
  cpu_check::f32(x, "linear", "x");
  cpu_check::f32(weight, "linear", "weight");
  cpu_check::f32(out, "linear", "out");
  SPECULA_CHECK(weight.ndim() == 2, "linear: weight must be [N, K], got {}", weight.describe());
  const int64_t n = weight.size(0), k = weight.size(1);
  SPECULA_CHECK(x.ndim() >= 1 && x.size(-1) == k, "linear: x {} must end in K = {} (weight {})", x.describe(), k,
                weight.describe());
  const int64_t m = x.numel() / k;
  SPECULA_CHECK(out.numel() == m * n && out.size(-1) == n, "linear: out {} must be [{}, {}]", out.describe(), m, n);
  if (bias != nullptr) {
    cpu_check::f32(*bias, "linear", "bias");
    SPECULA_CHECK(bias->ndim() == 1 && bias->size(0) == n, "linear: bias {} must be [{}]", bias->describe(), n);
  }
  if (m == 0) return;
  float* o = out.data_as<float>();
  float beta = 0.0f;
  if (bias != nullptr) {
    // out starts as the bias broadcast over rows; the GEMM then accumulates onto it (beta = 1).
    const float* b = bias->data_as<float>();
    for (int64_t r = 0; r < m; ++r) std::memcpy(o + r * n, b, n * sizeof(float));
    beta = 1.0f;
  }
  if (k == 0) {
    if (bias == nullptr) std::memset(o, 0, out.nbytes());
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), 1.0f, x.data_as<float>(), static_cast<blasint>(k), weight.data_as<float>(),
              static_cast<blasint>(k), beta, o, static_cast<blasint>(n));
}

}  // namespace specula
