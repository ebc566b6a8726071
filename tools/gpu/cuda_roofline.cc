// Micro-benchmarks of the CUDA backend against the hardware, so that engine figures can be stated
// against a measured roofline: device-to-device copy bandwidth, bf16 GEMM rate (cuBLASLt at
// 8192^3 and at the Llama-3.1-8B layer shapes), decode attention bandwidth and prefill attention
// rate. Every figure is the median of several timed repetitions (CUDA events on the backend's
// stream) after a warm-up. Prints one line per measurement; `--quick` runs fewer repetitions,
// `--attention` only the copy bandwidth, the square GEMM and the attention kernels (bf16 and fp8
// caches); `--prefill` the same for the prompts' attention only; `--projections` (not in the full
// run) the copy bandwidth and the decode projections of Llama-3.1-8B and Qwen3-0.6B as a step runs
// them (weights not in L2); `--fp8` the same for FP8 weights at 1-64 rows, with cuBLASLt's FP8
// GEMM candidates timed one by one; `--fp8-gemv` FP8 weights at 2-4 rows both by the GEMV and by
// the FP8 GEMM path.
//
//   cuda_roofline [--quick] [--attention | --prefill | --projections | --fp8 | --fp8-gemv]
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "core/dtype.h"

namespace specula {
namespace {

int g_reps = 20;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}

// Median milliseconds of one call of fn, timed in batches of `inner` calls between two events.
// With `graph`, the batch is captured once into a CUDA graph and the graph is what gets timed:
// the GPU time of the kernels alone, without the host's per-call work (which an engine running
// CUDA graphs does not pay either); without it, host overhead shows where kernels are short.
double time_ms(CudaBackend& be, const std::function<void()>& fn, int inner = 1, bool graph = false) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  for (int i = 0; i < 3; ++i) fn();  // warm-up (plans, caches, clocks, scratch arena size)
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaGraph_t g = nullptr;
    check(cudaStreamBeginCapture(be.stream(), cudaStreamCaptureModeGlobal), "capture");
    for (int i = 0; i < inner; ++i) fn();
    check(cudaStreamEndCapture(be.stream(), &g), "end capture");
    check(cudaGraphInstantiate(&exec, g, 0), "instantiate");
    cudaGraphDestroy(g);
  }
  std::vector<double> samples;
  for (int r = 0; r < g_reps; ++r) {
    check(cudaEventRecord(start, be.stream()), "record");
    if (graph) {
      check(cudaGraphLaunch(exec, be.stream()), "graph launch");
    } else {
      for (int i = 0; i < inner; ++i) fn();
    }
    check(cudaEventRecord(stop, be.stream()), "record");
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    samples.push_back(ms / inner);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (exec) cudaGraphExecDestroy(exec);
  std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
  return samples[samples.size() / 2];
}

Tensor random_bf16(Backend& be, const Shape& shape, float scale, unsigned seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<uint16_t> host(static_cast<size_t>(n));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  // Fill a 1M-element pattern and repeat it: generating billions of randoms would dominate.
  const size_t pattern = std::min<size_t>(host.size(), 1 << 20);
  for (size_t i = 0; i < pattern; ++i) host[i] = f32_to_bf16(u(rng));
  for (size_t i = pattern; i < host.size(); ++i) host[i] = host[i % pattern];
  Tensor t = be.empty(shape, DType::kBF16);
  Tensor src = Tensor::from_blob(host.data(), shape, DType::kBF16, Device::kCPU);
  be.copy(src, t);
  return t;
}

// Random e4m3 values (|x| <= 1, no NaN), as an fp8 KV cache holds them.
Tensor random_fp8(Backend& be, const Shape& shape, unsigned seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<uint8_t> host(static_cast<size_t>(n));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const size_t pattern = std::min<size_t>(host.size(), 1 << 20);
  for (size_t i = 0; i < pattern; ++i) host[i] = f32_to_f8e4m3(u(rng));
  for (size_t i = pattern; i < host.size(); ++i) host[i] = host[i % pattern];
  Tensor t = be.empty(shape, DType::kF8E4M3);
  be.copy(Tensor::from_blob(host.data(), shape, DType::kF8E4M3, Device::kCPU), t);
  return t;
}

