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
  const float* xp = x.data_as<float>();
  const float* wp = weight.data_as<float>();
  // out[:, n0:n1] = x @ W[n0:n1, :]^T, written in place with leading dimension n.
  auto gemm_columns = [&](int64_t n0, int64_t n1) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m), static_cast<blasint>(n1 - n0),
                static_cast<blasint>(k), 1.0f, xp, static_cast<blasint>(k), wp + n0 * k, static_cast<blasint>(k), beta,
                o + n0, static_cast<blasint>(n));
  };
  // Slices of at least 64 columns (whole cache lines of out, enough work per call), and only when
  // the GEMM is big enough to pay for the fork.
  constexpr int64_t kMinColumns = 64, kMinParallelMacs = 1 << 18;
  const int64_t parts = std::min<int64_t>(threads_, n / kMinColumns);
  if (parts <= 1 || m * n * k < kMinParallelMacs) {
    gemm_columns(0, n);
    return;
  }
#pragma omp parallel for num_threads(static_cast<int>(parts)) schedule(static)
  for (int64_t p = 0; p < parts; ++p) {
    // Boundaries on multiples of 16 columns so that each slice starts on a cache line of out.
    const int64_t n0 = p == 0 ? 0 : (n * p / parts) / 16 * 16;
    const int64_t n1 = p == parts - 1 ? n : (n * (p + 1) / parts) / 16 * 16;
    gemm_columns(n0, n1);
  }
}

}  // namespace specula
