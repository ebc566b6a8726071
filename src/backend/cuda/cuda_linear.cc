// CUDA backend: linear layers (the GEMM itself lives in cuda_gemm.cc).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_gemm.h"

namespace specula {

void CudaBackend::linear(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out) {
  cuda_check::on_gpu(x, "linear", "x");
  cuda_check::on_gpu(weight, "linear", "weight");
  cuda_check::on_gpu(out, "linear", "out");
  cuda_check::same_dtype(x, weight, "linear", "x", "weight");
  SPECULA_CHECK(x.dtype() == DType::kBF16 || x.dtype() == DType::kF16 || x.dtype() == DType::kF32,
                "linear: x {} must be BF16, F16 or F32", x.describe());
  SPECULA_CHECK(out.dtype() == x.dtype() || out.dtype() == DType::kF32,
                "linear: out {} must have x's dtype ({}) or F32", out.describe(), dtype_name(x.dtype()));
  SPECULA_CHECK(weight.ndim() == 2, "linear: weight must be [N, K], got {}", weight.describe());
  const int64_t n = weight.size(0), k = weight.size(1);
  SPECULA_CHECK(x.ndim() >= 1 && x.size(-1) == k, "linear: x {} must end in K = {} (weight {})", x.describe(), k,
                weight.describe());
  int64_t m = 1;  // rows: every dim of x but the last
  for (int i = 0; i + 1 < x.ndim(); ++i) m *= x.size(i);
  SPECULA_CHECK(out.numel() == m * n && (m == 0 || out.size(-1) == n), "linear: out {} must be [{}, {}]",
                out.describe(), m, n);
  if (bias != nullptr) {
    cuda_check::float_tensor(*bias, "linear", "bias");
    SPECULA_CHECK(bias->ndim() == 1 && bias->size(0) == n, "linear: bias {} must be [{}]", bias->describe(), n);
  }
  gemm_->matmul(x.data(), weight.data(), x.dtype(), bias ? bias->data() : nullptr,
                bias ? bias->dtype() : out.dtype(), out.data(), out.dtype(), m, n, k, "linear");
}

}  // namespace specula
