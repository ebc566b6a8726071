// Strided-batched GEMM through cuBLASLt, for head_linear (one small GEMM per attention head):
//   out_b[M, N] = x_b[M, K] . w_b[N, K]^T   for b < batch,
// row-major operands with any leading dimensions and batch strides (elements), fp32 accumulation.
//
// As in cuda_gemm.h, cuBLASLt sees column-major matrices: a row-major [N, K] weight with leading
// dimension ldw IS a column-major K x N matrix with leading dimension ldw, so the product is
// out_b^T (N x M) = op_T(w_b) . x_b^T with no copies; the batch is the layouts' BATCH_COUNT and
// STRIDED_BATCH_OFFSET. A head's columns inside a [T, heads, K] activation are then just a matrix
// with leading dimension heads * K at offset head * K. Plans (descriptors + the heuristic's
// algorithm) are cached per shape with M bucketed as in cuda_gemm.h (M is a step's token count:
// a plan per exact M queried the heuristic, and could load a kernel, at nearly every prefill);
// the workspace is allocated once, so calls can be captured into a CUDA graph.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <memory>
#include <unordered_map>

#include "core/tensor.h"

namespace specula {

class CublasLtBatchedGemm {
 public:
  explicit CublasLtBatchedGemm(cudaStream_t stream);
  ~CublasLtBatchedGemm();
  CublasLtBatchedGemm(const CublasLtBatchedGemm&) = delete;
  CublasLtBatchedGemm& operator=(const CublasLtBatchedGemm&) = delete;

  struct Operand {
    const void* data;
    int64_t ld;            // elements between consecutive rows
    int64_t batch_stride;  // elements between consecutive batch entries
  };
  // x: [M, K] per batch entry, w: [N, K], out: [M, N]; all of `dtype` (BF16, F16 or F32). `op`
  // names the caller in errors.
  void matmul(Operand x, Operand w, void* out, int64_t ld_out, int64_t out_stride, DType dtype, int64_t m, int64_t n,
              int64_t k, int batch, const char* op);

  static constexpr size_t kWorkspaceBytes = size_t{4} << 20;

 private:
  struct Key {
    int64_t m, n, k, ldx, ldw, ldo, sx, sw, so;
    int batch;
    DType dtype;
    uint16_t align_x, align_w, align_out;
    bool exact_m = false;  // m: the bucket's, or the exact M its bucket's algorithm cannot run
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Plan;

  Plan& plan_for(const Key& key, const char* op);
  // The plan serving `m` rows under `key` (a bucket's, its layouts set to m), or an exact one.
  Plan& plan_serving(Key key, int64_t m, const char* op);

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  Tensor workspace_;
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans_;
};

}  // namespace specula
