// CUDA backend: linear layers. Up to gemv_max_rows(weight dtype) rows (decode) the GEMV kernel
// (cuda_gemv.cu) streams the weights once, with the norm before and the residual add or SwiGLU
// after a projection folded in (fused_linear); small bf16 weights up to gemv_mma_max_rows() rows
// (verification, small batches), and what the GEMV does not fold at its rows, take the same
// kernel's tensor-core form (cuda_gemv_mma.cu, gemv_mma_takes); more rows go to cuBLASLt's
// tensor-core GEMMs (cuda_gemm.cc), the norm and SwiGLU then separate ops and the residual add
// the GEMM's beta. FP8 weights above the GEMV: the activations are quantised per row (in the
// norm's kernel where there is one) and cuBLASLt's FP8 GEMM runs on the codes, its output then
// scaled by both rows' scales (with SwiGLU in the same kernel where there is one): what vLLM
// computes on Hopper, cuBLASLt's per-row "outer vector" scaling having no Hopper kernel.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_deepseek_kernels.h"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_kernels.h"
#include "core/logging.h"

namespace specula {
namespace {

struct LinearShape {
  int64_t m, n, k;
};

// Shared argument checks: x [.., K] (every dim but the last is a row), weight [N, K], bias [N],
// out [M, N].
LinearShape check_linear(const char* op, const Tensor& x, int64_t k_of_x, const Tensor& weight, const Tensor* bias,
                         const Tensor& out) {
  cuda_check::on_gpu(x, op, "x");
  cuda_check::on_gpu(weight, op, "weight");
  cuda_check::on_gpu(out, op, "out");
  SPECULA_CHECK(weight.ndim() == 2, "{}: weight must be [N, K], got {}", op, weight.describe());
  const int64_t n = weight.size(0), k = weight.size(1);
  SPECULA_CHECK(x.ndim() >= 1 && k_of_x == k, "{}: x {} must end in K = {} (weight {})", op, x.describe(), k,
                weight.describe());
  int64_t m = 1;
  for (int i = 0; i + 1 < x.ndim(); ++i) m *= x.size(i);
  SPECULA_CHECK(out.numel() == m * n && (m == 0 || out.size(-1) == n), "{}: out {} must be [{}, {}]", op,
                out.describe(), m, n);
  if (bias != nullptr) {
    cuda_check::float_tensor(*bias, op, "bias");
    SPECULA_CHECK(bias->ndim() == 1 && bias->size(0) == n, "{}: bias {} must be [{}]", op, bias->describe(), n);
  }
  return {m, n, k};
}

cuda::GemvArgs gemv_args(const Tensor& x, const LinearWeight& w, const Tensor* bias, Tensor& out, LinearShape s) {
  cuda::GemvArgs a;
  a.x = x.data();
  a.w = w.weight.data();
  a.w_dtype = w.weight.dtype();
  a.scale = w.fp8() ? w.scale.data_as<float>() : nullptr;
  a.bias = bias ? bias->data() : nullptr;
  a.bias_dtype = bias ? bias->dtype() : DType::kF32;
  a.out = out.data();
  a.out_dtype = out.dtype();
  a.m = s.m;
  a.n = s.n;
  a.k = s.k;
  return a;
}

}  // namespace

int64_t CudaBackend::gemv_max_rows(DType weight) const {
  return weight == DType::kF8E4M3 ? fp8_gemv_max_rows_ : bf16_gemv_max_rows_;
}

void CudaBackend::set_gemv_max_rows(DType weight, int64_t rows) {
  SPECULA_CHECK(rows >= 0 && rows <= cuda::kGemvMaxRows, "gemv_max_rows {} must be in [0, {}]", rows,
                cuda::kGemvMaxRows);
  SPECULA_CHECK(weight == DType::kBF16 || weight == DType::kF8E4M3, "gemv_max_rows: no GEMV for {} weights",
                dtype_name(weight));
  (weight == DType::kF8E4M3 ? fp8_gemv_max_rows_ : bf16_gemv_max_rows_) = rows;
}

int64_t CudaBackend::default_gemv_mma_max_rows() {
  const char* v = std::getenv("SPECULA_GEMV_MMA");
  return v && std::strcmp(v, "0") == 0 ? 0 : cuda::kGemvMmaMaxRows;
}

int64_t CudaBackend::default_gemv_mma_max_weight_bytes() { return cuda::kGemvMmaMaxWeightBytes; }

void CudaBackend::set_gemv_mma_limits(int64_t max_rows, int64_t max_weight_bytes) {
  SPECULA_CHECK(max_rows >= 0 && max_rows <= cuda::kGemvMmaMaxRows && max_weight_bytes >= 0,
                "gemv_mma limits: {} rows must be in [0, {}], {} bytes not negative", max_rows, cuda::kGemvMmaMaxRows,
                max_weight_bytes);
  gemv_mma_max_rows_ = max_rows;
  gemv_mma_max_weight_bytes_ = max_weight_bytes;
}

bool CudaBackend::gemv_mma_takes(int64_t m, int64_t weight_bytes, bool unfolded) const {
  if (m > gemv_mma_max_rows_) return false;
  return weight_bytes <= gemv_mma_max_weight_bytes_ || (m <= bf16_gemv_max_rows_ && unfolded);
}

int64_t CudaBackend::default_gemv_mma_min_rows() {
  const char* v = std::getenv("SPECULA_GEMV_MMA_MIN_ROWS");
  return v ? std::max(1, std::atoi(v)) : cuda::kGemvMmaMinRows;
}

bool CudaBackend::gemv_mma_first(int64_t m, int64_t weight_bytes) const {
  return m >= gemv_mma_min_rows_ && m <= gemv_mma_max_rows_ && weight_bytes <= gemv_mma_max_weight_bytes_;
}

int64_t CudaBackend::matmul_rows_class(int64_t rows) const { return CublasLtGemm::m_bucket(rows); }

void CudaBackend::linear(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out) {
  const LinearShape s = check_linear("linear", x, x.ndim() >= 1 ? x.size(-1) : -1, weight, bias, out);
  if (weight.dtype() == DType::kF32 && x.dtype() != DType::kF32) {  // a router's fp32 weights
    SPECULA_CHECK(x.dtype() == DType::kBF16 && out.dtype() == DType::kF32,
                  "linear: F32 weights {} take BF16 rows into an F32 out, got x {} and out {}", weight.describe(),
                  x.describe(), out.describe());
    if (s.m == 0 || s.n == 0) return;
    if (bias == nullptr && cuda::router_gemv_supports(x.data(), weight.data(), s.m, s.n, s.k)) {
      check_cuda(cuda::launch_router_gemv(x.data(), weight.data_as<float>(), out.data_as<float>(), s.m, s.n, s.k,
                                          stream_),
                 "linear");
      return;
    }
    const size_t mark = scratch_mark();
    Tensor x32 = scratch({s.m, s.k}, DType::kF32);
    cast(x.reshape({s.m, s.k}), x32);
    linear(x32, weight, bias, out);
    scratch_release(mark);
    return;
  }
  cuda_check::same_dtype(x, weight, "linear", "x", "weight");
  SPECULA_CHECK(x.dtype() == DType::kBF16 || x.dtype() == DType::kF16 || x.dtype() == DType::kF32,
                "linear: x {} must be BF16, F16 or F32", x.describe());
  SPECULA_CHECK(out.dtype() == x.dtype() || out.dtype() == DType::kF32,
                "linear: out {} must have x's dtype ({}) or F32", out.describe(), dtype_name(x.dtype()));
  if (s.m == 0 || s.n == 0) return;
  const int64_t weight_bytes = s.n * s.k * static_cast<int64_t>(sizeof(uint16_t));
  if (x.dtype() == DType::kBF16 && gemv_mma_first(s.m, weight_bytes)) {
    const cuda::GemvArgs a = gemv_args(x, LinearWeight{weight, Tensor()}, bias, out, s);
    if (cuda::gemv_mma_supports(a)) {
      check_cuda(cuda::launch_gemv_mma(a, stream_), "linear");
      return;
    }
  }
  if (x.dtype() == DType::kBF16 && s.m <= bf16_gemv_max_rows_) {
    const cuda::GemvArgs a = gemv_args(x, LinearWeight{weight, Tensor()}, bias, out, s);
    if (cuda::gemv_supports(a)) {
      check_cuda(cuda::launch_gemv(a, stream_), "linear");
      return;
    }
  }
  if (x.dtype() == DType::kBF16 && gemv_mma_takes(s.m, weight_bytes, false)) {
    const cuda::GemvArgs a = gemv_args(x, LinearWeight{weight, Tensor()}, bias, out, s);
    if (cuda::gemv_mma_supports(a)) {
      check_cuda(cuda::launch_gemv_mma(a, stream_), "linear");
      return;
    }
  }
  gemm_->matmul(x.data(), weight.data(), x.dtype(), bias ? bias->data() : nullptr, bias ? bias->dtype() : out.dtype(),
                out.data(), out.dtype(), s.m, s.n, s.k, "linear");
}

void CudaBackend::linear_fp8(const Tensor& x, const Tensor& weight, const Tensor& scale, const Tensor* bias,
                             Tensor& out) {
  fp8_linear(x, weight, scale, bias, out, /*accumulate=*/false);
}

void CudaBackend::fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& scale, const Tensor* bias,
                             Tensor& out, bool accumulate) {
  const LinearShape s = check_linear("linear_fp8", x, x.ndim() >= 1 ? x.size(-1) : -1, weight, bias, out);
  cuda_check::dtype(weight, DType::kF8E4M3, "linear_fp8", "weight");
  cuda_check::dtype(scale, DType::kF32, "linear_fp8", "scale");
  SPECULA_CHECK(x.dtype() == DType::kBF16, "linear_fp8: x {} must be BF16", x.describe());
  SPECULA_CHECK(out.dtype() == DType::kBF16 || out.dtype() == DType::kF32, "linear_fp8: out {} must be BF16 or F32",
                out.describe());
  SPECULA_CHECK(scale.ndim() == 1 && scale.size(0) == s.n, "linear_fp8: scale {} must be [{}]", scale.describe(), s.n);
  SPECULA_CHECK(s.k % 16 == 0, "linear_fp8: K = {} must be a multiple of 16 (weight {})", s.k, weight.describe());
  if (s.m == 0 || s.n == 0) return;
  cuda::GemvArgs a = gemv_args(x, LinearWeight{weight, scale}, bias, out, s);
  a.epilogue = accumulate ? cuda::GemvEpilogue::kAccumulate : cuda::GemvEpilogue::kStore;
  a.m = 1;
  SPECULA_CHECK(cuda::gemv_supports(a), "linear_fp8: x and weight must be 16-byte aligned");
  if (s.m > fp8_gemv_max_rows_ &&
      fp8_gemm_linear(x, LinearPrologue::none(), LinearWeight{weight, scale}, bias, out,
                      accumulate ? LinearEpilogue::kAccumulate : LinearEpilogue::kStore))
    return;
  const size_t out_row_bytes = static_cast<size_t>(s.n) * dtype_size(out.dtype());
  for (int64_t r = 0; r < s.m; r += cuda::kGemvMaxRows) {
    a.m = std::min<int64_t>(cuda::kGemvMaxRows, s.m - r);
    a.x = static_cast<const uint8_t*>(x.data()) + r * s.k * 2;
    a.out = static_cast<uint8_t*>(out.data()) + r * out_row_bytes;
    check_cuda(cuda::launch_gemv(a, stream_), "linear_fp8");
  }
}

