// fused_moe against a naive per-token loop in double: every (token, slot) pair runs its expert's
// SwiGLU MLP alone and the weighted outputs are summed. Covers experts with no tokens, one token
// choosing the same expert twice, a batch large enough to be processed in several token chunks,
// and the argument checks.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/backend.h"
#include "cpu_test_util.h"

namespace specula {
namespace {

using testing::expect_close;
using testing::random_floats;
using testing::random_tensor;
using testing::values;

std::vector<double> naive_moe(const std::vector<float>& x, const std::vector<float>& w13, const std::vector<float>& w2,
                              const std::vector<int32_t>& ids, const std::vector<float>& weights, int64_t t, int64_t h,
                              int64_t inter, int64_t cols) {
  std::vector<double> out(t * h, 0.0);
  std::vector<double> act(inter);
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t e = ids[i * cols + c];
      for (int64_t j = 0; j < inter; ++j) {
        double g = 0, u = 0;
        for (int64_t d = 0; d < h; ++d) {
          g += double(x[i * h + d]) * w13[(e * 2 * inter + j) * h + d];
          u += double(x[i * h + d]) * w13[(e * 2 * inter + inter + j) * h + d];
        }
        act[j] = g / (1.0 + std::exp(-g)) * u;
      }
      for (int64_t d = 0; d < h; ++d) {
        double y = 0;
        for (int64_t j = 0; j < inter; ++j) y += act[j] * w2[(e * h + d) * inter + j];
        out[i * h + d] += weights[i * cols + c] * y;
      }
    }
  }
  return out;
}

void check_against_naive(int64_t t, int64_t h, int64_t inter, int64_t e, int64_t cols, unsigned seed,
                         bool repeat_expert) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(seed);
  Tensor x = random_tensor({t, h}, rng);
  Tensor w13 = random_tensor({e, 2 * inter, h}, rng, 1.0f / std::sqrt(float(h)));
  Tensor w2 = random_tensor({e, h, inter}, rng, 1.0f / std::sqrt(float(inter)));
  std::vector<int32_t> ids(t * cols);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(e - 2));  // expert e-1 stays idle
  for (auto& id : ids) id = pick(rng);
  if (repeat_expert) ids[cols] = ids[cols + 1];  // token 1 takes one expert in two slots
  std::vector<float> weights = random_floats(t * cols, rng);
  Tensor id_t = Tensor::from_i32(ids, {t, cols});
  Tensor w_t = Tensor::from_f32(weights, {t, cols});
  Tensor out = Tensor::empty({t, h}, DType::kF32);
  be->fused_moe(x, w13, w2, id_t, w_t, out);
  expect_close(values(out), naive_moe(values(x), values(w13), values(w2), ids, weights, t, h, inter, cols), 1e-4,
               1e-5, "fused_moe");
}

TEST(FusedMoe, MatchesNaivePerTokenLoop) {
  check_against_naive(/*t=*/23, /*h=*/48, /*inter=*/20, /*e=*/9, /*cols=*/3, 1, true);
  check_against_naive(1, 64, 32, 8, 2, 2, false);  // decode: one token
  check_against_naive(5, 16, 8, 3, 1, 3, false);   // top-1
}

TEST(FusedMoe, ManyTokensSpanSeveralChunks) {
  // The CPU op bounds its per-pair buffer to 16 Mi floats: with C * H = 4096 that is 4096 tokens
  // per chunk, so 5000 tokens take two.
  check_against_naive(5000, 1024, 4, 5, 4, 4, false);
}

TEST(FusedMoe, RejectsBadIdsAndShapes) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(5);
  Tensor x = random_tensor({2, 8}, rng), w13 = random_tensor({3, 8, 8}, rng), w2 = random_tensor({3, 8, 4}, rng);
  Tensor w = Tensor::from_f32({0.5f, 0.5f}, {2, 1});
  Tensor out = Tensor::empty({2, 8}, DType::kF32);
  Tensor bad_id = Tensor::from_i32({0, 3}, {2, 1});
  EXPECT_THROW(be->fused_moe(x, w13, w2, bad_id, w, out), Error);
  Tensor ok_id = Tensor::from_i32({0, 2}, {2, 1});
  Tensor bad_w2 = random_tensor({3, 8, 5}, rng);  // I = 5 but w13 says 4
  EXPECT_THROW(be->fused_moe(x, w13, bad_w2, ok_id, w, out), Error);
  EXPECT_THROW(be->fused_moe(x, w13, w2, ok_id, w, x), Error);  // out aliases x
}

}  // namespace
}  // namespace specula
