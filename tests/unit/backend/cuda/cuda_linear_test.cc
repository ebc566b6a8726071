// linear (the GEMV kernel at small M, cuBLASLt above) against the CPU's fp32 SGEMM on the same
// bf16-rounded inputs: ragged M/N/K (odd sizes, decode-sized M), bias in the epilogue (bf16 out)
// or as a separate add (f32 out with a bf16 bias), F32 logits out of bf16 inputs, and all-F32
// operands; FP8 weights; fused_linear against the separate ops it stands for.
//
// Tolerance: fp32 accumulation on both sides differs only in summation order (~1e-6); the bf16
// output adds a rounding of relative 2^-9. Inputs are scaled so that outputs are O(1):
// |gpu - cpu| <= 1e-2 + 1e-2 |cpu| for bf16 out, 1e-4 (+1e-4 relative) for f32 out.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_kernels.h"
#include "cuda_test_util.h"

namespace specula {
namespace {

using testing::expect_close;
using testing::random_bf16_values;
using testing::to_gpu;
using testing::to_host;

// Weight bytes above any test's: the tensor-core GEMV's size limit lifted.
constexpr int64_t kAnySize = int64_t{1} << 40;

struct LinearCase {
  int64_t m, n, k;
  bool bias;
  DType in, out, bias_dtype;
};

TEST(CudaLinear, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend(2);
  auto gpu = make_cuda_backend(0);
  std::mt19937 rng(11);
  const DType bf = DType::kBF16, f32 = DType::kF32;
  const LinearCase cases[] = {
      {1, 64, 64, false, bf, bf, bf},       {7, 320, 64, false, bf, f32, bf},    {33, 96, 128, true, bf, bf, bf},
      {5, 1000, 1024, true, bf, bf, bf},    {128, 256, 4096, false, bf, bf, bf}, {3, 17, 40, true, bf, bf, bf},
      {2, 3, 8, false, bf, bf, bf},         {9, 200, 72, true, bf, f32, bf},     {64, 512, 256, true, f32, f32, f32},
      {1, 4096, 4096, false, bf, bf, bf},   {300, 768, 512, true, bf, bf, bf},   {4, 6, 24, false, f32, f32, f32},
  };
  auto& cuda = dynamic_cast<CudaBackend&>(*gpu);
  for (const LinearCase& c : cases) {
   for (int64_t gemv_rows : {int64_t{16}, int64_t{0}, int64_t{-1}}) {  // GEMV, tensor-core GEMV, cuBLASLt
    cuda.set_gemv_max_rows(DType::kBF16, std::max<int64_t>(gemv_rows, 0));
    cuda.set_gemv_mma_limits(gemv_rows == 0 ? cuda::kGemvMmaMaxRows : 0, kAnySize);
    Tensor x = random_bf16_values({c.m, c.k}, rng);
    Tensor w = random_bf16_values({c.n, c.k}, rng, 2.0f / std::sqrt(static_cast<float>(c.k)));
    Tensor b = random_bf16_values({c.n}, rng, 0.5f);
    Tensor want = Tensor::zeros({c.m, c.n}, f32);
    cpu->linear(x, w, c.bias ? &b : nullptr, want);
    Tensor bg = to_gpu(*gpu, b, c.bias_dtype);
    Tensor out = gpu->empty({c.m, c.n}, c.out);
    gpu->linear(to_gpu(*gpu, x, c.in), to_gpu(*gpu, w, c.in), c.bias ? &bg : nullptr, out);
    const bool bf16_out = c.out == bf;
    expect_close(to_host(*gpu, out), want.to_f32_vector(), bf16_out ? 1e-2 : 1e-4, bf16_out ? 1e-2 : 1e-4,
                 fmt::format("linear [{}, {}] x [{}, {}]^T {} -> {}{} ({})", c.m, c.k, c.n, c.k, dtype_name(c.in),
                             dtype_name(c.out), c.bias ? " + bias" : "",
                             gemv_rows > 0 ? "GEMV" : gemv_rows == 0 ? "tensor-core GEMV" : "cuBLASLt"));
   }
  }
}

// A MoE router: bf16 rows against fp32 weights into fp32 logits (rows widened exactly, fp32 math),
// by the router GEMV up to its 8 rows and by a cast then the fp32 GEMM above them or with a bias:
// DeepSeek-V2-Lite's 64 x 2048 and V3's 256 x 7168 (past the GEMV's preloaded chunks), odd sizes.
TEST(CudaLinear, RouterRowsAgainstFp32Weights) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend(2);
  auto gpu = make_cuda_backend(0);
  std::mt19937 rng(17);
  struct Case {
    int64_t m, n, k;
    bool bias;
  };
  for (const Case& c : {Case{1, 64, 2048, false}, Case{8, 64, 2048, false}, Case{3, 256, 7168, false},
                        Case{1, 5, 12, false}, Case{9, 64, 2048, false}, Case{40, 64, 2048, false},
                        Case{2, 64, 2048, true}}) {
    Tensor x = random_bf16_values({c.m, c.k}, rng);
    Tensor w = Tensor::empty({c.n, c.k}, DType::kF32);
    std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(c.k)));
    for (int64_t i = 0; i < c.n * c.k; ++i) w.data_as<float>()[i] = normal(rng);
    Tensor b = random_bf16_values({c.n}, rng, 0.5f);
    Tensor want = Tensor::zeros({c.m, c.n}, DType::kF32);
    cpu->linear(x, w, c.bias ? &b : nullptr, want);
    Tensor bg = to_gpu(*gpu, b, DType::kF32);
    Tensor out = gpu->empty({c.m, c.n}, DType::kF32);
    gpu->linear(to_gpu(*gpu, x, DType::kBF16), to_gpu(*gpu, w, DType::kF32), c.bias ? &bg : nullptr, out);
    expect_close(to_host(*gpu, out), want.to_f32_vector(), 1e-4, 1e-4,
                 fmt::format("router [{}, {}] x [{}, {}]^T{}", c.m, c.k, c.n, c.k, c.bias ? " + bias" : ""));
  }
  Tensor x = gpu->empty({1, 64}, DType::kBF16), w = gpu->empty({8, 64}, DType::kF32);
  Tensor bf16_out = gpu->empty({1, 8}, DType::kBF16);
  EXPECT_THROW(gpu->linear(x, w, nullptr, bf16_out), Error);  // fp32 weights give fp32 logits
}