Tensor upload_i32(Backend& be, const std::vector<int32_t>& v, Shape shape = {}) {
  Tensor host = Tensor::from_i32(v, std::move(shape));
  Tensor t = be.empty(host.shape(), DType::kI32);
  be.copy(host, t);
  return t;
}

double copy_bandwidth(CudaBackend& be) {
  const size_t bytes = size_t{2} << 30;
  Tensor a = be.empty({static_cast<int64_t>(bytes)}, DType::kU8), b = be.empty({static_cast<int64_t>(bytes)}, DType::kU8);
  be.zero(a);
  const double ms = time_ms(be, [&] { check(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, be.stream()), "copy"); });
  const double copied = bytes / (ms * 1e-3) / 1e12;
  std::printf("copy    d2d %zu MiB: %.3f ms  %.2f TB/s copied = %.2f TB/s read+write\n", bytes >> 20, ms, copied,
              2 * copied);
  return 2 * copied;
}

double gemm(CudaBackend& be, const char* label, int64_t m, int64_t n, int64_t k, double roofline_tbs) {
  Tensor x = random_bf16(be, {m, k}, 1.0f, 1), w = random_bf16(be, {n, k}, 0.02f, 2);
  Tensor out = be.empty({m, n}, DType::kBF16);
  const double ms = time_ms(be, [&] { be.linear(x, w, nullptr, out); }, m <= 64 ? 10 : 1, /*graph=*/m <= 64);
  const double tflops = 2.0 * m * n * k / (ms * 1e-3) / 1e12;
  const double bytes = 2.0 * (m * k + n * k + m * n);
  const double tbs = bytes / (ms * 1e-3) / 1e12;
  std::printf("gemm    %-10s M=%-5ld N=%-6ld K=%-5ld: %8.4f ms  %7.1f TFLOP/s  %5.2f TB/s (%3.0f%% of copy)\n", label, m,
              n, k, ms, tflops, tbs, 100 * tbs / roofline_tbs);
  return tflops;
}

LinearWeight random_weight(CudaBackend& be, int64_t n, int64_t k, DType dtype) {
  Tensor full = random_bf16(be, {n, k}, 0.02f, 2);
  if (dtype == DType::kBF16) return LinearWeight{full, Tensor()};
  LinearWeight w{be.empty({n, k}, DType::kF8E4M3), be.empty({n}, DType::kF32)};
  be.quantize_fp8_rows(full, w.weight, w.scale);
  return w;
}

// Graph-timed milliseconds of fn after one eager call (the scratch arena grows, at the reset, to
// what the captured graph needs).
double time_graph_ms(CudaBackend& be, const std::function<void()>& fn, int64_t m) {
  fn();
  be.synchronize();
  be.reset_scratch();
  return time_ms(be, fn, m <= 64 ? 10 : 1, /*graph=*/m <= 64);
}

// A linear layer with bf16 or FP8 (e4m3, a scale per row) weights by both paths where the GEMV
// kernel can take M (up to 16 rows), else by cuBLASLt's GEMM: the weights read once.
void linear_paths(CudaBackend& be, const char* label, int64_t m, int64_t n, int64_t k, DType wdt,
                  double roofline_tbs) {
  Tensor x = random_bf16(be, {m, k}, 1.0f, 1);
  const LinearWeight w = random_weight(be, n, k, wdt);
  Tensor out = be.empty({m, n}, DType::kBF16);
  const int64_t default_rows = be.gemv_max_rows(wdt);
  const char* name = wdt == DType::kBF16 ? "bf16" : "fp8";
  for (int64_t gemv_rows : {int64_t{16}, int64_t{0}}) {
    if (gemv_rows > 0 && m > gemv_rows) continue;
    be.set_gemv_max_rows(wdt, gemv_rows);
    const double ms = time_graph_ms(be, [&] { be.linear(x, w, nullptr, out); }, m);
    const double tflops = 2.0 * m * n * k / (ms * 1e-3) / 1e12;
    const double bytes = 2.0 * (m * k + m * n) + static_cast<double>(dtype_size(wdt)) * n * k;
    const double tbs = bytes / (ms * 1e-3) / 1e12;
    std::printf("%s%-4s %-10s M=%-5ld N=%-6ld K=%-5ld: %8.4f ms  %7.1f TFLOP/s  %5.2f TB/s (%3.0f%% of copy)\n", name,
                gemv_rows > 0 ? "gemv" : "gemm", label, m, n, k, ms, tflops, tbs, 100 * tbs / roofline_tbs);
  }
  be.set_gemv_max_rows(wdt, default_rows);
}

