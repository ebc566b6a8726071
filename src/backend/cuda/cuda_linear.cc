// CUDA backend: linear layers (the GEMM itself lives in cuda_gemm.cc, the FP8 small-M kernel in
// cuda_fp8_linear.cu).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_kernels.h"
#include "core/logging.h"

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

// Up to fp8_gemv_max_rows() rows (decode, verification) the weights are streamed once by the FP8
// GEMV kernel with the activations in bf16: on the H100 it reads the weights at 90-100% of copy
// bandwidth at 1 row, 60-75% at 4, but it runs on the CUDA cores and falls to ~20% at 16. Above,
// the activations are quantised per row too and cuBLASLt's FP8 tensor-core GEMM runs on the codes,
// its bf16/f32 output then scaled by both rows' scales (what vLLM computes on Hopper). Should
// cuBLASLt have no algorithm for a shape (its FP8 kernels want N a multiple of 16), the GEMV
// kernel runs over slices of rows instead.
void CudaBackend::linear_fp8(const Tensor& x, const Tensor& weight, const Tensor& scale, const Tensor* bias,
                             Tensor& out) {
  cuda_check::on_gpu(x, "linear_fp8", "x");
  cuda_check::dtype(weight, DType::kF8E4M3, "linear_fp8", "weight");
  cuda_check::dtype(scale, DType::kF32, "linear_fp8", "scale");
  cuda_check::on_gpu(out, "linear_fp8", "out");
  SPECULA_CHECK(x.dtype() == DType::kBF16, "linear_fp8: x {} must be BF16", x.describe());
  SPECULA_CHECK(out.dtype() == DType::kBF16 || out.dtype() == DType::kF32, "linear_fp8: out {} must be BF16 or F32",
                out.describe());
  SPECULA_CHECK(weight.ndim() == 2, "linear_fp8: weight must be [N, K], got {}", weight.describe());
  const int64_t n = weight.size(0), k = weight.size(1);
  SPECULA_CHECK(scale.ndim() == 1 && scale.size(0) == n, "linear_fp8: scale {} must be [{}]", scale.describe(), n);
  SPECULA_CHECK(k % 16 == 0, "linear_fp8: K = {} must be a multiple of 16 (weight {})", k, weight.describe());
  SPECULA_CHECK(x.ndim() >= 1 && x.size(-1) == k, "linear_fp8: x {} must end in K = {} (weight {})", x.describe(), k,
                weight.describe());
  int64_t m = 1;
  for (int i = 0; i + 1 < x.ndim(); ++i) m *= x.size(i);
  SPECULA_CHECK(out.numel() == m * n && (m == 0 || out.size(-1) == n), "linear_fp8: out {} must be [{}, {}]",
                out.describe(), m, n);
  if (bias != nullptr) {
    cuda_check::float_tensor(*bias, "linear_fp8", "bias");
    SPECULA_CHECK(bias->ndim() == 1 && bias->size(0) == n, "linear_fp8: bias {} must be [{}]", bias->describe(), n);
  }
  if (m == 0 || n == 0) return;
  const auto* w = weight.data_as<uint8_t>();
  const void* b = bias ? bias->data() : nullptr;
  const DType bias_dtype = bias ? bias->dtype() : DType::kF32;
  const size_t out_row_bytes = static_cast<size_t>(n) * dtype_size(out.dtype());
  SPECULA_CHECK(cuda::fp8_gemv_supports(1, k, x.data(), w), "linear_fp8: x and weight must be 16-byte aligned");
  const std::tuple<int64_t, int64_t, DType> shape{n, k, out.dtype()};
  if (m > fp8_gemv_max_rows_ && fp8_gemm_unsupported_.count(shape) == 0) {
    const size_t mark = scratch_mark();
    Tensor x8 = scratch({m, k}, DType::kF8E4M3);
    Tensor x_scale = scratch({m}, DType::kF32);
    check_cuda(cuda::launch_quantize_fp8_rows(x.data(), x.dtype(), m, k, x8.data_as<uint8_t>(),
                                              x_scale.data_as<float>(), stream_),
               "linear_fp8: quantise x");
    try {
      gemm_->matmul_fp8(x8.data(), w, out.data(), out.dtype(), m, n, k, "linear_fp8");
      check_cuda(cuda::launch_fp8_scale_output(out.data(), out.dtype(), x_scale.data_as<float>(),
                                               scale.data_as<float>(), b, bias_dtype, m, n, stream_),
                 "linear_fp8: scales");
      scratch_release(mark);
      return;
    } catch (const Error& e) {
      LOG_WARN("FP8 GEMM unavailable ({}); this shape runs the GEMV kernel per {} rows", e.what(),
               cuda::kFp8GemvMaxRows);
      fp8_gemm_unsupported_.insert(shape);
      scratch_release(mark);
    }
  }
  const auto* xb = static_cast<const uint8_t*>(x.data());
  auto* ob = static_cast<uint8_t*>(out.data());
  for (int64_t r = 0; r < m; r += cuda::kFp8GemvMaxRows) {
    const int64_t rows = std::min<int64_t>(cuda::kFp8GemvMaxRows, m - r);
    check_cuda(cuda::launch_fp8_gemv(xb + r * k * 2, w, scale.data_as<float>(), b, bias_dtype,
                                     ob + r * out_row_bytes, out.dtype(), rows, n, k, stream_),
               "linear_fp8");
  }
}

void CudaBackend::quantize_fp8_rows(const Tensor& x, Tensor& out, Tensor& scale) {
  cuda_check::float_tensor(x, "quantize_fp8_rows", "x");
  cuda_check::dtype(out, DType::kF8E4M3, "quantize_fp8_rows", "out");
  cuda_check::dtype(scale, DType::kF32, "quantize_fp8_rows", "scale");
  SPECULA_CHECK(x.ndim() == 2 && out.shape() == x.shape() && scale.ndim() == 1 && scale.size(0) == x.size(0),
                "quantize_fp8_rows: x {} must be [R, K], out {} [R, K] and scale {} [R]", x.describe(),
                out.describe(), scale.describe());
  check_cuda(cuda::launch_quantize_fp8_rows(x.data(), x.dtype(), x.size(0), x.size(1), out.data_as<uint8_t>(),
                                            scale.data_as<float>(), stream_),
             "quantize_fp8_rows");
}

void CudaBackend::set_fp8_gemv_max_rows(int64_t rows) {
  SPECULA_CHECK(rows >= 0 && rows <= cuda::kFp8GemvMaxRows, "fp8_gemv_max_rows {} must be in [0, {}]", rows,
                cuda::kFp8GemvMaxRows);
  fp8_gemv_max_rows_ = rows;
}

}  // namespace specula
