// CPU backend: the row-wise ops (embedding, RMSNorm, residual add + RMSNorm, SiLU-and-multiply,
// add, gather). Each row is independent, so rows are split over threads.
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"

namespace specula {
namespace {

// Rows of a [..., H] tensor.
int64_t rows_of(const Tensor& t, int64_t h) { return h == 0 ? 0 : t.numel() / h; }

// Parallelise only when there is enough work to pay for waking the threads.
constexpr int64_t kMinParallelElements = 16384;

// RMSNorm of one row, as transformers computes it in fp32: the mean of squares (accumulated in
// double here, which only makes it closer to the exact value), then
// out = weight * (x * rsqrt(mean + eps)).
inline void rms_norm_row(const float* x, const float* w, float eps, int64_t h, float* out) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < h; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  const float mean = static_cast<float>(sum_sq / static_cast<double>(h));
  const float inv_rms = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < h; ++i) out[i] = w[i] * (x[i] * inv_rms);
}

}  // namespace

void CpuBackend::embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  cpu_check::index_vector(ids, DType::kI32, "embedding", "ids");
  cpu_check::f32(table, "embedding", "table");
  cpu_check::f32(out, "embedding", "out");
  SPECULA_CHECK(table.ndim() == 2, "embedding: table must be [V, H], got {}", table.describe());
  const int64_t t = ids.size(0), v = table.size(0), h = table.size(1);
  SPECULA_CHECK(out.numel() == t * h && out.size(-1) == h, "embedding: out {} must be [{}, {}]", out.describe(), t,
                h);
  const int32_t* id = ids.data_as<int32_t>();
  for (int64_t i = 0; i < t; ++i) {
    SPECULA_CHECK(id[i] >= 0 && id[i] < v, "embedding: token id {} at row {} is outside the vocabulary [0, {})",
                  id[i], i, v);
  }
  const float* tab = table.data_as<float>();
  float* o = out.data_as<float>();
#pragma omp parallel for num_threads(threads_) schedule(static) if (t * h > kMinParallelElements)
  for (int64_t i = 0; i < t; ++i) std::memcpy(o + i * h, tab + static_cast<int64_t>(id[i]) * h, h * sizeof(float));
}

void CpuBackend::vocab_parallel_embedding(const Tensor& ids, const Tensor& table, int64_t first_id, Tensor& out) {
  cpu_check::index_vector(ids, DType::kI32, "vocab_parallel_embedding", "ids");
  cpu_check::f32(table, "vocab_parallel_embedding", "table");
  cpu_check::f32(out, "vocab_parallel_embedding", "out");
  SPECULA_CHECK(table.ndim() == 2 && first_id >= 0, "vocab_parallel_embedding: table must be [V', H] from id >= 0, got {} "
                "from {}", table.describe(), first_id);
  const int64_t t = ids.size(0), v = table.size(0), h = table.size(1);
  SPECULA_CHECK(out.numel() == t * h && out.size(-1) == h, "vocab_parallel_embedding: out {} must be [{}, {}]",
                out.describe(), t, h);
  const int32_t* id = ids.data_as<int32_t>();
  for (int64_t i = 0; i < t; ++i)
    SPECULA_CHECK(id[i] >= 0, "vocab_parallel_embedding: token id {} at row {} is negative", id[i], i);
  const float* tab = table.data_as<float>();
  float* o = out.data_as<float>();
#pragma omp parallel for num_threads(threads_) schedule(static) if (t * h > kMinParallelElements)
  for (int64_t i = 0; i < t; ++i) {
    const int64_t row = id[i] - first_id;
    if (row >= 0 && row < v)
      std::memcpy(o + i * h, tab + row * h, h * sizeof(float));
    else
      std::memset(o + i * h, 0, h * sizeof(float));
  }
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  cpu_check::f32(x, "rms_norm", "x");
  cpu_check::f32(weight, "rms_norm", "weight");
  cpu_check::f32(out, "rms_norm", "out");
  SPECULA_CHECK(weight.ndim() == 1 && x.ndim() >= 1 && x.size(-1) == weight.size(0),
                "rms_norm: weight {} must be [H] with H the last dim of x {}", weight.describe(), x.describe());
  SPECULA_CHECK(out.numel() == x.numel(), "rms_norm: out {} must match x {}", out.describe(), x.describe());
  const int64_t h = weight.size(0), rows = rows_of(x, h);
  const float* xp = x.data_as<float>();
  const float* w = weight.data_as<float>();
  float* o = out.data_as<float>();
  // Each row is read fully before it is written, so out may alias x.
#pragma omp parallel for num_threads(threads_) schedule(static) if (rows * h > kMinParallelElements)
  for (int64_t r = 0; r < rows; ++r) rms_norm_row(xp + r * h, w, eps, h, o + r * h);
}