// A decoder projection with its neighbours folded in (fused_linear, the default paths) against the
// same work as separate ops: RMSNorm before qkv / gate_up, SwiGLU after gate_up, the residual add
// after o_proj and down.
void fused_projection(CudaBackend& be, const char* label, int64_t m, int64_t n, int64_t k, bool norm,
                      LinearEpilogue epilogue, DType wdt, double roofline_tbs) {
  Tensor x = random_bf16(be, {m, k}, 1.0f, 1), norm_weight = random_bf16(be, {k}, 1.0f, 3);
  const LinearWeight w = random_weight(be, n, k, wdt);
  Tensor out = random_bf16(be, {m, epilogue == LinearEpilogue::kSiluMul ? n / 2 : n}, 1.0f, 4);
  const LinearPrologue prologue = norm ? LinearPrologue::rms_norm(norm_weight, 1e-5f) : LinearPrologue::none();
  const double fused = time_graph_ms(be, [&] { be.fused_linear(x, prologue, w, nullptr, out, epilogue); }, m);
  const double separate =
      time_graph_ms(be, [&] { be.Backend::fused_linear(x, prologue, w, nullptr, out, epilogue); }, m);
  const double bytes = static_cast<double>(dtype_size(wdt)) * n * k;
  std::printf("fused   %-4s %-13s M=%-3ld N=%-6ld K=%-5ld: %8.4f ms (%3.0f%% of copy), separate ops %8.4f ms\n",
              wdt == DType::kBF16 ? "bf16" : "fp8", label, m, n, k, fused,
              100 * bytes / (fused * 1e-3) / 1e12 / roofline_tbs, separate);
}

// The decode projections of a model at M rows as the step runs them (fused_linear: the norm before
// qkv / gate_up, SwiGLU after gate_up, the residual add after o_proj / down), each timed alone and
// as a layer's chain, over enough copies of the weights (>= 384 MB) that none is read from L2.
struct ProjectionShape {
  const char* label;
  int64_t n, k;
  bool norm;
  LinearEpilogue epilogue;
};

