// copy_columns and head_linear (the per-head maps of MLA's weight absorption) against plain loops.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "cpu_test_util.h"

namespace specula {
namespace {

using testing::expect_close;
using testing::random_tensor;
using testing::values;

TEST(CopyColumns, CopiesOneColumnRangeAndLeavesTheRestAlone) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(1);
  Tensor src = random_tensor({5, 3, 7}, rng);  // 15 rows of 7
  Tensor dst = random_tensor({15, 10}, rng);
  const std::vector<float> s = values(src), before = values(dst);
  be->copy_columns(src, 2, dst, 6, 4);
  const std::vector<float> after = values(dst);
  for (int r = 0; r < 15; ++r) {
    for (int c = 0; c < 10; ++c) {
      const float want = (c >= 6 && c < 10) ? s[r * 7 + 2 + (c - 6)] : before[r * 10 + c];
      ASSERT_EQ(after[r * 10 + c], want) << r << "," << c;
    }
  }
}

TEST(CopyColumns, WorksOnIntegerTensorsAndChecksRanges) {
  auto be = make_cpu_backend(1);
  Tensor src = Tensor::from_i32({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor dst = Tensor::from_i32({0, 0, 0, 0}, {2, 2});
  be->copy_columns(src, 1, dst, 0, 2);
  EXPECT_EQ(dst.to_i32_vector(), (std::vector<int32_t>{2, 3, 5, 6}));
  EXPECT_THROW(be->copy_columns(src, 2, dst, 0, 2), Error);  // past src's width
  EXPECT_THROW(be->copy_columns(src, 0, dst, 1, 2), Error);  // past dst's width
  Tensor three_rows = Tensor::from_i32({0, 0, 0, 0, 0, 0}, {3, 2});
  EXPECT_THROW(be->copy_columns(src, 0, three_rows, 0, 1), Error);  // rows differ
}

TEST(HeadLinear, IsOneLinearMapPerHead) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(2);
  for (auto [t, heads, k, n] : {std::tuple{7, 3, 5, 9}, std::tuple{1, 4, 16, 32}, std::tuple{40, 16, 24, 8}}) {
    Tensor x = random_tensor({t, heads, k}, rng);
    Tensor w = random_tensor({heads, n, k}, rng);
    Tensor out = Tensor::empty({t, heads, n}, DType::kF32);
    be->head_linear(x, w, out);
    const std::vector<float> xv = values(x), wv = values(w);
    std::vector<double> want(t * heads * n);
    for (int i = 0; i < t; ++i)
      for (int h = 0; h < heads; ++h)
        for (int o = 0; o < n; ++o) {
          double acc = 0;
          for (int j = 0; j < k; ++j) acc += double(xv[(i * heads + h) * k + j]) * wv[(h * n + o) * k + j];
          want[(i * heads + h) * n + o] = acc;
        }
    expect_close(values(out), want, 1e-5, 1e-5, "head_linear");
  }
}

// MLA reads each head's first K columns of a wider x and writes the first N of a wider out in
// place; the rest of out keeps its values.
TEST(HeadLinear, ReadsAndWritesAWindowOfEachHead) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(4);
  const int64_t t = 5, heads = 3, kx = 11, k = 6, n = 4, no = 9;
  Tensor x = random_tensor({t, heads, kx}, rng);
  Tensor w = random_tensor({heads, n, k}, rng);
  Tensor out = random_tensor({t, heads, no}, rng);
  const std::vector<float> xv = values(x), wv = values(w), before = values(out);
  be->head_linear(x, w, out);
  const std::vector<float> got = values(out);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t o = 0; o < no; ++o) {
        const int64_t at = (i * heads + h) * no + o;
        if (o >= n) {
          ASSERT_EQ(got[at], before[at]) << i << "," << h << "," << o;
          continue;
        }
        double acc = 0;
        for (int64_t j = 0; j < k; ++j) acc += double(xv[(i * heads + h) * kx + j]) * wv[(h * n + o) * k + j];
        ASSERT_NEAR(got[at], acc, 1e-5) << i << "," << h << "," << o;
      }
}

TEST(HeadLinear, RejectsMismatchedShapes) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(3);
  Tensor x = random_tensor({2, 3, 4}, rng);
  Tensor out = Tensor::empty({2, 3, 5}, DType::kF32);
  Tensor wrong_heads = random_tensor({2, 5, 4}, rng);
  Tensor wrong_k = random_tensor({3, 5, 6}, rng);
  EXPECT_THROW(be->head_linear(x, wrong_heads, out), Error);
  EXPECT_THROW(be->head_linear(x, wrong_k, out), Error);
  Tensor wide_n = random_tensor({3, 6, 4}, rng);  // N past out's 5 columns
  EXPECT_THROW(be->head_linear(x, wide_n, out), Error);
}

}  // namespace
}  // namespace specula
