// What the two cuBLASLt wrappers (cuda_gemm: linear layers; cuda_batched_gemm: strided batches)
// share: status checks, the data-type mapping, the alignment an algorithm may assume, and the
// owned descriptors of a cached plan.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "core/dtype.h"
#include "core/error.h"

namespace specula::cuda_lt {

inline void check(cublasStatus_t status, const char* op, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw Error(fmt::format("{}: cuBLASLt {}: {} ({})", op, what, cublasLtGetStatusString(status),
                            cublasLtGetStatusName(status)));
  }
}

inline cudaDataType_t data_type(DType t, const char* op) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF8E4M3: return CUDA_R_8F_E4M3;
    default: throw Error(fmt::format("{}: dtype {} is not supported by the GEMM", op, dtype_name(t)));
  }
}

// Largest power of two (up to 256) dividing every byte offset OR-ed into `bits` (a base address,
// and the steps between rows or batch entries): the alignment cuBLASLt's heuristic may assume.
inline uint16_t alignment_of_bits(uint64_t bits) {
  uint16_t align = 256;
  while (align > 1 && (bits & (align - 1)) != 0) align >>= 1;
  return align;
}

// The descriptors of one cached GEMM shape and the algorithm chosen for it.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t w = nullptr, x = nullptr, out = nullptr;
  cublasLtMatmulAlgo_t algo{};
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (out) cublasLtMatrixLayoutDestroy(out);
    if (x) cublasLtMatrixLayoutDestroy(x);
    if (w) cublasLtMatrixLayoutDestroy(w);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace specula::cuda_lt
