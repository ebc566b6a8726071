// RoPE frequencies per type, checked against the published formulas evaluated in double
// (transformers' float32 computation is within a few ulp of them), and the cos|sin table layout.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "model/rope.h"

namespace specula {
namespace {

constexpr double kPi = std::numbers::pi;

double default_freq(double theta, int64_t i, int64_t dim) { return std::pow(theta, -2.0 * i / dim); }

void expect_rel(double got, double want, double rel, const std::string& what) {
  EXPECT_LE(std::fabs(got - want), rel * std::fabs(want)) << what << ": got " << got << ", want " << want;
}

TEST(RopeFrequencies, DefaultIsThetaToTheMinusTwoIOverD) {
  RopeConfig r;
  r.theta = 1000000.0;
  auto f = rope_frequencies(r, 128, 4096);
  ASSERT_EQ(f.inv_freq.size(), 64u);
  EXPECT_EQ(f.attention_scaling, 1.0);
  EXPECT_EQ(f.inv_freq[0], 1.0f);
  for (int64_t i = 0; i < 64; ++i) expect_rel(f.inv_freq[i], default_freq(1e6, i, 128), 4e-7, "inv_freq");
}

TEST(RopeFrequencies, LinearDividesByFactorAndDynamicKeepsDefaultWithinContext) {
  RopeConfig r;
  r.type = RopeConfig::Type::kLinear;
  r.factor = 4.0;
  auto f = rope_frequencies(r, 64, 2048);
  for (int64_t i = 0; i < 32; ++i) expect_rel(f.inv_freq[i], default_freq(1e4, i, 64) / 4.0, 4e-7, "linear");
  r.type = RopeConfig::Type::kDynamic;
  auto d = rope_frequencies(r, 64, 2048);
  for (int64_t i = 0; i < 32; ++i) expect_rel(d.inv_freq[i], default_freq(1e4, i, 64), 4e-7, "dynamic");
}

// Llama 3.1's published settings: theta 500000, factor 8, low 1, high 4, original context 8192.
TEST(RopeFrequencies, Llama3ScalesLowFrequenciesAndSmoothsTheBand) {
  RopeConfig r;
  r.type = RopeConfig::Type::kLlama3;
  r.theta = 500000.0;
  r.factor = 8.0;
  r.low_freq_factor = 1.0;
  r.high_freq_factor = 4.0;
  r.original_max_position_embeddings = 8192;
  auto f = rope_frequencies(r, 128, 131072);
  int high = 0, low = 0, medium = 0;
  for (int64_t i = 0; i < 64; ++i) {
    const double inv = default_freq(500000.0, i, 128), wavelen = 2 * kPi / inv;
    double want;
    if (wavelen < 8192.0 / 4.0) {
      want = inv, ++high;
    } else if (wavelen > 8192.0 / 1.0) {
      want = inv / 8.0, ++low;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      want = (1 - smooth) * inv / 8.0 + smooth * inv, ++medium;
    }
    expect_rel(f.inv_freq[i], want, 2e-6, "llama3 dim " + std::to_string(i));
  }
  EXPECT_GT(high, 0);
  EXPECT_GT(low, 0);
  EXPECT_GT(medium, 0);
}

// YaRN: dims rotating more than beta_fast times over the original context keep their frequency,
// those rotating fewer than beta_slow times are interpolated (divided by factor), a linear ramp
// between; attention scaling 0.1 ln(factor) + 1 unless given.
TEST(RopeFrequencies, YarnRampsBetweenExtrapolationAndInterpolation) {
  RopeConfig r;
  r.type = RopeConfig::Type::kYarn;
  r.theta = 10000.0;
  r.factor = 4.0;
  r.original_max_position_embeddings = 64;
  const int64_t dim = 16;
  auto f = rope_frequencies(r, dim, 256);
  expect_rel(f.attention_scaling, 0.1 * std::log(4.0) + 1.0, 1e-12, "mscale");
  auto corr = [&](double rot) { return dim * std::log(64.0 / (rot * 2 * kPi)) / (2 * std::log(10000.0)); };
  const double lo = std::max(std::floor(corr(32.0)), 0.0), hi = std::min(std::ceil(corr(1.0)), double(dim - 1));
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double inv = default_freq(10000.0, i, dim);
    const double ramp = std::clamp((i - lo) / (hi - lo), 0.0, 1.0);  // 0: extrapolate, 1: interpolate
    const double want = inv / 4.0 * ramp + inv * (1 - ramp);
    expect_rel(f.inv_freq[i], want, 2e-6, "yarn dim " + std::to_string(i));
  }
  // DeepSeek's mscale / mscale_all_dim ratio, and an explicit attention_factor.
  r.mscale = 0.707;
  r.mscale_all_dim = 0.707;
  EXPECT_DOUBLE_EQ(rope_frequencies(r, dim, 256).attention_scaling, 1.0);
  r.mscale_all_dim = 1.0;
  expect_rel(rope_frequencies(r, dim, 256).attention_scaling,
             (0.1 * 0.707 * std::log(4.0) + 1) / (0.1 * std::log(4.0) + 1), 1e-12, "mscale ratio");
  r.attention_factor = 0.5;
  EXPECT_EQ(rope_frequencies(r, dim, 256).attention_scaling, 0.5);
}

TEST(RopeFrequencies, OriginalMaxDefaultsToMaxPositionEmbeddings) {
  RopeConfig r;
  r.type = RopeConfig::Type::kYarn;
  r.factor = 2.0;
  RopeConfig explicit_r = r;
  explicit_r.original_max_position_embeddings = 512;
  EXPECT_EQ(rope_frequencies(r, 32, 512).inv_freq, rope_frequencies(explicit_r, 32, 512).inv_freq);
}

TEST(RopeTable, RowsHoldScaledCosThenSin) {
  RopeFrequencies f;
  f.inv_freq = {1.0f, 0.1f, 0.01f};
  f.attention_scaling = 1.25;
  auto t = rope_cos_sin_table(f, 40);
  ASSERT_EQ(t.size(), 40u * 6);
  for (int p = 0; p < 40; ++p)
    for (int i = 0; i < 3; ++i) {
      const double ang = double(f.inv_freq[i]) * p;
      EXPECT_NEAR(t[p * 6 + i], 1.25 * std::cos(ang), 1e-6);
      EXPECT_NEAR(t[p * 6 + 3 + i], 1.25 * std::sin(ang), 1e-6);
    }
  EXPECT_THROW(rope_frequencies(RopeConfig{}, 15, 64), Error);
}

}  // namespace
}  // namespace specula