void decode_projections(CudaBackend& be, const char* model, const std::vector<ProjectionShape>& layer, int64_t m,
                        DType wdt, double roofline_tbs) {
  const double min_bytes = 384.0 * (1 << 20);
  double layer_bytes = 0;
  for (const ProjectionShape& p : layer) layer_bytes += static_cast<double>(dtype_size(wdt)) * p.n * p.k;
  const int layers = std::max(1, static_cast<int>(min_bytes / layer_bytes + 0.999));
  struct Projection {
    ProjectionShape shape;
    std::vector<LinearWeight> weights;  // one a layer
    Tensor x, norm_weight, out;
  };
  std::vector<Projection> projections;
  for (const ProjectionShape& p : layer) {
    Projection q{p, {}, random_bf16(be, {m, p.k}, 1.0f, 1), random_bf16(be, {p.k}, 1.0f, 3),
                 random_bf16(be, {m, p.epilogue == LinearEpilogue::kSiluMul ? p.n / 2 : p.n}, 1.0f, 4)};
    // A projection timed alone cycles through its own copies, >= 384 MB of them too where it is
    // bound by its bytes (the layer's count alone would leave a 17-50 MB projection's copies in
    // L2); smaller ones are a launch's latency whatever their copies.
    const double bytes = static_cast<double>(dtype_size(wdt)) * p.n * p.k;
    const int copies = bytes >= (1 << 20) ? std::max(layers, static_cast<int>(min_bytes / bytes + 0.999)) : layers;
    for (int l = 0; l < copies; ++l) q.weights.push_back(random_weight(be, p.n, p.k, wdt));
    projections.push_back(std::move(q));
  }
  auto run = [&](const Projection& q, int l) {
    const LinearPrologue prologue =
        q.shape.norm ? LinearPrologue::rms_norm(q.norm_weight, 1e-5f) : LinearPrologue::none();
    Tensor out = q.out;
    be.reset_scratch();  // (M > 2: the norm of the separate ops takes scratch)
    be.fused_linear(q.x, prologue, q.weights[l], nullptr, out, q.shape.epilogue);
  };
  const char* name = wdt == DType::kBF16 ? "bf16" : "fp8";
  // Verification row counts: the tensor-core GEMV (the default) against what runs without it.
  const char* path = m <= be.gemv_max_rows(wdt)                            ? ""
                     : wdt == DType::kBF16 && be.gemv_mma_max_rows() >= m ? " mma"
                                                                          : " gemm";
  double sum_us = 0;
  for (const Projection& q : projections) {
    const int copies = static_cast<int>(q.weights.size());
    const double ms = time_graph_ms(be, [&] { for (int l = 0; l < copies; ++l) run(q, l); }, 1) / copies;
    const double bytes = static_cast<double>(dtype_size(wdt)) * q.shape.n * q.shape.k;
    sum_us += ms * 1e3;
    std::printf("decode  %s %-4s M=%-2ld%s %-8s N=%-6ld K=%-5ld: %7.2f us  %3.0f%% of copy\n", model, name, m, path,
                q.shape.label, q.shape.n, q.shape.k, ms * 1e3, 100 * bytes / (ms * 1e-3) / 1e12 / roofline_tbs);
  }
  const double chain_ms = time_graph_ms(be, [&] {
    for (int l = 0; l < layers; ++l)
      for (const Projection& q : projections) run(q, l);
  }, 1) / layers;
  std::printf("decode  %s %-4s M=%-2ld%s layer chain: %7.2f us (alone %.2f)  %3.0f%% of copy\n", model, name, m, path,
              chain_ms * 1e3, sum_us, 100 * layer_bytes / (chain_ms * 1e-3) / 1e12 / roofline_tbs);
}

// A Llama-3.1-8B decoder layer's projections as a decode step runs them.
std::vector<ProjectionShape> llama8b_layer() {
  using E = LinearEpilogue;
  return {{"qkv", 6144, 4096, true, E::kStore},
          {"o_proj", 4096, 4096, false, E::kAccumulate},
          {"gate_up", 28672, 4096, true, E::kSiluMul},
          {"down", 4096, 14336, false, E::kAccumulate}};
}

void decode_projection_shapes(CudaBackend& be, double roofline_tbs) {
  using E = LinearEpilogue;
  const std::vector<ProjectionShape> llama = llama8b_layer();
  const std::vector<ProjectionShape> qwen = {{"qkv", 4096, 1024, true, E::kStore},
                                             {"o_proj", 1024, 2048, false, E::kAccumulate},
                                             {"gate_up", 6144, 1024, true, E::kSiluMul},
                                             {"down", 1024, 3072, false, E::kAccumulate}};
  // The embedded specula-tiny (hidden 256, 8 / 2 heads of 32, MLP 704): the speculative pair's target.
  const std::vector<ProjectionShape> tiny = {{"qkv", 384, 256, true, E::kStore},
                                             {"o_proj", 256, 256, false, E::kAccumulate},
                                             {"gate_up", 1408, 256, true, E::kSiluMul},
                                             {"down", 256, 704, false, E::kAccumulate}};
  for (int64_t m : {1, 2, 4}) decode_projections(be, "llama8b", llama, m, DType::kBF16, roofline_tbs);
  decode_projections(be, "llama8b", llama, 1, DType::kF8E4M3, roofline_tbs);
  for (int64_t m : {1, 2}) decode_projections(be, "qwen0.6b", qwen, m, DType::kBF16, roofline_tbs);
  // Verification and small batches (k + 1 = 4, 6, 8 rows; 16): the tensor-core GEMV on every
  // size (the default takes it for small weights only), then none (cuBLASLt, separate ops).
  for (int64_t with_mma : {cuda::kGemvMmaMaxRows, int64_t{0}}) {
    be.set_gemv_mma_limits(with_mma, int64_t{1} << 40);
    for (int64_t m : {4, 6, 8, 16}) {
      decode_projections(be, "llama8b", llama, m, DType::kBF16, roofline_tbs);
      decode_projections(be, "qwen0.6b", qwen, m, DType::kBF16, roofline_tbs);
      decode_projections(be, "tiny", tiny, m, DType::kBF16, roofline_tbs);
    }
  }
  be.set_gemv_mma_limits(cuda::kGemvMmaMaxRows, cuda::kGemvMmaMaxWeightBytes);
}

