// out[M, N] = x[M, K] . w[N, K]^T (+ bias[N]) through cuBLASLt: bf16 (or f16/f32) operands, fp32
// accumulation and scaling, bf16 or f32 output.
//
// cuBLASLt sees column-major matrices, and a row-major [N, K] weight IS a column-major K x N
// matrix, so the product is computed as out^T (N x M) = op_T(w) (N x K) . x^T (K x M) with no
// copy of anything. The bias rides in the epilogue (CUBLASLT_EPILOGUE_BIAS adds a vector over
// the N rows of out^T). Descriptors and the heuristic's algorithm are cached per (M bucket, N, K,
// dtypes, bias, pointer alignment). M is exact up to 16 (decode batches) and rounded up to a
// power of two above: the token count of prefill and mixed steps changes nearly every step, and
// a plan per exact M made nearly every such step query the heuristic and launch kernels not yet
// loaded (CUDA loads a kernel's module at its first launch) — on the H100 0.5-4 ms per GEMM
// shape, 5-10 ms per eager step of the embedded models, against ~0.2 ms of GPU work. A bucket's
// plan keeps the heuristic's algorithm for the bucket's largest M, checked once for each M it
// serves (cublasLtMatmulAlgoCheck; an M it does not support gets a plan of its own), and sets its
// M in the layouts per call. The workspace is allocated once (32 MiB, what cuBLAS recommends on
// Hopper), so calls never allocate and can be captured into a CUDA graph.
// The heuristic's first choice is not always the fastest at decode batches: for Llama-3.1-8B's
// FP8 o_proj at 64 rows its 64 x 64 tiles fill 64 of 132 SMs (9.6 us, 41 % of copy bandwidth, on
// the H200; its second candidate 6.6 us). So a bucket plan's first call, when it runs eagerly
// (the graphs' warm-up runs do) and its output fits kTuneMaxOutBytes, times the heuristic's
// first kTuneCandidates algorithms on the call's operands, into a scratch output, and keeps the
// fastest; SPECULA_GEMM_TUNE=0 keeps the first. The CUDA backend allows it only while the engine
// starts (set_tuning_allowed): a shape first met mid-run keeps the first, since timing stalls
// that step (~11 ms a shape), and speculation's catch-ups meet new lengths all run long.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>

#include "core/tensor.h"

namespace specula {

class CublasLtGemm {
 public:
  explicit CublasLtGemm(cudaStream_t stream);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // Raw form; the caller has checked shapes. bias may be null. `op` names the caller in errors.
  // accumulate: out += x . w^T (+ bias), rounded once (beta = 1).
  void matmul(const void* x, const void* w, DType in_dtype, const void* bias, DType bias_dtype, void* out,
              DType out_dtype, int64_t m, int64_t n, int64_t k, const char* op, bool accumulate = false);

  // out[M, N] = x8[M, K] . w8[N, K]^T over F8_E4M3 codes, unscaled (the row scales are applied
  // after: cuBLASLt's per-row "outer vector" scaling has no Hopper kernels), fp32 accumulation,
  // bf16 or f32 out. Throws specula::Error when cuBLASLt has no algorithm; nothing is enqueued then.
  void matmul_fp8(const void* x8, const void* w8, void* out, DType out_dtype, int64_t m, int64_t n, int64_t k,
                  const char* op);

  size_t cached_plans() const { return plans_.size(); }
  // Whether a plan's first eager call may time candidates now (unset: always). Timing waits for
  // the stream and may allocate, which a tensor-parallel rank must never do mid-step
  // (docs/ARCHITECTURE.md); the CUDA backend allows it only while it is the process's one and
  // has not started serving.
  void set_tuning_allowed(std::function<bool()> allowed) { tuning_allowed_ = std::move(allowed); }
  // Plans whose algorithm came from timing candidates (tests).
  int tuned_plans() const { return tuned_plans_; }
  // The M a plan is keyed by (see the header comment).
  static int64_t m_bucket(int64_t m);
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;
  static constexpr int kTuneCandidates = 8;
  static constexpr size_t kTuneMaxOutBytes = size_t{32} << 20;

 private:
  struct Key {
    int64_t m, n, k;  // m: the bucket's (or, with exact_m, the exact M)
    DType in, out;
    bool bias;
    uint16_t align_x, align_w, align_out;
    bool exact_m = false;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Plan;

  Plan& plan_for(const Key& key, const char* op);
  // The plan serving `m` rows under `key` (a bucket's, its layouts set to m), or an exact one.
  Plan& plan_serving(Key key, int64_t m, const char* op);
  // The header's tuning, for a bucket plan's first call (its layouts at that call's M); `bias`
  // already set on the plan's descriptor.
  void tune(Plan& plan, const Key& key, const void* x, const void* w, int64_t m, float beta, const char* op);

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  Tensor workspace_;
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans_;
  bool tune_ = true;
  std::function<bool()> tuning_allowed_;
  int tuned_plans_ = 0;
};

}  // namespace specula