// Plans are shared by every M of a power-of-two bucket above 16 (the algorithm chosen for the
// bucket's largest M, its layouts set to each call's M): every M of several buckets, in an order
// that revisits buckets (the layouts change back and forth) and smaller Ms after larger ones,
// must give the CPU's result, F32 and bf16 outputs, with and without the bias epilogue.
TEST(CudaLinear, EveryMOfABucketSharesItsPlanCorrectly) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend(2);
  auto gpu = make_cuda_backend(0);
  std::mt19937 rng(13);
  const int64_t n = 384, k = 256;
  Tensor w = random_bf16_values({n, k}, rng, 2.0f / std::sqrt(static_cast<float>(k)));
  Tensor b = random_bf16_values({n}, rng, 0.5f);
  const Tensor wg = to_gpu(*gpu, w), bg = to_gpu(*gpu, b);
  for (int64_t m : {300, 17, 256, 129, 31, 1000, 33, 600, 257, 64, 2049, 1500, 18}) {
    EXPECT_EQ(CublasLtGemm::m_bucket(m) >= m, true);
    for (bool bias : {false, true}) {
      for (DType out_dtype : {DType::kBF16, DType::kF32}) {
        Tensor x = random_bf16_values({m, k}, rng);
        Tensor want = Tensor::zeros({m, n}, DType::kF32);
        cpu->linear(x, w, bias ? &b : nullptr, want);
        Tensor out = gpu->empty({m, n}, out_dtype);
        gpu->linear(to_gpu(*gpu, x), wg, bias ? &bg : nullptr, out);
        const bool bf16_out = out_dtype == DType::kBF16;
        expect_close(to_host(*gpu, out), want.to_f32_vector(), bf16_out ? 1e-2 : 1e-4, bf16_out ? 1e-2 : 1e-4,
                     fmt::format("linear M={} (bucket {}){} -> {}", m, CublasLtGemm::m_bucket(m), bias ? " + bias" : "",
                                 dtype_name(out_dtype)));
      }
    }
  }
  EXPECT_EQ(CublasLtGemm::m_bucket(16), 16);
  EXPECT_EQ(CublasLtGemm::m_bucket(17), 32);
  EXPECT_EQ(CublasLtGemm::m_bucket(7296), 8192);
}

