// The MLA head ops on the GPU against the CPU backend: copy_columns (an exact strided copy: the
// columns outside the window must keep their values) and head_linear (one GEMM per head through
// the leading dimensions, also reading and writing a window of each head's columns) at the shapes
// DeepSeek uses: the fixtures' (4 heads, 16 <-> 16), V2-Lite's absorbed projections (16 heads,
// 128 -> 512 and 512 -> 128), V3's head count (128), for 1 to 300 tokens. The fused MLA prologue
// against the separate ops it replaces (Backend::mla_prologue) on the same GPU, bit for bit.
//
// head_linear tolerance: |gpu - cpu| <= 1e-2 |cpu| + 1e-2 max|cpu| (the GPU rounds the fp32 sums
// to bf16, relative 2^-9; a wrong head, row or column moves outputs by O(max|cpu|)).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cuda/cuda_deepseek_kernels.h"
#include "cuda_test_util.h"

namespace specula {
namespace {

using testing::expect_close;
using testing::expect_equal;
using testing::random_bf16_values;
using testing::rope_table;
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
  // Up to 4 tokens take the head GEMV (cuda_head_gemv.cu) where N is a multiple of 4 and K of 8
  // (the last two cases: cuBLAS at every count); more tokens take cuBLAS's batched GEMM.
  for (const HeadLinearCase& c : {HeadLinearCase{4, 16, 16}, HeadLinearCase{4, 32, 32}, HeadLinearCase{16, 128, 512},
                                  HeadLinearCase{16, 512, 128}, HeadLinearCase{128, 128, 512}, HeadLinearCase{3, 24, 40},
                                  HeadLinearCase{2, 16, 6}, HeadLinearCase{2, 12, 8}}) {
    for (int64_t t : {1, 2, 4, 5, 64, 300}) {
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

// MLA's in-place use: each head's first K of Kx columns in, the first N of No columns out, the
// other columns of out untouched.
TEST_F(CudaHeadOps, HeadLinearReadsAndWritesAWindowOfEachHead) {
  std::mt19937 rng(24);
  struct Case {
    int64_t t, heads, kx, k, n, no;
  };
  for (const Case& c : {Case{1, 16, 192, 128, 512, 576}, Case{5, 16, 192, 128, 512, 576}, Case{70, 4, 24, 16, 16, 24},
                        Case{3, 3, 40, 24, 40, 48}}) {
    Tensor x = random_bf16_values({c.t, c.heads, c.kx}, rng);
    Tensor w = random_bf16_values({c.heads, c.n, c.k}, rng, 2.0f / std::sqrt(static_cast<float>(c.k)));
    Tensor before = random_bf16_values({c.t, c.heads, c.no}, rng);
    Tensor x_gpu = to_gpu(*gpu_, x), out_gpu = to_gpu(*gpu_, before);
    gpu_->head_linear(x_gpu, to_gpu(*gpu_, w), out_gpu);
    // The window's reference: the CPU map of the narrowed input.
    Tensor narrow = Tensor::zeros({c.t, c.heads, c.k}, DType::kF32), want_win = Tensor::zeros({c.t, c.heads, c.n}, DType::kF32);
    cpu_->copy_columns(x, 0, narrow, 0, c.k);
    cpu_->head_linear(narrow, w, want_win);
    const std::vector<float> got = to_host(*gpu_, out_gpu), old = before.to_f32_vector(), win = want_win.to_f32_vector();
    double scale = 0;
    for (float v : win) scale = std::max(scale, std::fabs(double(v)));
    std::vector<float> got_win, outside_got, outside_want;
    for (int64_t r = 0; r < c.t * c.heads; ++r)
      for (int64_t j = 0; j < c.no; ++j) {
        if (j < c.n) {
          got_win.push_back(got[r * c.no + j]);
        } else {
          outside_got.push_back(got[r * c.no + j]);
          outside_want.push_back(old[r * c.no + j]);
        }
      }
    const std::string what = "head_linear window T=" + std::to_string(c.t) + " Kx=" + std::to_string(c.kx) +
                             " No=" + std::to_string(c.no);
    expect_close(got_win, win, 1e-2, 1e-2 * scale, what);
    expect_equal(outside_got, outside_want, what + " (outside)");
  }
}

// The fused prologue against the separate ops on the same GPU: the roped query parts in q_mla
// (its other columns untouched) and every cache entry, bit for bit. V2-Lite's shape (16 heads,
// dn 128, dr 64, latent 512) at 1, 5 and 40 tokens, V3's head count, interleaved and neox rope, a
// token past the rope table, and a token whose entry is not kept (slot -1).
TEST_F(CudaHeadOps, MlaPrologueIsTheSeparateOpsBitForBit) {
  std::mt19937 rng(25);
  struct Case {
    std::string name;
    int64_t t, heads, dn, dr, latent;
    bool neox;
  };
  const int64_t max_pos = 97, bs = 16, blocks = 8;
  for (const Case& c : {Case{"v2_lite_decode", 1, 16, 128, 64, 512, false}, Case{"v2_lite_5", 5, 16, 128, 64, 512, false},
                        Case{"v2_lite_40", 40, 16, 128, 64, 512, true}, Case{"v3_heads", 3, 128, 128, 64, 512, false},
                        Case{"fixture", 6, 4, 16, 8, 32, false}}) {
    Tensor q = to_gpu(*gpu_, random_bf16_values({c.t, c.heads * (c.dn + c.dr)}, rng, 2.0f));
    Tensor kv_a = to_gpu(*gpu_, random_bf16_values({c.t, c.latent + c.dr}, rng, 2.0f));
    Tensor kv_norm = to_gpu(*gpu_, random_bf16_values({c.latent}, rng));
    Tensor cos_sin = to_gpu(*gpu_, rope_table(max_pos, static_cast<int>(c.dr)), DType::kF32);
    std::vector<int32_t> positions;
    std::vector<int64_t> slot_ids;
    for (int64_t r = 0; r < c.t; ++r) {
      positions.push_back(r == 1 ? static_cast<int32_t>(max_pos + 3) : static_cast<int32_t>(7 + 2 * r));
      slot_ids.push_back(r == 2 ? -1 : 3 + r);
    }
    Tensor pos = to_gpu(*gpu_, Tensor::from_i32(positions), DType::kI32);
    Tensor slots = to_gpu(*gpu_, Tensor::from_i64(slot_ids), DType::kI64);
    Backend::MlaPrologue p;
    p.num_heads = c.heads;
    p.nope_dim = c.dn;
    p.rope_dim = c.dr;
    p.kv_norm = &kv_norm;
    p.eps = 1e-6f;
    p.positions = &pos;
    p.cos_sin = &cos_sin;
    p.neox = c.neox;
    Tensor q_mla_init = random_bf16_values({c.t, c.heads, c.latent + c.dr}, rng);
    auto run = [&](bool fused) {
      KVCacheLayer cache{gpu_->empty({blocks, bs, 1, c.latent + c.dr}, DType::kBF16), Tensor()};
      gpu_->zero(cache.k);
      Tensor q_mla = to_gpu(*gpu_, q_mla_init);
      gpu_->reset_scratch();
      if (fused) {
        gpu_->mla_prologue(q, kv_a, p, cache, slots, q_mla);
      } else {
        gpu_->Backend::mla_prologue(q, kv_a, p, cache, slots, q_mla);
      }
      return std::pair{to_host(*gpu_, q_mla), to_host(*gpu_, cache.k)};
    };
    const auto want = run(false), got = run(true);
    expect_equal(got.first, want.first, c.name + " q_mla");
    expect_equal(got.second, want.second, c.name + " cache");
    bool written = false;
    for (float v : got.second) written |= v != 0.0f;
    EXPECT_TRUE(written) << c.name;
    cuda::MlaPrologueParams kp;
    kp.kv_a = kv_a.data();
    kp.kv_norm = kv_norm.data();
    kp.cache = kv_a.data();
    kp.latent = static_cast<int>(c.latent);
    kp.rope_dim = static_cast<int>(c.dr);
    EXPECT_TRUE(cuda::mla_prologue_supported(kp, DType::kBF16)) << c.name;  // the fused kernel ran
  }
}

TEST_F(CudaHeadOps, HeadLinearRejectsMismatchedShapes) {
  Tensor x = gpu_->empty({2, 4, 16}, DType::kBF16), out = gpu_->empty({2, 4, 8}, DType::kBF16);
  Tensor wide_k = gpu_->empty({4, 8, 20}, DType::kBF16), wide_n = gpu_->empty({4, 9, 16}, DType::kBF16),
         wrong_heads = gpu_->empty({3, 8, 16}, DType::kBF16);
  EXPECT_THROW(gpu_->head_linear(x, wide_k, out), Error);       // K past x's columns
  EXPECT_THROW(gpu_->head_linear(x, wide_n, out), Error);       // N past out's columns
  EXPECT_THROW(gpu_->head_linear(x, wrong_heads, out), Error);
}

}  // namespace
}  // namespace specula
