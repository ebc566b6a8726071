#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/dtype.h"
#include "core/tensor.h"

namespace specula {
namespace {

TEST(DType, Bf16RoundTripIsNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 lies exactly between two bf16 values; ties go to the even mantissa (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
  // 1 + 3 * 2^-8 ties between 1+2^-7 and 1+2^-6; the even one is 1+2^-6 (mantissa 2).
  EXPECT_EQ(f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 10.0f);
  for (int i = 0; i < 1000; ++i) {
    float x = dist(rng);
    float y = bf16_to_f32(f32_to_bf16(x));
    EXPECT_LE(std::fabs(x - y), std::fabs(x) / 128) << x;
  }
}

TEST(DType, F16RoundTrip) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);
  EXPECT_FLOAT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  for (int i = 0; i < 1000; ++i) {
    float x = dist(rng);
    EXPECT_NEAR(f16_to_f32(f32_to_f16(x)), x, std::fabs(x) / 1024) << x;
  }
}

TEST(DType, ParsesSafetensorsNames) {
  DType t;
  ASSERT_TRUE(parse_dtype("BF16", &t));
  EXPECT_EQ(t, DType::kBF16);
  EXPECT_FALSE(parse_dtype("Q4_K", &t));
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::from_f32({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor rows = t.slice(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 2}));
  EXPECT_EQ(rows.data_as<float>()[0], 3.0f);
  Tensor flat = t.reshape({-1});
  EXPECT_EQ(flat.shape(), (Shape{6}));
  EXPECT_THROW(t.reshape({4, 2}), Error);
  EXPECT_THROW(t.slice(2, 4), Error);
}

}  // namespace
}  // namespace specula