// cuBLASLt's FP8 GEMM candidates (the heuristic's first 16) for Llama-3.1-8B's projections at
// decode batches, each timed on the codes alone (no quantiser, no scale pass), over enough copies
// of the weights (>= 256 MB) that none is read from L2: whether an algorithm other than the
// heuristic's first streams the weights near copy bandwidth (linear_fp8 runs the first).
void fp8_gemm_algorithms(CudaBackend& be, double roofline_tbs) {
  auto lt_check = [](cublasStatus_t st, const char* what) {
    if (st != CUBLAS_STATUS_SUCCESS) throw Error(fmt::format("{}: {}", what, cublasLtGetStatusString(st)));
  };
  cublasLtHandle_t handle = nullptr;
  lt_check(cublasLtCreate(&handle), "cublasLtCreate");
  const size_t workspace_bytes = size_t{32} << 20;
  Tensor workspace = be.empty({static_cast<int64_t>(workspace_bytes)}, DType::kU8);
  struct Shape3 {
    const char* label;
    int64_t n, k;
  };
  for (const Shape3& p : {Shape3{"qkv", 6144, 4096}, Shape3{"o_proj", 4096, 4096}, Shape3{"gate_up", 28672, 4096},
                          Shape3{"down", 4096, 14336}}) {
    const double bytes = static_cast<double>(p.n) * p.k;
    const int copies = std::max(2, static_cast<int>(256.0 * (1 << 20) / bytes + 0.999));
    std::vector<Tensor> weights;
    for (int c = 0; c < copies; ++c) weights.push_back(random_weight(be, p.n, p.k, DType::kF8E4M3).weight);
    for (int64_t m : {8, 16, 32, 64}) {
      Tensor x8 = random_weight(be, m, p.k, DType::kF8E4M3).weight;  // codes of the activations' shape
      Tensor out = be.empty({m, p.n}, DType::kBF16);
      cublasLtMatmulDesc_t op = nullptr;
      lt_check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
      const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
      lt_check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)), "transa");
      lt_check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof(no_trans)), "transb");
      cublasLtMatrixLayout_t lw = nullptr, lx = nullptr, lo = nullptr;
      lt_check(cublasLtMatrixLayoutCreate(&lw, CUDA_R_8F_E4M3, p.k, p.n, p.k), "w layout");
      lt_check(cublasLtMatrixLayoutCreate(&lx, CUDA_R_8F_E4M3, p.k, m, p.k), "x layout");
      lt_check(cublasLtMatrixLayoutCreate(&lo, CUDA_R_16BF, p.n, m, p.n), "out layout");
      cublasLtMatmulPreference_t pref = nullptr;
      lt_check(cublasLtMatmulPreferenceCreate(&pref), "preference");
      lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                    sizeof(workspace_bytes)),
               "workspace");
      cublasLtMatmulHeuristicResult_t results[16]{};
      int found = 0;
      lt_check(cublasLtMatmulAlgoGetHeuristic(handle, op, lw, lx, lo, lo, pref, 16, results, &found), "heuristic");
      for (int i = 0; i < found; ++i) {
        const cublasLtMatmulAlgo_t& algo = results[i].algo;
        int tile = 0, splitk = 0, stages = 0, reduction = 0, swizzle = 0, id = 0;
        size_t got = 0;
        cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &got);
        cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &got);
        cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &got);
        cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &got);
        cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction,
                                             sizeof(reduction), &got);
        cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof(swizzle),
                                             &got);
        const float alpha = 1.0f, beta = 0.0f;
        bool failed = false;
        const double ms = time_ms(be, [&] {
          for (const Tensor& w : weights) {
            if (cublasLtMatmul(handle, op, &alpha, w.data(), lw, x8.data(), lx, &beta, out.data(), lo, out.data(), lo,
                               &algo, workspace.data(), workspace_bytes, be.stream()) != CUBLAS_STATUS_SUCCESS)
              failed = true;
          }
        }, 1, /*graph=*/true) / copies;
        std::printf("fp8algo %-8s M=%-2ld #%-2d id %-3d tile %-3d splitK %-2d stages %-3d reduction %d swizzle %d: %s"
                    "%7.2f us  %3.0f%% of copy\n",
                    p.label, m, i, id, tile, splitk, stages, reduction, swizzle, failed ? "FAILED " : "", ms * 1e3,
                    100 * bytes / (ms * 1e-3) / 1e12 / roofline_tbs);
      }
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatrixLayoutDestroy(lo);
      cublasLtMatrixLayoutDestroy(lx);
      cublasLtMatrixLayoutDestroy(lw);
      cublasLtMatmulDescDestroy(op);
    }
  }
  cublasLtDestroy(handle);
}