void CpuBackend::add_rms_norm(Tensor& x, Tensor& residual, const Tensor& weight, float eps) {
  cpu_check::f32(x, "add_rms_norm", "x");
  cpu_check::f32(residual, "add_rms_norm", "residual");
  cpu_check::f32(weight, "add_rms_norm", "weight");
  cpu_check::same_shape(x, residual, "add_rms_norm", "x", "residual");
  SPECULA_CHECK(weight.ndim() == 1 && x.ndim() >= 1 && x.size(-1) == weight.size(0),
                "add_rms_norm: weight {} must be [H] with H the last dim of x {}", weight.describe(), x.describe());
  const int64_t h = weight.size(0), rows = rows_of(x, h);
  float* xp = x.data_as<float>();
  float* res = residual.data_as<float>();
  const float* w = weight.data_as<float>();
#pragma omp parallel for num_threads(threads_) schedule(static) if (rows * h > kMinParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = xp + r * h;
    float* rr = res + r * h;
    for (int64_t i = 0; i < h; ++i) rr[i] += xr[i];  // residual stream: hidden = residual + block output
    rms_norm_row(rr, w, eps, h, xr);
  }
}

void CpuBackend::silu_mul(const Tensor& gate_up, Tensor& out) {
  cpu_check::f32(gate_up, "silu_mul", "gate_up");
  cpu_check::f32(out, "silu_mul", "out");
  SPECULA_CHECK(gate_up.ndim() >= 1 && gate_up.size(-1) % 2 == 0, "silu_mul: gate_up {} must be [T, 2I]",
                gate_up.describe());
  const int64_t inter = gate_up.size(-1) / 2, rows = rows_of(gate_up, 2 * inter);
  SPECULA_CHECK(out.numel() == rows * inter && out.size(-1) == inter, "silu_mul: out {} must be [{}, {}]",
                out.describe(), rows, inter);
  const float* gu = gate_up.data_as<float>();
  float* o = out.data_as<float>();
#pragma omp parallel for num_threads(threads_) schedule(static) if (rows * inter > kMinParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = gu + r * 2 * inter;
    const float* up = gate + inter;
    for (int64_t i = 0; i < inter; ++i) {
      const float g = gate[i];
      o[r * inter + i] = g / (1.0f + std::exp(-g)) * up[i];  // silu(g) = g * sigmoid(g)
    }
  }
}

void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  cpu_check::f32(a, "add", "a");
  cpu_check::f32(b, "add", "b");
  cpu_check::f32(out, "add", "out");
  cpu_check::same_shape(a, b, "add", "a", "b");
  SPECULA_CHECK(out.numel() == a.numel(), "add: out {} must match a {}", out.describe(), a.describe());
  const int64_t n = a.numel();
  const float* ap = a.data_as<float>();
  const float* bp = b.data_as<float>();
  float* o = out.data_as<float>();
#pragma omp parallel for num_threads(threads_) schedule(static) if (n > kMinParallelElements)
  for (int64_t i = 0; i < n; ++i) o[i] = ap[i] + bp[i];
}

void CpuBackend::gather_rows(const Tensor& x, const Tensor& indices, Tensor& out) {
  cpu_check::index_vector(indices, DType::kI32, "gather_rows", "indices");
  SPECULA_CHECK(x.is_cpu() && out.is_cpu() && x.dtype() == out.dtype() && x.ndim() >= 1,
                "gather_rows: x {} and out {} must be CPU tensors of one dtype", x.describe(), out.describe());
  const int64_t n = indices.size(0), rows = x.size(0);
  const size_t row_bytes = x.row_bytes();
  SPECULA_CHECK(out.ndim() >= 1 && out.size(0) == n && (n == 0 || out.row_bytes() == row_bytes),
                "gather_rows: out {} must have {} rows shaped like those of x {}", out.describe(), n, x.describe());
  const int32_t* idx = indices.data_as<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    SPECULA_CHECK(idx[i] >= 0 && idx[i] < rows, "gather_rows: index {} at position {} is outside x's {} rows",
                  idx[i], i, rows);
  }
  const char* src = static_cast<const char*>(x.data());
  char* dst = static_cast<char*>(out.data());
#pragma omp parallel for num_threads(threads_) schedule(static) \
    if (static_cast<size_t>(n) * row_bytes > 4 * kMinParallelElements)
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * row_bytes, src + idx[i] * row_bytes, row_bytes);
}

}  // namespace specula
