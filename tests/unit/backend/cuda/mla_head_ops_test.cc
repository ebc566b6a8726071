// The MLA head ops on the GPU against the CPU backend: copy_columns (an exact strided copy: the
// columns outside the window must keep their values) and head_linear (one GEMM per head through
// the leading dimensions) at the shapes DeepSeek uses: the fixtures' (4 heads, 16 <-> 16), V2-Lite's
// absorbed projections (16 heads, 128 -> 512 and 512 -> 128), V3's head count (128), for 1 to 300
// tokens.
//
// head_linear tolerance: |gpu - cpu| <= 1e-2 |cpu| + 1e-2 max|cpu| (the GPU rounds the fp32 sums
// to bf16, relative 2^-9; a wrong head, row or column moves outputs by O(max|cpu|)).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "cuda_test_util.h"

namespace specula {
namespace {

using testing::expect_close;
using testing::expect_equal;
using testing::random_bf16_values;
using testing::to_gpu;
using testing::to_host;

class CudaHeadOps : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    cpu_ = make_cpu_backend(2);
    gpu_ = make_cuda_backend(0);
  }
  std::unique_ptr<Backend> cpu_, gpu_;

  struct HeadLinearCase {
    int64_t heads, k, n;
  };
  // head_linear of t tokens on the GPU against the CPU backend.
  void check_head_linear(const HeadLinearCase& c, int64_t t, std::mt19937& rng) {
    Tensor x = random_bf16_values({t, c.heads, c.k}, rng);
    Tensor w = random_bf16_values({c.heads, c.n, c.k}, rng, 2.0f / std::sqrt(static_cast<float>(c.k)));
    Tensor out_cpu = Tensor::zeros({t, c.heads, c.n}, DType::kF32);
    cpu_->head_linear(x, w, out_cpu);
    Tensor out_gpu = gpu_->empty({t, c.heads, c.n}, DType::kBF16);
    gpu_->head_linear(to_gpu(*gpu_, x), to_gpu(*gpu_, w), out_gpu);
    std::vector<float> want = out_cpu.to_f32_vector();
    double scale = 0;
    for (float v : want) scale = std::max(scale, std::fabs(double(v)));
    expect_close(to_host(*gpu_, out_gpu), want, 1e-2, 1e-2 * scale,
                 "head_linear T=" + std::to_string(t) + " heads=" + std::to_string(c.heads) +
                     " K=" + std::to_string(c.k) + " N=" + std::to_string(c.n));
  }
};

TEST_F(CudaHeadOps, CopyColumnsMatchesCpu) {
  std::mt19937 rng(21);
  struct Case {
    Shape src, dst;
    int64_t src_col, dst_col, width;
    DType dtype;
  };
  const std::vector<Case> cases = {
      {{7, 4, 24}, {7 * 4, 16}, 0, 0, 16, DType::kBF16},    // q_nope out of [T * Hq, dn + dr]
      {{7 * 4, 24}, {7, 4, 8}, 16, 0, 8, DType::kBF16},     // q_pe
      {{5, 576}, {5, 1, 576}, 0, 512, 64, DType::kBF16},    // k_pe into the cache entry
      {{300, 16, 512}, {300, 16, 576}, 0, 0, 512, DType::kBF16},
      {{3, 10}, {3, 7}, 3, 2, 5, DType::kF32},              // odd widths and offsets
      {{1, 1}, {1, 3}, 0, 2, 1, DType::kBF16},
  };
  for (const Case& c : cases) {
    Tensor src = random_bf16_values(c.src, rng), dst = random_bf16_values(c.dst, rng);
    Tensor src_gpu = to_gpu(*gpu_, src, c.dtype), dst_gpu = to_gpu(*gpu_, dst, c.dtype);
    cpu_->copy_columns(src, c.src_col, dst, c.dst_col, c.width);
    gpu_->copy_columns(src_gpu, c.src_col, dst_gpu, c.dst_col, c.width);
    expect_equal(to_host(*gpu_, dst_gpu), dst.to_f32_vector(),
                 "copy_columns " + shape_str(c.src) + " -> " + shape_str(c.dst));
  }
  Tensor a = gpu_->empty({4, 8}, DType::kBF16), b = gpu_->empty({4, 8}, DType::kBF16);
  EXPECT_THROW(gpu_->copy_columns(a, 4, b, 0, 5), Error);  // past the source's width
  Tensor c = gpu_->empty({5, 8}, DType::kBF16);
  EXPECT_THROW(gpu_->copy_columns(a, 0, c, 0, 4), Error);  // different row counts
}

TEST_F(CudaHeadOps, HeadLinearMatchesCpu) {
  std::mt19937 rng(22);
  for (const HeadLinearCase& c : {HeadLinearCase{4, 16, 16}, HeadLinearCase{4, 32, 32}, HeadLinearCase{16, 128, 512},
                                  HeadLinearCase{16, 512, 128}, HeadLinearCase{128, 128, 512}, HeadLinearCase{3, 24, 40}}) {
    for (int64_t t : {1, 5, 64, 300}) {
      if (c.heads == 128 && t == 300) continue;  // large enough at 64 tokens; keeps the CPU side quick
      check_head_linear(c, t, rng);
    }
  }
}

// Token counts share a plan per M bucket (cuda_lt_common.h): the plan made for the first count of
// a bucket serves the others, larger and smaller, with the layouts set to each.
TEST_F(CudaHeadOps, HeadLinearTokenCountsOfABucketShareItsPlan) {
  std::mt19937 rng(23);
  for (const HeadLinearCase& c : {HeadLinearCase{4, 32, 32}, HeadLinearCase{3, 24, 40}})
    for (int64_t t : {300, 257, 511, 260, 33, 64, 40, 17, 16}) check_head_linear(c, t, rng);
}

TEST_F(CudaHeadOps, HeadLinearRejectsMismatchedShapes) {
  Tensor x = gpu_->empty({2, 4, 16}, DType::kBF16), w = gpu_->empty({4, 8, 12}, DType::kBF16),
         out = gpu_->empty({2, 4, 8}, DType::kBF16);
  EXPECT_THROW(gpu_->head_linear(x, w, out), Error);
}

}  // namespace
}  // namespace specula