// FP8 weights at decode batches and verification rows as the step runs them (GEMV up to 2 rows,
// then the activations' quantiser, cuBLASLt's FP8 GEMM and its scale pass), the quantiser alone,
// and the GEMM's candidates (fp8_gemm_algorithms).
void fp8_projection_shapes(CudaBackend& be, double roofline_tbs) {
  const std::vector<ProjectionShape> llama = llama8b_layer();
  for (int64_t m : {5, 64})
    for (int64_t k : {4096, 14336}) {
      Tensor x = random_bf16(be, {m, k}, 1.0f, 1), codes = be.empty({m, k}, DType::kF8E4M3);
      Tensor scale = be.empty({m}, DType::kF32);
      const double ms = time_graph_ms(be, [&] { be.quantize_fp8_rows(x, codes, scale); }, m);
      std::printf("quantize fp8 rows M=%-2ld K=%-5ld: %7.2f us\n", m, k, ms * 1e3);
    }
  for (int64_t m : {1, 4, 5, 8, 16, 32, 64}) decode_projections(be, "llama8b", llama, m, DType::kF8E4M3, roofline_tbs);
  fp8_gemm_algorithms(be, roofline_tbs);
}

// FP8 weights at 2-4 rows both ways as a step runs them: the GEMV, and the quantiser, cuBLASLt's
// FP8 GEMM and the scales (what rows above gemv_max_rows take), for the GEMV's row limit.
void fp8_gemv_against_gemm(CudaBackend& be, double roofline_tbs) {
  const std::vector<ProjectionShape> llama = llama8b_layer();
  const int64_t gemv_rows = be.gemv_max_rows(DType::kF8E4M3);
  for (int64_t m = 2; m <= 4; ++m) {
    for (int64_t rows : {m, int64_t{1}}) {
      be.set_gemv_max_rows(DType::kF8E4M3, rows);
      decode_projections(be, "llama8b", llama, m, DType::kF8E4M3, roofline_tbs);
    }
  }
  be.set_gemv_max_rows(DType::kF8E4M3, gemv_rows);
}