// A bucket plan's first eager call times the heuristic's candidates (cuda_gemm.h): into a scratch
// output, so that an accumulating call still adds its product exactly once; under graph capture
// nothing is timed (the heuristic's first algorithm is kept).
TEST(CudaLinear, TuningTimesCandidatesAsideAndNotUnderCapture) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend(2);
  auto gpu = make_cuda_backend(0);
  auto& cuda = dynamic_cast<CudaBackend&>(*gpu);
  std::mt19937 rng(17);
  const int64_t m = 64, n = 4096, k = 1024;
  Tensor x = random_bf16_values({m, k}, rng);
  Tensor w = random_bf16_values({n, k}, rng, 2.0f / std::sqrt(static_cast<float>(k)));
  Tensor residual = random_bf16_values({m, n}, rng);
  Tensor want = Tensor::zeros({m, n}, DType::kF32);
  cpu->linear(x, w, nullptr, want);
  std::vector<float> expected = want.to_f32_vector(), base = residual.to_f32_vector();
  for (size_t i = 0; i < expected.size(); ++i) expected[i] += base[i];
  const Tensor xg = to_gpu(*gpu, x), wg = to_gpu(*gpu, w);
  Tensor out = to_gpu(*gpu, residual);
  CublasLtGemm gemm(cuda.stream());
  gemm.matmul(xg.data(), wg.data(), DType::kBF16, nullptr, DType::kBF16, out.data(), DType::kBF16, m, n, k, "test",
              /*accumulate=*/true);
  EXPECT_EQ(gemm.tuned_plans(), 1);
  expect_close(to_host(*gpu, out), expected, 2e-2, 1e-2, "tuned accumulating GEMM");

  Tensor captured_out = gpu->empty({32, n}, DType::kBF16);
  auto graph = gpu->capture_graph([&] {
    gemm.matmul(xg.data(), wg.data(), DType::kBF16, nullptr, DType::kBF16, captured_out.data(), DType::kBF16, 32, n, k,
                "test");
  });
  ASSERT_NE(graph, nullptr);
  EXPECT_EQ(gemm.cached_plans(), 2u);
  EXPECT_EQ(gemm.tuned_plans(), 1);
}

// Once the engine serves (Backend::start_serving), a shape first met keeps the heuristic's
// algorithm: timing its candidates would stall that step (a speculative run's catch-ups meet new
// lengths throughout it).
TEST(CudaLinear, NoTuningOnceServing) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend(2);
  auto gpu = make_cuda_backend(0);
  auto& cuda = dynamic_cast<CudaBackend&>(*gpu);
  std::mt19937 rng(19);
  const int64_t n = 4096, k = 1024;
  Tensor w = random_bf16_values({n, k}, rng, 2.0f / std::sqrt(static_cast<float>(k)));
  const Tensor wg = to_gpu(*gpu, w);
  auto run = [&](int64_t m) {
    Tensor x = random_bf16_values({m, k}, rng);
    Tensor want = Tensor::zeros({m, n}, DType::kF32);
    cpu->linear(x, w, nullptr, want);
    Tensor out = gpu->empty({m, n}, DType::kF32);
    gpu->linear(to_gpu(*gpu, x), wg, nullptr, out);
    expect_close(to_host(*gpu, out), want.to_f32_vector(), 1e-4, 1e-4, fmt::format("linear M={}", m));
  };
  run(64);
  EXPECT_EQ(cuda.tuned_gemm_plans(), 1) << "while starting, a new bucket's first eager call is tuned";
  gpu->start_serving();
  run(200);
  EXPECT_EQ(cuda.tuned_gemm_plans(), 1) << "serving: bucket 256 keeps the heuristic's first";
}

TEST(CudaLinear, RowsFromALeadingShapeAndEmptyInput) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend(1);
  auto gpu = make_cuda_backend(0);
  std::mt19937 rng(12);
  Tensor x = random_bf16_values({2, 3, 64}, rng);
  Tensor w = random_bf16_values({32, 64}, rng, 0.25f);
  Tensor want = Tensor::zeros({6, 32}, DType::kF32);
  cpu->linear(x.reshape({6, 64}), w, nullptr, want);
  Tensor out = gpu->empty({2, 3, 32}, DType::kBF16);
  gpu->linear(to_gpu(*gpu, x), to_gpu(*gpu, w), nullptr, out);
  expect_close(to_host(*gpu, out), want.to_f32_vector(), 1e-2, 1e-2, "linear [2, 3, 64]");

  Tensor empty_x = gpu->empty({0, 64}, DType::kBF16), empty_out = gpu->empty({0, 32}, DType::kBF16);
  gpu->linear(empty_x, to_gpu(*gpu, w), nullptr, empty_out);
  gpu->synchronize();
}

