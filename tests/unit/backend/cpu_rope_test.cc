// CPU rope against the rotation written out from its definition, for neox and interleaved pairs,
// full and partial rotary dims, GQA head counts, and arbitrary (non-monotonic) positions.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/backend.h"
#include "cpu_test_util.h"

namespace specula {
namespace {

using testing::expect_close;
using testing::random_tensor;
using testing::values;

// A cos|sin table from arbitrary frequencies: row p = cos(p f_i) (i < rd/2), then sin(p f_i).
Tensor make_table(int64_t max_pos, int rotary_dim, std::vector<double>& freqs) {
  const int half = rotary_dim / 2;
  freqs.resize(half);
  for (int i = 0; i < half; ++i) freqs[i] = std::pow(10000.0, -2.0 * i / rotary_dim) * (1.0 + 0.1 * i);
  std::vector<float> t(max_pos * rotary_dim);
  for (int64_t p = 0; p < max_pos; ++p)
    for (int i = 0; i < half; ++i) {
      t[p * rotary_dim + i] = static_cast<float>(std::cos(p * freqs[i]));
      t[p * rotary_dim + half + i] = static_cast<float>(std::sin(p * freqs[i]));
    }
  return Tensor::from_f32(t, {max_pos, rotary_dim});
}

// Rotates one head per the definition: pair i = (a, b) turns by angle pos * f_i.
std::vector<double> rotate_ref(const std::vector<float>& x, int64_t t, int64_t heads, int64_t d,
                               const std::vector<int32_t>& pos, const std::vector<double>& freqs, int rd, bool neox) {
  std::vector<double> out(x.begin(), x.end());
  const int half = rd / 2;
  for (int64_t r = 0; r < t; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = (r * heads + h) * d;
      for (int i = 0; i < half; ++i) {
        const int64_t ia = base + (neox ? i : 2 * i), ib = base + (neox ? i + half : 2 * i + 1);
        const double ang = pos[r] * freqs[i], a = x[ia], b = x[ib];
        out[ia] = a * std::cos(ang) - b * std::sin(ang);
        out[ib] = b * std::cos(ang) + a * std::sin(ang);
      }
    }
  return out;
}

struct RopeCase {
  int64_t hq, hk, d;
  int rotary_dim;
  bool neox;
};
void PrintTo(const RopeCase& c, std::ostream* os) {
  *os << "hq=" << c.hq << " hk=" << c.hk << " d=" << c.d << " rotary_dim=" << c.rotary_dim
      << (c.neox ? " neox" : " interleaved");
}

class CpuRope : public ::testing::TestWithParam<RopeCase> {};

TEST_P(CpuRope, MatchesDefinition) {
  const RopeCase c = GetParam();
  auto be = make_cpu_backend(2);
  std::mt19937 rng(static_cast<unsigned>(c.hq * 100 + c.rotary_dim + c.neox));
  const int64_t t = 11, max_pos = 300;
  std::vector<double> freqs;
  Tensor table = make_table(max_pos, c.rotary_dim, freqs);
  std::vector<int32_t> pos = {0, 1, 2, 299, 17, 16, 15, 100, 5, 5, 250};
  Tensor q = random_tensor({t, c.hq, c.d}, rng), k = random_tensor({t, c.hk, c.d}, rng);
  auto want_q = rotate_ref(values(q), t, c.hq, c.d, pos, freqs, c.rotary_dim, c.neox);
  auto want_k = rotate_ref(values(k), t, c.hk, c.d, pos, freqs, c.rotary_dim, c.neox);
  be->rope(q, k, Tensor::from_i32(pos), table, c.rotary_dim, c.neox);
  // The table itself is fp32-rounded, hence the 1e-6 scale tolerance.
  expect_close(values(q), want_q, 2e-6, 2e-6, "q");
  expect_close(values(k), want_k, 2e-6, 2e-6, "k");
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuRope,
                         ::testing::Values(RopeCase{4, 4, 16, 16, true}, RopeCase{8, 2, 32, 32, true},
                                           RopeCase{8, 2, 32, 16, true},  // partial rotary
                                           RopeCase{4, 1, 24, 24, false}, RopeCase{4, 4, 64, 8, false}));

TEST(CpuRopeErrors, PositionOutsideTableAndBadRotaryDim) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(3);
  std::vector<double> freqs;
  Tensor table = make_table(8, 16, freqs);
  Tensor q = random_tensor({2, 2, 16}, rng), k = random_tensor({2, 1, 16}, rng);
  EXPECT_THROW(be->rope(q, k, Tensor::from_i32({0, 8}), table, 16, true), Error);
  EXPECT_THROW(be->rope(q, k, Tensor::from_i32({0, 1}), table, 15, true), Error);
  EXPECT_THROW(be->rope(q, k, Tensor::from_i32({0, 1}), table, 32, true), Error);
}

}  // namespace
}  // namespace specula
