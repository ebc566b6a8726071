#include "backend/cuda/cuda_batched_gemm.h"

#include <functional>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_lt_common.h"

namespace specula {
namespace {

void check_lt(cublasStatus_t status, const char* op, const char* what) { cuda_lt::check(status, op, what); }
cudaDataType_t cuda_type(DType t, const char* op) { return cuda_lt::data_type(t, op); }
uint16_t alignment_of(const void* p, int64_t ld_bytes, int64_t stride_bytes) {
  return cuda_lt::alignment_of_bits(reinterpret_cast<uintptr_t>(p) | static_cast<uint64_t>(ld_bytes) |
                                    static_cast<uint64_t>(stride_bytes));
}

}  // namespace

struct CublasLtBatchedGemm::Plan : cuda_lt::BucketPlan {};

size_t CublasLtBatchedGemm::KeyHash::operator()(const Key& k) const {
  size_t h = std::hash<int64_t>()(k.m);
  auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  for (int64_t v : {k.n, k.k, k.ldx, k.ldw, k.ldo, k.sx, k.sw, k.so}) mix(std::hash<int64_t>()(v));
  mix(static_cast<size_t>(k.batch) << 8 | static_cast<size_t>(k.dtype));
  mix(static_cast<size_t>(k.align_x) | static_cast<size_t>(k.align_w) << 16 | static_cast<size_t>(k.align_out) << 32 |
      static_cast<size_t>(k.exact_m) << 48);
  return h;
}

CublasLtBatchedGemm::CublasLtBatchedGemm(cudaStream_t stream) : stream_(stream) {
  check_lt(cublasLtCreate(&handle_), "head_linear", "create");
  workspace_ = Tensor::empty({static_cast<int64_t>(kWorkspaceBytes)}, DType::kU8, Device::kCUDA);
}

CublasLtBatchedGemm::~CublasLtBatchedGemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

CublasLtBatchedGemm::Plan& CublasLtBatchedGemm::plan_for(const Key& key, const char* op) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;

  auto plan = std::make_unique<Plan>();
  check_lt(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), op, "matmul descriptor");
  const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)), op, "transa");
  check_lt(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof(no_trans)), op,
           "transb");
  const cudaDataType_t type = cuda_type(key.dtype, op);
  const int32_t batch = key.batch;
  // Column-major views: w_b is K x N (ld ldw), x_b is K x M (ld ldx), out_b is N x M (ld ldo).
  auto layout = [&](cublasLtMatrixLayout_t* l, int64_t rows, int64_t cols, int64_t ld, int64_t stride,
                    const char* what) {
    check_lt(cublasLtMatrixLayoutCreate(l, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld), op,
             what);
    check_lt(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)), op,
             what);
    check_lt(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
             op, what);
  };
  layout(&plan->w, key.k, key.n, key.ldw, key.sw, "weight layout");
  layout(&plan->x, key.k, key.m, key.ldx, key.sx, "input layout");
  layout(&plan->out, key.n, key.m, key.ldo, key.so, "output layout");

  cublasLtMatmulPreference_t pref =
      cuda_lt::preference(kWorkspaceBytes, key.align_w, key.align_x, key.align_out, op);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, plan->op, plan->w, plan->x, plan->out,
                                                               plan->out, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  SPECULA_CHECK(status == CUBLAS_STATUS_SUCCESS && found > 0,
                "{}: cuBLASLt has no algorithm for {} x [{}, {}] x [{}, {}]^T ({}; leading dims x {} w {} out {}; "
                "alignments x {} w {} out {}): {}",
                op, key.batch, key.m, key.k, key.n, key.k, dtype_name(key.dtype), key.ldx, key.ldw, key.ldo,
                key.align_x, key.align_w, key.align_out, cublasLtGetStatusString(status));
  plan->algo = result.algo;
  plan->m = key.m;
  plan->supported_m.insert(key.m);
  return *plans_.emplace(key, std::move(plan)).first->second;
}

CublasLtBatchedGemm::Plan& CublasLtBatchedGemm::plan_serving(Key key, int64_t m, const char* op) {
  key.m = cuda_lt::m_bucket(m);
  Plan& plan = plan_for(key, op);
  if (plan.serve(handle_, m, kWorkspaceBytes, op)) return plan;
  key.m = m;
  key.exact_m = true;
  return plan_for(key, op);
}

void CublasLtBatchedGemm::matmul(Operand x, Operand w, void* out, int64_t ld_out, int64_t out_stride, DType dtype,
                                 int64_t m, int64_t n, int64_t k, int batch, const char* op) {
  if (m == 0 || n == 0 || batch == 0) return;
  const int64_t elem = static_cast<int64_t>(dtype_size(dtype));
  SPECULA_CHECK(k > 0, "{}: empty inner dimension (the caller zero-fills)", op);
  const Key key{m,
                n,
                k,
                x.ld,
                w.ld,
                ld_out,
                x.batch_stride,
                w.batch_stride,
                out_stride,
                batch,
                dtype,
                alignment_of(x.data, x.ld * elem, x.batch_stride * elem),
                alignment_of(w.data, w.ld * elem, w.batch_stride * elem),
                alignment_of(out, ld_out * elem, out_stride * elem)};
  Plan& plan = plan_serving(key, m, op);
  const float alpha = 1.0f, beta = 0.0f;
  check_lt(cublasLtMatmul(handle_, plan.op, &alpha, w.data, plan.w, x.data, plan.x, &beta, out, plan.out, out,
                          plan.out, &plan.algo, workspace_.data(), kWorkspaceBytes, stream_),
           op, "matmul");
}

}  // namespace specula