// FP8 weights. The GPU quantiser gives the CPU's codes and scales byte for byte (same IEEE
// division, same rounding). The GEMV kernel (every M up to 16 here) multiplies bf16 activations
// by the e4m3 weights: the CPU's linear_fp8 on the same values is the reference (bf16 out: 1e-2).
// The tensor-core path (every M with the GEMV threshold at 0, and M > 16) quantises the
// activations per row as well: the reference is the CPU on the activations quantised and
// dequantised the same way. Ragged N, K up to 4096, bias in bf16 and f32, out bf16 and f32.
TEST(CudaLinear, Fp8WeightsMatchCpu) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend(2);
  auto gpu = make_cuda_backend(0);
  std::mt19937 rng(17);
  struct Case {
    int64_t m, n, k;
    bool bias;
    DType out, bias_dtype;
  };
  const DType bf = DType::kBF16, f32 = DType::kF32;
  const Case cases[] = {
      {1, 64, 64, false, bf, bf},       {1, 4096, 4096, false, bf, bf},  {2, 1000, 1024, true, bf, bf},
      {3, 96, 512, true, f32, f32},     {4, 130, 64, false, bf, bf},     {5, 6144, 4096, false, bf, bf},
      {8, 200, 80, true, bf, f32},      {9, 512, 1024, false, f32, bf},  {16, 384, 2048, true, bf, bf},
      {17, 384, 256, false, bf, bf},    {33, 1000, 1024, true, bf, bf},  {300, 768, 512, false, f32, f32},
      {64, 4096, 4096, false, bf, bf},
  };
  auto& cuda = dynamic_cast<CudaBackend&>(*gpu);
  for (const Case& c : cases) {
    for (int64_t gemv_rows : {int64_t{16}, int64_t{0}}) {
      cuda.set_gemv_max_rows(DType::kF8E4M3, gemv_rows);
      Tensor x = random_bf16_values({c.m, c.k}, rng);
      Tensor w = random_bf16_values({c.n, c.k}, rng, 8.0f / std::sqrt(static_cast<float>(c.k)));
      Tensor b = random_bf16_values({c.n}, rng, 0.5f);
      Tensor codes_gpu = gpu->empty({c.n, c.k}, DType::kF8E4M3), scale_gpu = gpu->empty({c.n}, DType::kF32);
      gpu->quantize_fp8_rows(to_gpu(*gpu, w), codes_gpu, scale_gpu);
      Tensor bg = to_gpu(*gpu, b, c.bias_dtype);
      Tensor out = gpu->empty({c.m, c.n}, c.out);
      gpu->linear(to_gpu(*gpu, x), LinearWeight{codes_gpu, scale_gpu}, c.bias ? &bg : nullptr, out);
      // cuBLASLt's FP8 kernels need 16-byte rows of out: other shapes fall back to the GEMV kernel.
      const bool gemm_fits = c.n * static_cast<int64_t>(dtype_size(c.out)) % 16 == 0;
      EXPECT_EQ(cuda.fp8_gemm_unsupported(c.n, c.k, c.out), !gemm_fits && c.m > gemv_rows) << c.n << " " << c.k;
      const bool gemv = c.m <= gemv_rows || cuda.fp8_gemm_unsupported(c.n, c.k, c.out);
      const std::string what =
          fmt::format("linear_fp8 [{}, {}] x [{}, {}]^T -> {}{} ({})", c.m, c.k, c.n, c.k, dtype_name(c.out),
                      c.bias ? " + bias" : "", gemv ? "GEMV" : "FP8 GEMM");
      Tensor codes = Tensor::empty({c.n, c.k}, DType::kF8E4M3), scale = Tensor::empty({c.n}, f32);
      cpu->quantize_fp8_rows(w, codes, scale);
      Tensor codes_back = Tensor::empty({c.n, c.k}, DType::kF8E4M3);
      gpu->copy(codes_gpu, codes_back);
      gpu->synchronize();
      ASSERT_EQ(std::memcmp(codes_back.data(), codes.data(), codes.nbytes()), 0) << what << ": codes";
      ASSERT_EQ(to_host(*gpu, scale_gpu), scale.to_f32_vector()) << what << ": scales";

      Tensor x_ref = x;
      if (!gemv) {  // the activations as the FP8 GEMM sees them
        Tensor x_codes = Tensor::empty({c.m, c.k}, DType::kF8E4M3), x_scale = Tensor::empty({c.m}, f32);
        cpu->quantize_fp8_rows(x, x_codes, x_scale);
        x_ref = Tensor::empty({c.m, c.k}, f32);
        for (int64_t r = 0; r < c.m; ++r)
          for (int64_t i = 0; i < c.k; ++i)
            x_ref.data_as<float>()[r * c.k + i] =
                f8e4m3_to_f32(x_codes.data_as<uint8_t>()[r * c.k + i]) * x_scale.data_as<float>()[r];
      }
      Tensor want = Tensor::zeros({c.m, c.n}, f32);
      cpu->linear(x_ref, LinearWeight{codes, scale}, c.bias ? &b : nullptr, want);
      const bool bf16_out = c.out == bf;
      expect_close(to_host(*gpu, out), want.to_f32_vector(), bf16_out ? 1e-2 : 2e-3, bf16_out ? 1e-2 : 2e-3, what);
    }
  }
}

