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

// e4m3fn: every finite code decodes and encodes back to itself; values between two codes go to
// the nearer one (ties to the even mantissa); beyond 448 saturate; NaN stays NaN.
TEST(DType, F8E4M3RoundTripIsNearestEvenAndSaturates) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN
    const float v = f8e4m3_to_f32(static_cast<uint8_t>(c));
    EXPECT_EQ(f32_to_f8e4m3(v), c == 0x80 ? 0x80 : c) << c << " " << v;
  }
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f32_to_f8e4m3(1000.0f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(-1e30f), 0xfe);
  EXPECT_EQ(f32_to_f8e4m3(463.0f), 0x7e);
  EXPECT_EQ((f32_to_f8e4m3(NAN) & 0x7f), 0x7f);
  // Normal ties: 1 + 1/16 lies between 1 (mantissa 0) and 1 + 1/8 (mantissa 1): the even one.
  EXPECT_EQ(f32_to_f8e4m3(1.0f + 1.0f / 16), 0x38);
  EXPECT_EQ(f32_to_f8e4m3(1.0f + 3.0f / 16), 0x3a);
  EXPECT_EQ(f32_to_f8e4m3(1.0f + 1.0f / 16 + 1e-4f), 0x39);
  // Subnormals step by 2^-9: 1.5 steps ties to 2 steps, 0.5 steps to 0; 7.5 steps to the smallest
  // normal 2^-6 (code 0x08).
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(1.5f, -9)), 0x02);
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(0.5f, -9)), 0x00);
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(7.5f, -9)), 0x08);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-448.0f, 448.0f);
  for (int i = 0; i < 2000; ++i) {
    const float x = dist(rng);
    const float y = f8e4m3_to_f32(f32_to_f8e4m3(x));
    EXPECT_LE(std::fabs(x - y), std::max(std::fabs(x) / 16, std::ldexp(1.0f, -10))) << x;
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
