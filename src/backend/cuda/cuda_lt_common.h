// What the two cuBLASLt wrappers (cuda_gemm: linear layers; cuda_batched_gemm: strided batches)
// share: status checks, the data-type mapping, the alignment an algorithm may assume, the owned
// descriptors of a cached plan, and plans keyed by an M bucket (cuda_gemm.h says why).
#pragma once

#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <unordered_set>

#include <fmt/format.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/logging.h"

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

// What every algorithm for a plan must satisfy: at most `workspace` bytes, and the alignments of
// the weight (A), the input (B) and the output (C and D). The caller destroys it.
inline cublasLtMatmulPreference_t preference(uint64_t workspace, uint32_t align_w, uint32_t align_x,
                                             uint32_t align_out, const char* op) {
  cublasLtMatmulPreference_t pref = nullptr;
  check(cublasLtMatmulPreferenceCreate(&pref), op, "preference");
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_w, sizeof(align_w));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_x, sizeof(align_x));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_out, sizeof(align_out));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_out, sizeof(align_out));
  return pref;
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

// The M a plan is keyed by: exact up to 16 (decode batches), else rounded up to a power of two.
// Row counts of one bucket run one algorithm, hence the same kernels (tensor_parallel_rehearsals.h
// relies on it).
inline int64_t m_bucket(int64_t m) {
  if (m <= 16) return m;
  int64_t b = 32;
  while (b < m) b <<= 1;
  return b;
}

// A plan keyed by an M bucket: the heuristic chose its algorithm for the bucket's largest M (the
// layouts it was made with); serve() sets the x and out layouts to the M of a call and checks
// once per M that the algorithm runs it.
struct BucketPlan : Plan {
  int64_t m = 0;  // the M its x and out layouts describe now
  std::unordered_set<int64_t> supported_m, unsupported_m;

  // false: the algorithm cannot run m rows (or needs more workspace); the caller makes an exact
  // plan for m.
  bool serve(cublasLtHandle_t handle, int64_t rows, size_t workspace_bytes, const char* op) {
    if (unsupported_m.count(rows)) return false;
    if (m != rows) {
      const uint64_t cols = static_cast<uint64_t>(rows);
      check(cublasLtMatrixLayoutSetAttribute(x, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof(cols)), op, "input M");
      check(cublasLtMatrixLayoutSetAttribute(out, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof(cols)), op, "output M");
      m = rows;
    }
    if (supported_m.count(rows)) return true;
    cublasLtMatmulHeuristicResult_t result{};
    if (cublasLtMatmulAlgoCheck(handle, this->op, w, x, out, out, &algo, &result) == CUBLAS_STATUS_SUCCESS &&
        result.workspaceSize <= workspace_bytes) {
      supported_m.insert(rows);
      return true;
    }
    unsupported_m.insert(rows);
    // Such a plan may load a kernel in the middle of a tensor-parallel step, which its rehearsals
    // (keyed by bucket) do not foresee: say so, a few times.
    static std::atomic<int> reported{0};
    if (reported.fetch_add(1) < 3)
      LOG_INFO("{}: cuBLASLt's algorithm for {} rows cannot run {} rows; they get a plan of their own", op,
               supported_m.empty() ? rows : *std::max_element(supported_m.begin(), supported_m.end()), rows);
    return false;
  }
};

}  // namespace specula::cuda_lt