// fused_linear (the norm, the residual add and SwiGLU inside the GEMV kernel at small M) against
// the separate ops it stands for on the same GPU (Backend::fused_linear: rms_norm, linear, then add
// or silu_mul), for bf16 and FP8 weights, with and without bias and norm, for each epilogue, for M
// on both sides of the GEMV limits, ragged N and rows that do not fit shared memory (a norm over
// K = 16384 from 3 rows up takes the separate ops inside fused_linear too). The two differ in the
// norm's summation order and, above the GEMV, in the GEMM rounding out + product once.
TEST(CudaLinear, FusedLinearMatchesTheSeparateOps) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  std::mt19937 rng(23);
  using Epi = LinearEpilogue;
  struct Case {
    int64_t m, n, k;
    bool norm;
    Epi epilogue;
    bool bias, fp8;
  };
  const Case cases[] = {
      {1, 6144, 4096, true, Epi::kStore, false, false},     {1, 4096, 4096, false, Epi::kAccumulate, true, false},
      {1, 28672, 4096, true, Epi::kSiluMul, false, false},  {1, 4096, 14336, false, Epi::kAccumulate, false, true},
      {2, 1000, 1024, true, Epi::kStore, true, true},       {3, 260, 512, true, Epi::kSiluMul, true, false},
      {4, 1030, 1024, false, Epi::kSiluMul, false, true},   {2, 6000, 2048, true, Epi::kSiluMul, true, true},
      {4, 384, 16384, true, Epi::kAccumulate, false, false}, {4, 384, 2048, true, Epi::kAccumulate, true, false},
      {5, 768, 1024, true, Epi::kStore, false, false},      {8, 512, 512, false, Epi::kAccumulate, true, true},
      {33, 1000, 1024, true, Epi::kSiluMul, true, false},   {17, 512, 1024, true, Epi::kAccumulate, true, true},
      {1, 24, 64, true, Epi::kAccumulate, false, false},    {1, 18, 64, false, Epi::kSiluMul, false, false},
      // Small plain projections (a 0.6B model's o_proj / down): a partial last row group.
      {1, 1020, 3072, false, Epi::kAccumulate, true, false}, {2, 1024, 2048, false, Epi::kStore, false, true},
      // One pass a row (small weights, one row a warp), with each prologue and epilogue; and a
      // norm whose row is one chunk a thread (kept in registers), as Qwen3-0.6B's qkv / gate_up.
      {1, 2048, 2048, true, Epi::kStore, true, false},      {1, 1030, 2048, true, Epi::kSiluMul, false, false},
      {1, 1024, 4096, false, Epi::kAccumulate, false, true}, {1, 4096, 1024, true, Epi::kStore, false, false},
      {1, 6144, 1024, true, Epi::kSiluMul, false, false},
      // Plain projections split over two warps a row (several passes' chunks): every row count,
      // partial last groups.
      {3, 1020, 3072, false, Epi::kAccumulate, true, false}, {8, 1030, 4096, false, Epi::kStore, false, true},
      {16, 998, 2048, false, Epi::kStore, true, false},     {2, 3, 2048, false, Epi::kAccumulate, false, false},
      // FP8 above the GEMV's rows: the norm in the quantiser's kernel, SwiGLU in the scales' (a
      // decode batch's qkv and gate_up; odd widths take the one-column forms).
      {64, 1536, 4096, true, Epi::kStore, true, true},      {64, 3072, 1024, true, Epi::kSiluMul, false, true},
      {24, 1030, 2048, true, Epi::kSiluMul, true, true},    {9, 1000, 1024, false, Epi::kSiluMul, false, true},
      {40, 1024, 8192, true, Epi::kAccumulate, false, true}, {33, 1002, 1024, true, Epi::kStore, false, true},
  };
  for (const Case& c : cases) {
    Tensor x = to_gpu(*gpu, random_bf16_values({c.m, c.k}, rng));
    Tensor norm = to_gpu(*gpu, random_bf16_values({c.k}, rng, 2.0f));
    Tensor bias = to_gpu(*gpu, random_bf16_values({c.n}, rng, 0.5f));
    Tensor w = to_gpu(*gpu, random_bf16_values({c.n, c.k}, rng, 4.0f / std::sqrt(static_cast<float>(c.k))));
    LinearWeight weight{w, Tensor()};
    if (c.fp8) {
      weight = LinearWeight{gpu->empty({c.n, c.k}, DType::kF8E4M3), gpu->empty({c.n}, DType::kF32)};
      gpu->quantize_fp8_rows(w, weight.weight, weight.scale);
    }
    const int64_t out_cols = c.epilogue == Epi::kSiluMul ? c.n / 2 : c.n;
    const Tensor residual = to_gpu(*gpu, random_bf16_values({c.m, out_cols}, rng, 4.0f));
    const LinearPrologue prologue = c.norm ? LinearPrologue::rms_norm(norm, 1e-5f) : LinearPrologue::none();
    Tensor fused = gpu->empty({c.m, out_cols}, DType::kBF16), separate = gpu->empty({c.m, out_cols}, DType::kBF16);
    gpu->copy(residual, fused);
    gpu->copy(residual, separate);
    gpu->fused_linear(x, prologue, weight, c.bias ? &bias : nullptr, fused, c.epilogue);
    gpu->Backend::fused_linear(x, prologue, weight, c.bias ? &bias : nullptr, separate, c.epilogue);
    expect_close(to_host(*gpu, fused), to_host(*gpu, separate), 2e-2, 1e-2,
                 fmt::format("fused_linear M={} N={} K={}{} epilogue {}{}{}", c.m, c.n, c.k, c.norm ? " norm" : "",
                             static_cast<int>(c.epilogue), c.bias ? " + bias" : "", c.fp8 ? " FP8" : ""));
  }
}