// Llama-3.1-8B attention: 32 query heads, 8 kv heads, head_dim 128, block size 16. capture_len >
// seq_len: the launch is sized as a decode CUDA graph captured for sequences of capture_len keys
// (the host's lengths) and runs on seq_len (the device's), as in serving. fp8: an e4m3 cache
// (--kv-cache-dtype fp8), whose bytes are half of bf16's.
void attention(CudaBackend& be, int batch, int seq_len, int query_len, double roofline_tbs, double gemm_tflops,
               int capture_len = 0, bool fp8 = false) {
  const int hq = 32, hk = 8, d = 128, bs = 16;
  capture_len = std::max(capture_len, seq_len);
  const int blocks_per_seq = (capture_len + bs - 1) / bs;
  const int num_blocks = batch * blocks_per_seq;
  const Shape cache_shape{num_blocks, bs, hk, d};
  KVCacheLayer cache = fp8 ? KVCacheLayer{random_fp8(be, cache_shape, 3), random_fp8(be, cache_shape, 4), 0.5f, 0.5f}
                           : KVCacheLayer{random_bf16(be, cache_shape, 1.0f, 3), random_bf16(be, cache_shape, 1.0f, 4)};
  const char* cache_name = fp8 ? "fp8 " : "bf16";
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(5));  // pages scattered as in a real pool
  std::vector<int32_t> qsl = {0}, lens, host_lens;
  for (int s = 0; s < batch; ++s) {
    qsl.push_back(qsl.back() + query_len);
    lens.push_back(seq_len);
    host_lens.push_back(capture_len);
  }
  AttentionMetadata md;
  md.num_seqs = batch;
  md.num_tokens = qsl.back();
  md.max_query_len = query_len;
  md.max_seq_len = capture_len;
  md.block_size = bs;
  md.query_start_loc = upload_i32(be, qsl);
  md.seq_lens = upload_i32(be, lens);
  md.block_tables = upload_i32(be, ids, {batch, blocks_per_seq});
  md.query_start_loc_host = qsl;
  md.seq_lens_host = host_lens;
  Tensor q = random_bf16(be, {qsl.back(), hq, d}, 1.0f, 6);
  Tensor out = be.empty({qsl.back(), hq, d}, DType::kBF16);
  auto step = [&] {
    be.reset_scratch();
    be.paged_attention(q, cache, md, 0.088f, out);
  };
  if (query_len == 1) {
    const double ms = time_ms(be, step, 10, /*graph=*/true);
    const double eager_ms = time_ms(be, step, 10);
    const int cluster_splits = be.decode_cluster_splits();
    be.set_decode_cluster_splits(0);
    const double merge_kernel_ms = time_ms(be, step, 10, /*graph=*/true);
    be.set_decode_cluster_splits(cluster_splits);
    const double bytes = 2.0 * batch * seq_len * hk * d * (fp8 ? 1 : 2);  // K and V
    const double tbs = bytes / (ms * 1e-3) / 1e12;
    std::printf("decode  attention %s batch=%-3d seq=%-6d graph for %-5d: %8.4f ms  %5.2f TB/s (%3.0f%% of copy); eager "
                "%.4f ms; merge kernel %.4f ms\n",
                cache_name, batch, seq_len, capture_len, ms, tbs, 100 * tbs / roofline_tbs, eager_ms, merge_kernel_ms);
  } else {
    const double ms = time_ms(be, step);
    // Causal: query row i (of query_len, after seq_len - query_len cached keys) sees
    // seq_len - query_len + i + 1 keys; 2 GEMMs of 2 flops per multiply-add.
    const double context = seq_len - query_len;
    const double pairs = static_cast<double>(batch) * query_len * (context + (query_len + 1) / 2.0);
    const double tflops = 4.0 * pairs * hq * d / (ms * 1e-3) / 1e12;
    std::printf("prefill attention %s batch=%-3d seq=%-6d query=%-5d: %8.4f ms  %6.1f TFLOP/s (%3.0f%% of the 8192^3 "
                "GEMM)\n",
                cache_name, batch, seq_len, query_len, ms, tflops, 100 * tflops / gemm_tflops);
  }
}

// The prompts' shapes: one 4096- and one 1024-token prompt, a 512-token chunk after 7680 cached
// tokens, and 16 prompts of 512 tokens in one step.
void prefill_attention_shapes(CudaBackend& be, double roofline, double peak) {
  for (bool fp8 : {false, true}) {
    attention(be, 1, 4096, 4096, roofline, peak, 0, fp8);
    attention(be, 1, 1024, 1024, roofline, peak, 0, fp8);
    attention(be, 1, 8192, 512, roofline, peak, 0, fp8);
    attention(be, 16, 512, 512, roofline, peak, 0, fp8);
  }
}