bool CudaBackend::fp8_gemm_product(const Tensor& x, const LinearPrologue& prologue, const LinearWeight& weight,
                                   Tensor& product, Tensor& x_scale) {
  const int64_t k = x.size(-1), m = k > 0 ? x.numel() / k : 0, n = weight.weight.size(0);  // x may be [..., k]
  const std::tuple<int64_t, int64_t, DType> shape{n, k, product.dtype()};
  if (fp8_gemm_unsupported_.count(shape) != 0) return false;
  Tensor x8 = scratch({m, k}, DType::kF8E4M3);
  if (prologue.norm_weight != nullptr &&
      !cuda::rms_norm_quantize_fp8_supports(x.data(), prologue.norm_weight->data(), k, x8.data_as<uint8_t>()))
    return false;
  if (prologue.norm_weight != nullptr) {
    check_cuda(cuda::launch_rms_norm_quantize_fp8(x.data(), prologue.norm_weight->data(), m, k, prologue.eps,
                                                  x8.data_as<uint8_t>(), x_scale.data_as<float>(), stream_),
               "linear_fp8: norm and quantise x");
  } else {
    check_cuda(cuda::launch_quantize_fp8_rows(x.data(), x.dtype(), m, k, x8.data_as<uint8_t>(),
                                              x_scale.data_as<float>(), stream_),
               "linear_fp8: quantise x");
  }
  try {
    gemm_->matmul_fp8(x8.data(), weight.weight.data(), product.data(), product.dtype(), m, n, k, "linear_fp8");
  } catch (const Error& e) {
    LOG_WARN("FP8 GEMM unavailable ({}); this shape runs the GEMV kernel per {} rows", e.what(), cuda::kGemvMaxRows);
    fp8_gemm_unsupported_.insert(shape);
    return false;
  }
  return true;
}