// The tensor-core GEMV (2 to 16 rows of bf16 weights, cuda_gemv_mma.cu) against cuBLASLt and the
// separate norm / SwiGLU / add kernels on the same GPU: verification-sized M (one and two tiles of 8
// rows, partial ones), the embedded model's projections, Llama-3.1-8B's qkv, ragged N (a partial
// last tile; SwiGLU over an odd number of columns), K not a multiple of the 32-element k-step,
// bias in bf16 and f32, F32 out (lm_head). Tolerance as above: the norm's and the products'
// summation orders differ.
TEST(CudaLinear, TensorCoreRowsMatchCublasAndTheSeparateOps) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  auto& cuda = dynamic_cast<CudaBackend&>(*gpu);
  cuda.set_gemv_mma_limits(cuda::kGemvMmaMaxRows, kAnySize);  // every size here, not only small weights
  std::mt19937 rng(31);
  using Epi = LinearEpilogue;
  struct Case {
    int64_t m, n, k;
    bool norm;
    Epi epilogue;
    bool bias;
    DType bias_dtype, out;
  };
  const DType bf = DType::kBF16, f32 = DType::kF32;
  const Case cases[] = {
      {6, 384, 256, true, Epi::kStore, false, bf, bf},         {6, 256, 256, false, Epi::kAccumulate, false, bf, bf},
      {6, 1408, 256, true, Epi::kSiluMul, false, bf, bf},      {6, 256, 704, false, Epi::kAccumulate, false, bf, bf},
      {6, 8192, 256, false, Epi::kStore, false, bf, f32},      {3, 384, 256, true, Epi::kStore, true, bf, bf},
      {4, 1408, 256, true, Epi::kSiluMul, true, f32, bf},      {5, 1000, 1024, true, Epi::kStore, true, f32, bf},
      {8, 6144, 4096, true, Epi::kStore, false, bf, bf},       {9, 4096, 1024, true, Epi::kStore, false, bf, bf},
      {11, 130, 72, true, Epi::kSiluMul, true, bf, bf},        {16, 998, 2048, false, Epi::kAccumulate, true, bf, bf},
      {13, 17, 40, false, Epi::kStore, true, f32, f32},        {7, 4096, 14336, false, Epi::kAccumulate, false, bf, bf},
      {12, 262, 3072, true, Epi::kSiluMul, false, bf, f32},    {16, 6144, 1024, true, Epi::kSiluMul, true, bf, bf},
      {2, 384, 256, true, Epi::kStore, false, bf, bf},         {2, 256, 704, false, Epi::kAccumulate, false, bf, bf},
      {2, 1408, 256, true, Epi::kSiluMul, false, bf, bf},      {4, 256, 256, false, Epi::kAccumulate, true, bf, bf},
  };
  for (const Case& c : cases) {
    Tensor x = to_gpu(*gpu, random_bf16_values({c.m, c.k}, rng));
    Tensor norm = to_gpu(*gpu, random_bf16_values({c.k}, rng, 2.0f));
    Tensor bias = to_gpu(*gpu, random_bf16_values({c.n}, rng, 0.5f), c.bias_dtype);
    const LinearWeight weight{
        to_gpu(*gpu, random_bf16_values({c.n, c.k}, rng, 4.0f / std::sqrt(static_cast<float>(c.k)))), Tensor()};
    const int64_t out_cols = c.epilogue == Epi::kSiluMul ? c.n / 2 : c.n;
    const Tensor residual = to_gpu(*gpu, random_bf16_values({c.m, out_cols}, rng, 4.0f), c.out);
    const LinearPrologue prologue = c.norm ? LinearPrologue::rms_norm(norm, 1e-5f) : LinearPrologue::none();
    Tensor mma = gpu->empty({c.m, out_cols}, c.out), reference = gpu->empty({c.m, out_cols}, c.out);
    gpu->copy(residual, mma);
    gpu->copy(residual, reference);
    gpu->fused_linear(x, prologue, weight, c.bias ? &bias : nullptr, mma, c.epilogue);
    cuda.set_gemv_mma_limits(0, kAnySize);
    gpu->fused_linear(x, prologue, weight, c.bias ? &bias : nullptr, reference, c.epilogue);
    cuda.set_gemv_mma_limits(cuda::kGemvMmaMaxRows, kAnySize);
    expect_close(to_host(*gpu, mma), to_host(*gpu, reference), 2e-2, 1e-2,
                 fmt::format("tensor-core fused_linear M={} N={} K={}{} epilogue {}{} -> {}", c.m, c.n, c.k,
                             c.norm ? " norm" : "", static_cast<int>(c.epilogue),
                             c.bias ? fmt::format(" + {} bias", dtype_name(c.bias_dtype)) : "", dtype_name(c.out)));
  }
}

