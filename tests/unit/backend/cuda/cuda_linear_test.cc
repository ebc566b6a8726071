// linear through cuBLASLt against the CPU's fp32 SGEMM on the same bf16-rounded inputs: ragged
// M/N/K (odd sizes, decode-sized M), bias in the epilogue (bf16 out) or as a separate add (f32
// out with a bf16 bias), F32 logits out of bf16 inputs, and all-F32 operands.
//
// Tolerance: fp32 accumulation on both sides differs only in summation order (~1e-6); the bf16
// output adds a rounding of relative 2^-9. Inputs are scaled so that outputs are O(1):
// |gpu - cpu| <= 1e-2 + 1e-2 |cpu| for bf16 out, 1e-4 (+1e-4 relative) for f32 out.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cuda/cuda_gemm.h"
#include "cuda_test_util.h"

namespace specula {
namespace {

using testing::expect_close;
using testing::random_bf16_values;
using testing::to_gpu;
using testing::to_host;

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
  for (const LinearCase& c : cases) {
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
                 fmt::format("linear [{}, {}] x [{}, {}]^T {} -> {}{}", c.m, c.k, c.n, c.k, dtype_name(c.in),
                             dtype_name(c.out), c.bias ? " + bias" : ""));
  }
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