// Every attention shape of the report, with a bf16 and an fp8 cache.
void attention_shapes(CudaBackend& be, double roofline, double peak) {
  for (bool fp8 : {false, true}) {
    for (int batch : {1, 16, 32, 64}) {
      for (int seq : {256, 1024, 4096}) attention(be, batch, seq, 1, roofline, peak, 0, fp8);
    }
    attention(be, 1, 256, 1, roofline, peak, 4608, fp8);  // the batch-1 decode graph of bench/ab_decode.sh
    attention(be, 1, 4096, 4096, roofline, peak, 0, fp8);  // one 4096-token prompt
    attention(be, 1, 1024, 1024, roofline, peak, 0, fp8);
    attention(be, 1, 8192, 512, roofline, peak, 0, fp8);  // a 512-token chunk after 7680 cached tokens
    attention(be, 16, 1024, 4, roofline, peak, 0, fp8);   // verification of 3 draft tokens, batch 16
  }
}

int run(int argc, char** argv) {
  bool attention_only = false, prefill_only = false, projections_only = false, fp8_only = false,
       fp8_gemv_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) g_reps = 5;
    if (std::strcmp(argv[i], "--attention") == 0) attention_only = true;
    if (std::strcmp(argv[i], "--prefill") == 0) prefill_only = true;
    if (std::strcmp(argv[i], "--projections") == 0) projections_only = true;
    if (std::strcmp(argv[i], "--fp8") == 0) fp8_only = true;
    if (std::strcmp(argv[i], "--fp8-gemv") == 0) fp8_gemv_only = true;
  }
  auto backend = make_cuda_backend(0);
  auto& be = dynamic_cast<CudaBackend&>(*backend);
  std::printf("device: %s\n", be.name().c_str());
  const double roofline = copy_bandwidth(be);
  if (projections_only) {
    decode_projection_shapes(be, roofline);
    return 0;
  }
  if (fp8_only) {
    fp8_projection_shapes(be, roofline);
    return 0;
  }
  if (fp8_gemv_only) {
    fp8_gemv_against_gemm(be, roofline);
    return 0;
  }
  const double peak = gemm(be, "square", 8192, 8192, 8192, roofline);
  if (attention_only) {
    attention_shapes(be, roofline, peak);
    return 0;
  }
  if (prefill_only) {
    prefill_attention_shapes(be, roofline, peak);
    return 0;
  }
  // Llama-3.1-8B linear layers (hidden 4096, intermediate 14336, 32/8 heads of 128, vocab 128256)
  // at decode batch 1 and 64 and at a 4096-token prefill.
  struct Shape3 {
    const char* label;
    int64_t n, k;
  };
  const Shape3 layers[] = {{"qkv", 6144, 4096}, {"o_proj", 4096, 4096}, {"gate_up", 28672, 4096},
                           {"down", 4096, 14336}, {"lm_head", 128256, 4096}};
  for (int64_t m : {64, 4096}) {
    for (const Shape3& l : layers) gemm(be, l.label, m, l.n, l.k, roofline);
  }
  for (DType wdt : {DType::kBF16, DType::kF8E4M3}) {
    for (int64_t m : {1, 2, 4, 8, 16, 64, 4096}) {
      for (const Shape3& l : layers)
        if (wdt == DType::kBF16 ? m <= 16 : std::strcmp(l.label, "lm_head") != 0)
          linear_paths(be, l.label, m, l.n, l.k, wdt, roofline);
    }
  }
  using Epilogue = LinearEpilogue;
  for (DType wdt : {DType::kBF16, DType::kF8E4M3}) {
    for (int64_t m : {1, 2, 4}) {
      fused_projection(be, "norm+qkv", m, 6144, 4096, true, Epilogue::kStore, wdt, roofline);
      fused_projection(be, "o_proj+add", m, 4096, 4096, false, Epilogue::kAccumulate, wdt, roofline);
      fused_projection(be, "norm+gate_up+silu", m, 28672, 4096, true, Epilogue::kSiluMul, wdt, roofline);
      fused_projection(be, "down+add", m, 4096, 14336, false, Epilogue::kAccumulate, wdt, roofline);
    }
  }
  attention_shapes(be, roofline, peak);
  return 0;
}

}  // namespace
}  // namespace specula

int main(int argc, char** argv) {
  try {
    return specula::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_roofline: %s\n", e.what());
    return 1;
  }
}