// Each row of the tensor-core GEMV is the same bits whatever the rows beside it (2 to 16: one tile
// or two), with the norm staged in the kernel and with SwiGLU: a verified token's hidden state
// does not depend on how many drafts it is verified with.
TEST(CudaLinear, TensorCoreRowsDoNotDependOnTheBatch) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  dynamic_cast<CudaBackend&>(*gpu).set_gemv_mma_limits(cuda::kGemvMmaMaxRows, kAnySize);
  std::mt19937 rng(37);
  using Epi = LinearEpilogue;
  struct Case {
    int64_t n, k;
    bool norm;
    Epi epilogue;
  };
  for (const Case& c : {Case{384, 256, true, Epi::kStore}, Case{1408, 256, true, Epi::kSiluMul},
                        Case{1000, 3072, false, Epi::kStore}}) {
    const int64_t rows = 16, out_cols = c.epilogue == Epi::kSiluMul ? c.n / 2 : c.n;
    Tensor x = random_bf16_values({rows, c.k}, rng);
    Tensor norm = to_gpu(*gpu, random_bf16_values({c.k}, rng, 2.0f));
    const LinearWeight weight{
        to_gpu(*gpu, random_bf16_values({c.n, c.k}, rng, 4.0f / std::sqrt(static_cast<float>(c.k)))), Tensor()};
    const LinearPrologue prologue = c.norm ? LinearPrologue::rms_norm(norm, 1e-5f) : LinearPrologue::none();
    Tensor all = gpu->empty({rows, out_cols}, DType::kBF16);
    gpu->fused_linear(to_gpu(*gpu, x), prologue, weight, nullptr, all, c.epilogue);
    const std::vector<float> want = to_host(*gpu, all), x_values = x.to_f32_vector();
    for (int64_t m : {2, 3, 4, 5, 6, 8, 9, 13}) {
      const Tensor xm = Tensor::from_f32({x_values.begin(), x_values.begin() + m * c.k}, {m, c.k});
      Tensor out = gpu->empty({m, out_cols}, DType::kBF16);
      gpu->fused_linear(to_gpu(*gpu, xm), prologue, weight, nullptr, out, c.epilogue);
      const std::vector<float> got = to_host(*gpu, out);
      int64_t differing = 0;
      for (int64_t i = 0; i < m * out_cols; ++i) differing += got[i] != want[i];
      EXPECT_EQ(differing, 0) << "N=" << c.n << " K=" << c.k << (c.norm ? " norm" : "") << " epilogue "
                              << static_cast<int>(c.epilogue) << ": " << m << " rows";
    }
  }
}