bool CudaBackend::fp8_gemm_linear(const Tensor& x, const LinearPrologue& prologue, const LinearWeight& weight,
                                  const Tensor* bias, Tensor& out, LinearEpilogue epilogue) {
  const int64_t k = x.size(-1), m = k > 0 ? x.numel() / k : 0, n = weight.weight.size(0);
  const size_t mark = scratch_mark();
  Tensor x_scale = scratch({m}, DType::kF32);
  const bool gated = epilogue == LinearEpilogue::kSiluMul, accumulate = epilogue == LinearEpilogue::kAccumulate;
  // The unscaled product goes to a scratch matrix where out holds the residual or is SwiGLU's half.
  Tensor product = gated || accumulate ? scratch({m, n}, out.dtype()) : out;
  if (!fp8_gemm_product(x, prologue, weight, product, x_scale)) {
    scratch_release(mark);
    return false;
  }
  const void* bias_data = bias ? bias->data() : nullptr;
  const DType bias_dtype = bias ? bias->dtype() : DType::kF32;
  if (gated) {
    check_cuda(cuda::launch_fp8_scale_silu(product.data(), out.data(), out.dtype(), x_scale.data_as<float>(),
                                           weight.scale.data_as<float>(), bias_data, bias_dtype, m, n / 2, stream_),
               "linear_fp8: scales and SwiGLU");
  } else {
    check_cuda(cuda::launch_fp8_scale_output(product.data(), out.data(), out.dtype(), x_scale.data_as<float>(),
                                             weight.scale.data_as<float>(), bias_data, bias_dtype, accumulate, m, n,
                                             stream_),
               "linear_fp8: scales");
  }
  scratch_release(mark);
  return true;
}

