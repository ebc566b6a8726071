#include "backend/cuda/cuda_gemm.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_lt_common.h"

namespace specula {
namespace {

void check_lt(cublasStatus_t status, const char* what) { cuda_lt::check(status, "linear", what); }
cudaDataType_t cuda_type(DType t) { return cuda_lt::data_type(t, "linear"); }
uint16_t alignment_of(const void* p) { return cuda_lt::alignment_of_bits(reinterpret_cast<uintptr_t>(p)); }

}  // namespace

struct CublasLtGemm::Plan : cuda_lt::BucketPlan {
  bool exact_m = false;
  bool tune_pending = true;  // a bucket plan's first call has not run yet
};

int64_t CublasLtGemm::m_bucket(int64_t m) { return cuda_lt::m_bucket(m); }

size_t CublasLtGemm::KeyHash::operator()(const Key& k) const {
  size_t h = std::hash<int64_t>()(k.m);
  auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  mix(std::hash<int64_t>()(k.n));
  mix(std::hash<int64_t>()(k.k));
  mix(static_cast<size_t>(k.in) << 8 | static_cast<size_t>(k.out) << 16 | static_cast<size_t>(k.bias));
  mix(static_cast<size_t>(k.align_x) | static_cast<size_t>(k.align_w) << 16 | static_cast<size_t>(k.align_out) << 32 |
      static_cast<size_t>(k.exact_m) << 48);
  return h;
}

CublasLtGemm::CublasLtGemm(cudaStream_t stream) : stream_(stream) {
  check_lt(cublasLtCreate(&handle_), "create");
  if (const char* v = std::getenv("SPECULA_GEMM_TUNE")) tune_ = std::strcmp(v, "0") != 0;
  workspace_ = Tensor::empty({static_cast<int64_t>(kWorkspaceBytes)}, DType::kU8, Device::kCUDA);
}

CublasLtGemm::~CublasLtGemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

CublasLtGemm::Plan& CublasLtGemm::plan_for(const Key& key, const char* op) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;

  auto plan = std::make_unique<Plan>();
  const cublasComputeType_t compute = CUBLAS_COMPUTE_32F;  // fp32 accumulation; no TF32 for f32
  check_lt(cublasLtMatmulDescCreate(&plan->op, compute, CUDA_R_32F), "matmul descriptor");
  const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)), "transa");
  check_lt(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof(no_trans)),
           "transb");
  if (key.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    check_lt(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
             "bias epilogue");
  }
  const auto m = static_cast<uint64_t>(key.m), n = static_cast<uint64_t>(key.n), k = static_cast<uint64_t>(key.k);
  check_lt(cublasLtMatrixLayoutCreate(&plan->w, cuda_type(key.in), k, n, static_cast<int64_t>(k)), "weight layout");
  check_lt(cublasLtMatrixLayoutCreate(&plan->x, cuda_type(key.in), k, m, static_cast<int64_t>(k)), "input layout");
  check_lt(cublasLtMatrixLayoutCreate(&plan->out, cuda_type(key.out), n, m, static_cast<int64_t>(n)),
           "output layout");

  cublasLtMatmulPreference_t pref =
      cuda_lt::preference(kWorkspaceBytes, key.align_w, key.align_x, key.align_out, op);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, plan->op, plan->w, plan->x, plan->out,
                                                               plan->out, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  SPECULA_CHECK(status == CUBLAS_STATUS_SUCCESS && found > 0,
                "{}: cuBLASLt has no algorithm for [{}, {}] x [{}, {}]^T ({} in, {} out{}; alignments x {} w {} "
                "out {}): {}",
                op, key.m, key.k, key.n, key.k, dtype_name(key.in), dtype_name(key.out), key.bias ? ", bias" : "",
                key.align_x, key.align_w, key.align_out, cublasLtGetStatusString(status));
  plan->algo = result.algo;
  plan->exact_m = key.exact_m;
  plan->m = key.m;
  plan->supported_m.insert(key.m);
  return *plans_.emplace(key, std::move(plan)).first->second;
}

CublasLtGemm::Plan& CublasLtGemm::plan_serving(Key key, int64_t m, const char* op) {
  key.m = m_bucket(m);
  Plan& plan = plan_for(key, op);
  if (plan.serve(handle_, m, kWorkspaceBytes, op)) return plan;
  key.m = m;
  key.exact_m = true;
  return plan_for(key, op);
}