// A plain projection's rows (no norm, no SwiGLU: o_proj, down, lm_head) come out bit for bit the same
// whatever the batch they run in, at every row count the GEMV takes: a token verified among
// drafts gets the logits it would get decoded alone. bf16 and FP8 weights; rows of one pass and of
// several, both split over two warps a row.
TEST(CudaLinear, PlainProjectionRowsDoNotDependOnTheBatch) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  auto& cuda = dynamic_cast<CudaBackend&>(*gpu);
  std::mt19937 rng(29);
  struct Case {
    int64_t n, k;
    bool fp8;
  };
  for (const Case& c : {Case{1024, 3072, false}, Case{4096, 4096, false}, Case{1030, 14336, true}}) {
    const DType wdt = c.fp8 ? DType::kF8E4M3 : DType::kBF16;
    const int64_t rows = 16, saved = cuda.gemv_max_rows(wdt);
    cuda.set_gemv_max_rows(wdt, rows);
    Tensor x = random_bf16_values({rows, c.k}, rng);
    Tensor w = to_gpu(*gpu, random_bf16_values({c.n, c.k}, rng, 2.0f / std::sqrt(static_cast<float>(c.k))));
    LinearWeight weight{w, Tensor()};
    if (c.fp8) {
      weight = LinearWeight{gpu->empty({c.n, c.k}, DType::kF8E4M3), gpu->empty({c.n}, DType::kF32)};
      gpu->quantize_fp8_rows(w, weight.weight, weight.scale);
    }
    Tensor all = gpu->empty({rows, c.n}, DType::kBF16);
    gpu->fused_linear(to_gpu(*gpu, x), LinearPrologue::none(), weight, nullptr, all, LinearEpilogue::kStore);
    const std::vector<float> want = to_host(*gpu, all), x_values = x.to_f32_vector();
    for (int64_t m : {1, 2, 3, 4, 5, 8, 13}) {
      const Tensor xm = Tensor::from_f32({x_values.begin(), x_values.begin() + m * c.k}, {m, c.k});
      Tensor out = gpu->empty({m, c.n}, DType::kBF16);
      gpu->fused_linear(to_gpu(*gpu, xm), LinearPrologue::none(), weight, nullptr, out, LinearEpilogue::kStore);
      const std::vector<float> got = to_host(*gpu, out);
      int64_t differing = 0;
      for (int64_t i = 0; i < m * c.n; ++i) differing += got[i] != want[i];
      EXPECT_EQ(differing, 0) << "N=" << c.n << " K=" << c.k << (c.fp8 ? " FP8" : "") << ": " << m << " rows";
    }
    cuda.set_gemv_max_rows(wdt, saved);
  }
}

TEST(CudaLinear, RejectsMismatchedShapes) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  Tensor x = gpu->empty({4, 64}, DType::kBF16), w = gpu->empty({32, 48}, DType::kBF16);
  Tensor out = gpu->empty({4, 32}, DType::kBF16);
  try {
    gpu->linear(x, w, nullptr, out);
    FAIL() << "K mismatch accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must end in K = 48"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace specula