void CudaBackend::fused_linear(const Tensor& x, const LinearPrologue& prologue, const LinearWeight& weight,
                               const Tensor* bias, Tensor& out, LinearEpilogue epilogue) {
  const bool gated = epilogue == LinearEpilogue::kSiluMul;
  SPECULA_CHECK(x.ndim() == 2 && out.ndim() == 2, "fused_linear: x {} and out {} must be matrices", x.describe(),
                out.describe());
  SPECULA_CHECK(x.dtype() == DType::kBF16, "fused_linear: x {} must be BF16", x.describe());
  SPECULA_CHECK(weight.weight.ndim() == 2 && (!gated || weight.weight.size(0) % 2 == 0),
                "fused_linear: weight {} must be [N, K]{}", weight.weight.describe(), gated ? " with N even" : "");
  const int64_t n = weight.weight.size(0), m = x.size(0), k = x.size(1);
  SPECULA_CHECK(out.size(0) == m && out.size(1) == (gated ? n / 2 : n), "fused_linear: out {} must be [{}, {}]",
                out.describe(), m, gated ? n / 2 : n);
  SPECULA_CHECK(prologue.norm_weight == nullptr ||
                    (prologue.norm_weight->dtype() == DType::kBF16 && prologue.norm_weight->numel() == k),
                "fused_linear: the RMSNorm weight must be BF16 [{}]", k);
  if (m == 0 || n == 0) return;
  const bool gemv_rows = m <= gemv_max_rows(weight.weight.dtype());
  // The tensor-core form: above the GEMV's rows for small weights, and at its rows for what it
  // does not fold in (a norm over more than 2 rows, SwiGLU over more than 4) whatever the size.
  const bool unfolded =
      (prologue.norm_weight && m > cuda::kGemvMaxNormRows) || (gated && m > cuda::kGemvMaxGatedRows);
  const bool mma_rows = !weight.fp8() && gemv_mma_takes(m, n * k * static_cast<int64_t>(sizeof(uint16_t)), unfolded);
  if (gemv_rows || mma_rows) {
    if (bias != nullptr) cuda_check::float_tensor(*bias, "fused_linear", "bias");
    SPECULA_CHECK(!bias || (bias->ndim() == 1 && bias->size(0) == n), "fused_linear: bias must be [{}]", n);
    SPECULA_CHECK(weight.weight.size(1) == k, "fused_linear: x {} must end in K = {} (weight {})", x.describe(),
                  weight.weight.size(1), weight.weight.describe());
    cuda::GemvArgs a = gemv_args(x, weight, bias, out, LinearShape{m, n, k});
    a.epilogue = gated ? cuda::GemvEpilogue::kSiluMul
                 : epilogue == LinearEpilogue::kAccumulate ? cuda::GemvEpilogue::kAccumulate
                                                           : cuda::GemvEpilogue::kStore;
    a.norm_weight = prologue.norm_weight ? prologue.norm_weight->data() : nullptr;
    a.eps = prologue.eps;
    if (mma_rows && gemv_mma_first(m, n * k * static_cast<int64_t>(sizeof(uint16_t))) && cuda::gemv_mma_supports(a)) {
      check_cuda(cuda::launch_gemv_mma(a, stream_), "fused_linear");
      return;
    }
    if (gemv_rows && cuda::gemv_supports(a)) {
      check_cuda(cuda::launch_gemv(a, stream_), "fused_linear");
      return;
    }
    if (mma_rows && cuda::gemv_mma_supports(a)) {
      check_cuda(cuda::launch_gemv_mma(a, stream_), "fused_linear");
      return;
    }
  }
  if (weight.fp8() && !gemv_rows && (prologue.norm_weight != nullptr || gated)) {
    if (bias != nullptr) cuda_check::float_tensor(*bias, "fused_linear", "bias");
    SPECULA_CHECK(!bias || (bias->ndim() == 1 && bias->size(0) == n), "fused_linear: bias must be [{}]", n);
    SPECULA_CHECK(weight.weight.size(1) == k && weight.scale.ndim() == 1 && weight.scale.size(0) == n,
                  "fused_linear: x {} must end in K = {} and the scale be [{}] (weight {})", x.describe(),
                  weight.weight.size(1), n, weight.weight.describe());
    if (fp8_gemm_linear(x, prologue, weight, bias, out, epilogue)) return;
  }
  const size_t mark = scratch_mark();
  if (prologue.norm_weight != nullptr) {  // the norm as its own op; the GEMV may still take the rest
    Tensor in = scratch({m, k}, x.dtype());
    rms_norm(x, *prologue.norm_weight, prologue.eps, in);
    fused_linear(in, LinearPrologue::none(), weight, bias, out, epilogue);
    scratch_release(mark);
    return;
  }
  // Separate ops: the GEMM, which adds into out itself when accumulating, then SwiGLU.
  if (gated) {
    Tensor y = scratch({m, n}, out.dtype());
    linear(x, weight, bias, y);
    silu_mul(y, out);
  } else if (epilogue == LinearEpilogue::kStore) {
    linear(x, weight, bias, out);
  } else if (weight.fp8()) {
    fp8_linear(x, weight.weight, weight.scale, bias, out, /*accumulate=*/true);
  } else {
    check_linear("fused_linear", x, k, weight.weight, bias, out);
    cuda_check::same_dtype(x, weight.weight, "fused_linear", "x", "weight");
    gemm_->matmul(x.data(), weight.weight.data(), x.dtype(), bias ? bias->data() : nullptr,
                  bias ? bias->dtype() : out.dtype(), out.data(), out.dtype(), m, n, k, "fused_linear",
                  /*accumulate=*/true);
  }
  scratch_release(mark);
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

}  // namespace specula