void CublasLtGemm::tune(Plan& plan, const Key& key, const void* x, const void* w, int64_t m, float beta,
                        const char* op) {
  plan.tune_pending = false;
  // Exact plans are made mid-step (a row count its bucket's algorithm cannot run), where a
  // tensor-parallel rank must not wait for its queue (tensor_parallel_rehearsals.h).
  if (!tune_ || plan.exact_m || (tuning_allowed_ && !tuning_allowed_())) return;
  const size_t out_bytes = static_cast<size_t>(m * key.n) * dtype_size(key.out);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (out_bytes > kTuneMaxOutBytes || cudaStreamIsCapturing(stream_, &capture) != cudaSuccess ||
      capture != cudaStreamCaptureStatusNone)
    return;
  cublasLtMatmulPreference_t pref =
      cuda_lt::preference(kWorkspaceBytes, key.align_w, key.align_x, key.align_out, op);
  cublasLtMatmulHeuristicResult_t results[kTuneCandidates]{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, plan.op, plan.w, plan.x, plan.out, plan.out,
                                                               pref, kTuneCandidates, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (status != CUBLAS_STATUS_SUCCESS || found < 2) return;
  Tensor scratch_out;
  try {
    scratch_out = Tensor::empty({static_cast<int64_t>(out_bytes)}, DType::kU8, Device::kCUDA);
  } catch (const Error&) {
    return;  // no room (a high --gpu-memory-utilization): the heuristic's choice stays
  }
  ++tuned_plans_;
  struct Events {
    cudaEvent_t start = nullptr, stop = nullptr;
    ~Events() {
      if (start) cudaEventDestroy(start);
      if (stop) cudaEventDestroy(stop);
    }
  } events;
  check_cuda(cudaEventCreate(&events.start), op);
  check_cuda(cudaEventCreate(&events.stop), op);
  const cudaEvent_t start = events.start, stop = events.stop;
  const float alpha = 1.0f;
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(handle_, plan.op, &alpha, w, plan.w, x, plan.x, &beta, scratch_out.data(), plan.out,
                          scratch_out.data(), plan.out, &algo, workspace_.data(), kWorkspaceBytes, stream_);
  };
  // Each candidate once to load its kernels, then kRuns back to back behind a host function
  // that holds the stream while they are enqueued (so the GPU's time is measured, not the
  // launches'); the first (the heuristic's) keeps its place unless another is kMargin faster.
  constexpr int kRuns = 10;
  constexpr float kMargin = 0.97f;
  float best_ms = 0.0f;
  int best = -1;
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS || results[i].workspaceSize > kWorkspaceBytes) continue;
    if (run(results[i].algo) != CUBLAS_STATUS_SUCCESS) continue;
    check_cuda(cudaLaunchHostFunc(
                   stream_, [](void*) { std::this_thread::sleep_for(std::chrono::microseconds(500)); }, nullptr),
               op);
    check_cuda(cudaEventRecord(start, stream_), op);
    bool ok = true;
    for (int r = 0; r < kRuns && ok; ++r) ok = run(results[i].algo) == CUBLAS_STATUS_SUCCESS;
    check_cuda(cudaEventRecord(stop, stream_), op);
    check_cuda(cudaEventSynchronize(stop), op);
    float ms = 0.0f;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), op);
    if (ok && (best < 0 || ms < best_ms * kMargin)) {
      best = i;
      best_ms = ms;
    }
  }
  (void)cudaGetLastError();
  if (best > 0) {
    plan.algo = results[best].algo;
    plan.supported_m = {m};
    plan.unsupported_m.clear();
  }
  LOG_DEBUG("{}: cuBLASLt [{}, {}] x [{}, {}]^T: {} candidates timed, #{} kept ({:.2f} us a call)", op, m, key.k,
            key.n, key.k, found, best, best_ms * 1000.0f / kRuns);
}

void CublasLtGemm::matmul_fp8(const void* x8, const void* w8, void* out, DType out_dtype, int64_t m, int64_t n,
                              int64_t k, const char* op) {
  if (m == 0 || n == 0) return;
  const Key key{m, n, k, DType::kF8E4M3, out_dtype, false, alignment_of(x8), alignment_of(w8), alignment_of(out)};
  Plan& plan = plan_serving(key, m, op);
  const float alpha = 1.0f, beta = 0.0f;
  if (plan.tune_pending) tune(plan, key, x8, w8, m, beta, op);
  check_lt(cublasLtMatmul(handle_, plan.op, &alpha, w8, plan.w, x8, plan.x, &beta, out, plan.out, out, plan.out,
                          &plan.algo, workspace_.data(), kWorkspaceBytes, stream_),
           op);
}

void CublasLtGemm::matmul(const void* x, const void* w, DType in_dtype, const void* bias, DType bias_dtype,
                          void* out, DType out_dtype, int64_t m, int64_t n, int64_t k, const char* op,
                          bool accumulate) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: out = bias (or 0), or out += bias
    if (!accumulate) check_cuda(cudaMemsetAsync(out, 0, static_cast<size_t>(m * n) * dtype_size(out_dtype), stream_), op);
    if (bias) check_cuda(cuda::launch_add_bias(out, out_dtype, bias, bias_dtype, m, n, stream_), op);
    return;
  }
  // The bias goes in the epilogue when it has the output's dtype and 16-byte alignment; otherwise
  // a separate broadcast add follows the GEMM.
  const bool epilogue_bias = bias != nullptr && bias_dtype == out_dtype && alignment_of(bias) >= 16;
  const Key key{m, n, k, in_dtype, out_dtype, epilogue_bias, alignment_of(x), alignment_of(w), alignment_of(out)};
  Plan& plan = plan_serving(key, m, op);
  if (epilogue_bias) {
    check_lt(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
             "bias pointer");
  }
  // accumulate: C = D = out with beta 1, so out + x w^T + bias is rounded once.
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  if (plan.tune_pending) tune(plan, key, x, w, m, beta, op);
  check_lt(cublasLtMatmul(handle_, plan.op, &alpha, w, plan.w, x, plan.x, &beta, out, plan.out, out, plan.out,
                          &plan.algo, workspace_.data(), kWorkspaceBytes, stream_),
           op);
  if (bias != nullptr && !epilogue_bias) {
    check_cuda(cuda::launch_add_bias(out, out_dtype, bias, bias_dtype, m, n, stream_), op);
  }
}

}  // namespace specula
