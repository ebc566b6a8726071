// CPU backend row-wise ops and linear, each against a naive loop in double on random inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <span>

#include "backend/backend.h"
#include "cpu_test_util.h"

namespace specula {
namespace {

using testing::expect_close;
using testing::random_tensor;
using testing::values;

class CpuOps : public ::testing::TestWithParam<int> {  // parameter: thread count
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend(GetParam());
  std::mt19937 rng{static_cast<unsigned>(GetParam()) * 7919u + 11u};
};

std::vector<double> rms_norm_ref(const std::vector<float>& x, const std::vector<float>& w, double eps) {
  const size_t h = w.size(), rows = x.size() / h;
  std::vector<double> out(x.size());
  for (size_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (size_t i = 0; i < h; ++i) ss += double(x[r * h + i]) * x[r * h + i];
    double inv = 1.0 / std::sqrt(ss / h + eps);
    for (size_t i = 0; i < h; ++i) out[r * h + i] = x[r * h + i] * inv * w[i];
  }
  return out;
}

TEST_P(CpuOps, Embedding) {
  const int64_t v = 50, h = 24;
  Tensor table = random_tensor({v, h}, rng);
  Tensor ids = Tensor::from_i32({3, 0, 49, 3, 17, 8, 8});
  Tensor out = be->empty({7, h}, DType::kF32);
  be->embedding(ids, table, out);
  auto tv = values(table), ov = values(out);
  auto id = ids.to_i32_vector();
  for (size_t t = 0; t < id.size(); ++t)
    for (int64_t i = 0; i < h; ++i) ASSERT_EQ(ov[t * h + i], tv[id[t] * h + i]);
  Tensor bad = Tensor::from_i32({3, 50});
  Tensor two_rows = out.slice(0, 2);
  EXPECT_THROW(be->embedding(bad, table, two_rows), Error);
}

// Two ranks' shares of a 50-row table (rows 0..24 and 25..49): each writes the rows of its ids and
// zeros for the rest, so that their sum is the whole table's embedding.
TEST_P(CpuOps, VocabParallelEmbeddingSharesSumToTheEmbedding) {
  const int64_t v = 50, h = 24;
  Tensor table = random_tensor({v, h}, rng);
  Tensor ids = Tensor::from_i32({3, 0, 49, 25, 24, 8, 30});
  Tensor whole = be->empty({7, h}, DType::kF32);
  be->embedding(ids, table, whole);
  std::vector<float> sum(static_cast<size_t>(7 * h), 0.0f);
  for (int64_t first : {0, 25}) {
    Tensor share = table.slice(first, first + v / 2);
    Tensor out = be->empty({7, h}, DType::kF32);
    be->vocab_parallel_embedding(ids, share, first, out);
    const auto ov = values(out);
    const auto id = ids.to_i32_vector();
    for (size_t t = 0; t < id.size(); ++t) {
      const bool mine = id[t] >= first && id[t] < first + v / 2;
      for (int64_t i = 0; i < h; ++i) {
        if (!mine) ASSERT_EQ(ov[t * h + i], 0.0f) << "id " << id[t] << " is not in rows " << first << "..";
        sum[t * h + i] += ov[t * h + i];
      }
    }
  }
  EXPECT_EQ(sum, values(whole));
  Tensor negative = Tensor::from_i32({-1});
  Tensor one_row = whole.slice(0, 1);
  EXPECT_THROW(be->vocab_parallel_embedding(negative, table, 0, one_row), Error);
}

TEST_P(CpuOps, RmsNorm) {
  const int64_t rows = 37, h = 96;  // 37*96 > the threading threshold only for larger rows; test both
  for (int64_t r : {int64_t{3}, rows, int64_t{300}}) {
    Tensor x = random_tensor({r, h}, rng, 3.0f);
    Tensor w = random_tensor({h}, rng);
    Tensor out = be->empty({r, h}, DType::kF32);
    be->rms_norm(x, w, 1e-5f, out);
    expect_close(values(out), rms_norm_ref(values(x), values(w), 1e-5), 2e-6, 1e-6, "rms_norm");
    // In place (out aliases x) gives the same result.
    Tensor x2 = be->empty({r, h}, DType::kF32);
    be->copy(x, x2);
    be->rms_norm(x2, w, 1e-5f, x2);
    EXPECT_EQ(values(x2), values(out));
  }
  // Any leading shape: [T, heads, D] normalised over D (Qwen3's per-head q/k norm).
  Tensor x = random_tensor({5, 4, 16}, rng);
  Tensor w = random_tensor({16}, rng);
  Tensor out = be->empty({5, 4, 16}, DType::kF32);
  be->rms_norm(x, w, 1e-6f, out);
  expect_close(values(out), rms_norm_ref(values(x), values(w), 1e-6), 2e-6, 1e-6, "rms_norm per head");
  Tensor wrong = random_tensor({15}, rng);
  EXPECT_THROW(be->rms_norm(x, wrong, 1e-6f, out), Error);
}

TEST_P(CpuOps, AddRmsNormUpdatesResidualAndNormalises) {
  for (int64_t rows : {int64_t{2}, int64_t{257}}) {
    const int64_t h = 64;
    Tensor x = random_tensor({rows, h}, rng);
    Tensor res = random_tensor({rows, h}, rng, 2.0f);
    Tensor w = random_tensor({h}, rng);
    auto xv = values(x), rv = values(res);
    std::vector<float> sum(xv.size());
    std::vector<double> sum_d(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) {
      sum[i] = xv[i] + rv[i];
      sum_d[i] = sum[i];
    }
    be->add_rms_norm(x, res, w, 1e-5f);
    expect_close(values(res), sum_d, 0, 0, "residual");
    expect_close(values(x), rms_norm_ref(sum, values(w), 1e-5), 2e-6, 1e-6, "normed");
  }
}

TEST_P(CpuOps, SiluMul) {
  const int64_t t = 9, inter = 40;
  Tensor gu = random_tensor({t, 2 * inter}, rng, 4.0f);
  Tensor out = be->empty({t, inter}, DType::kF32);
  be->silu_mul(gu, out);
  auto g = values(gu);
  std::vector<double> want(t * inter);
  for (int64_t r = 0; r < t; ++r)
    for (int64_t i = 0; i < inter; ++i) {
      double gate = g[r * 2 * inter + i], up = g[r * 2 * inter + inter + i];
      want[r * inter + i] = gate / (1.0 + std::exp(-gate)) * up;
    }
  expect_close(values(out), want, 1e-6, 1e-7, "silu_mul");
}

TEST_P(CpuOps, Add) {
  Tensor a = random_tensor({6, 7}, rng), b = random_tensor({6, 7}, rng);
  Tensor out = be->empty({6, 7}, DType::kF32);
  be->add(a, b, out);
  auto av = values(a), bv = values(b);
  std::vector<double> want(av.size());
  for (size_t i = 0; i < av.size(); ++i) want[i] = av[i] + bv[i];
  expect_close(values(out), want, 1e-7, 0, "add");
  Tensor c = random_tensor({7, 6}, rng);
  EXPECT_THROW(be->add(a, c, out), Error);
}

TEST_P(CpuOps, GatherRows) {
  Tensor x = random_tensor({10, 3, 4}, rng);
  Tensor idx = Tensor::from_i32({9, 0, 0, 4});
  Tensor out = be->empty({4, 3, 4}, DType::kF32);
  be->gather_rows(x, idx, out);
  auto xv = values(x), ov = values(out);
  auto iv = idx.to_i32_vector();
  for (size_t r = 0; r < iv.size(); ++r)
    for (int i = 0; i < 12; ++i) ASSERT_EQ(ov[r * 12 + i], xv[iv[r] * 12 + i]);
  // Integer rows gather too (the model splits fused heads with this).
  Tensor xi = Tensor::from_i32({10, 11, 12, 13, 14, 15}, {3, 2});
  Tensor oi = Tensor::zeros({2, 2}, DType::kI32);
  be->gather_rows(xi, Tensor::from_i32({2, 0}), oi);
  EXPECT_EQ(oi.to_i32_vector(), (std::vector<int32_t>{14, 15, 10, 11}));
  Tensor one_row = out.slice(0, 1);
  EXPECT_THROW(be->gather_rows(x, Tensor::from_i32({10}), one_row), Error);
}

std::vector<double> linear_ref(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>* b,
                               int64_t m, int64_t n, int64_t k) {
  std::vector<double> out(m * n);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) {
      double acc = b ? (*b)[c] : 0.0;
      for (int64_t i = 0; i < k; ++i) acc += double(x[r * k + i]) * w[c * k + i];
      out[r * n + c] = acc;
    }
  return out;
}

// Async scheduling's draft feed: each negative id -(1 + i) becomes source[i], others stay; an
// index past the source is an error on the host (a device backend cannot check it).
TEST_P(CpuOps, FeedTokensReplacesEachPlaceholderByItsSource) {
  Tensor ids = Tensor::from_i32({7, -1, 0, -3, 12, -2, -3});
  const Tensor source = Tensor::from_i32({100, 101, 102});
  be->feed_tokens(ids, source);
  const int32_t* got = ids.data_as<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(got, got + ids.numel()), (std::vector<int32_t>{7, 100, 0, 102, 12, 101, 102}));
  Tensor bad = Tensor::from_i32({-4});
  EXPECT_THROW(be->feed_tokens(bad, source), Error);
}

// Speculative decoding's launch-ahead: each request's accepted drafts (leading drafts equal to
// the target's token of the row before) move its staged rows: positions and lengths by that
// many, slots recomputed through its block table (-1 kept, -1 past the table), and a catch-up's
// tokens become the last accepted token and the target's next one.
TEST_P(CpuOps, ShiftByAcceptedMovesStagedRowsByTheAcceptedDrafts) {
  AcceptedShift a;
  a.k = 3;
  a.num_requests = 3;
  // Request 0 accepts 2 drafts, request 1 none, request 2 all 3.
  a.inputs = Tensor::from_i32({10, 11, 12, 13, 20, 21, 22, 23, 30, 31, 32, 33});
  a.sampled = Tensor::from_i32({11, 12, 99, 5, 7, 8, 9, 10, 31, 32, 33, 40});
  a.block_size = 4;
  a.block_tables = Tensor::from_i32({5, 6, 7, 1, 2, 0, 3, 4, 8}).reshape({3, 3});
  // A catch-up: two entries a request, one length a request.
  a.positions = Tensor::from_i32({5, 6, 2, 3, 9, 10});
  a.slots = Tensor::from_i64({0, 0, 0, -1, 0, 0});
  a.tokens = Tensor::from_i32({0, -1, 0, -1, 0, -1});
  a.seq_lens = Tensor::from_i32({7, 4, 11});
  a.entries = 2;
  a.request_stride = 2;
  a.entry_stride = 1;
  a.seq_lens_request_stride = 1;
  be->shift_by_accepted(a);
  auto i32 = [](const Tensor& t) { return std::vector<int32_t>(t.data_as<int32_t>(), t.data_as<int32_t>() + t.numel()); };
  auto i64 = [](const Tensor& t) { return std::vector<int64_t>(t.data_as<int64_t>(), t.data_as<int64_t>() + t.numel()); };
  EXPECT_EQ(i32(a.positions), (std::vector<int32_t>{7, 8, 2, 3, 12, 13}));
  EXPECT_EQ(i64(a.slots), (std::vector<int64_t>{6 * 4 + 3, 7 * 4 + 0, 1 * 4 + 2, -1, -1, -1}));
  EXPECT_EQ(i32(a.tokens), (std::vector<int32_t>{12, 99, 20, 7, 33, 40}));
  EXPECT_EQ(i32(a.seq_lens), (std::vector<int32_t>{9, 4, 14}));
  // A chain of two steps over four rows (the last one padding, untouched), a length an entry.
  AcceptedShift c = a;
  c.tokens = Tensor();
  c.positions = Tensor::from_i32({1, 2, 3, 0, 2, 3, 4, 0});
  c.slots = Tensor::from_i64({0, 0, -1, -1, 0, 0, 0, -1});
  c.seq_lens = Tensor::from_i32({2, 3, 4, 1, 3, 4, 5, 1});
  c.entries = 2;
  c.request_stride = 1;
  c.entry_stride = 4;
  c.seq_lens_request_stride = 1;
  c.seq_lens_entry_stride = 4;
  be->shift_by_accepted(c);
  EXPECT_EQ(i32(c.positions), (std::vector<int32_t>{3, 2, 6, 0, 4, 3, 7, 0}));
  EXPECT_EQ(i64(c.slots), (std::vector<int64_t>{5 * 4 + 3, 1 * 4 + 2, -1, -1, 6 * 4 + 0, 1 * 4 + 3, 4 * 4 + 3, -1}));
  EXPECT_EQ(i32(c.seq_lens), (std::vector<int32_t>{4, 3, 7, 1, 5, 4, 8, 1}));
  // Row indices alone (a hidden-state catch-up's first-draft rows): no slots, lengths or tables.
  AcceptedShift r;
  r.inputs = a.inputs;
  r.sampled = a.sampled;
  r.num_requests = 3;
  r.k = 3;
  r.positions = Tensor::from_i32({0, 4, 8, 12});  // the fourth: padding, untouched
  r.entries = 1;
  r.request_stride = 1;
  be->shift_by_accepted(r);
  EXPECT_EQ(i32(r.positions), (std::vector<int32_t>{2, 4, 11, 12}));
}

TEST_P(CpuOps, LinearWithAndWithoutBias) {
  struct Case { int64_t m, n, k; };
  for (Case c : {Case{1, 7, 5}, Case{13, 96, 64}, Case{64, 130, 257}}) {
    Tensor x = random_tensor({c.m, c.k}, rng);
    Tensor w = random_tensor({c.n, c.k}, rng);
    Tensor b = random_tensor({c.n}, rng);
    Tensor out = be->empty({c.m, c.n}, DType::kF32);
    be->linear(x, w, nullptr, out);
    const double tol = 1e-6 * std::sqrt(double(c.k));
    expect_close(values(out), linear_ref(values(x), values(w), nullptr, c.m, c.n, c.k), tol, tol, "linear");
    auto bv = values(b);
    be->linear(x, w, &b, out);
    expect_close(values(out), linear_ref(values(x), values(w), &bv, c.m, c.n, c.k), tol, tol, "linear+bias");
  }
  // Leading dims of x are flattened: [2, 3, K] -> [6, N].
  Tensor x = random_tensor({2, 3, 8}, rng), w = random_tensor({5, 8}, rng);
  Tensor out = be->empty({6, 5}, DType::kF32);
  be->linear(x, w, nullptr, out);
  expect_close(values(out), linear_ref(values(x), values(w), nullptr, 6, 5, 8), 1e-6, 1e-6, "linear 3d");
  // Zero rows is a no-op, a K mismatch is an error.
  Tensor empty_x = be->empty({0, 8}, DType::kF32), empty_out = be->empty({0, 5}, DType::kF32);
  be->linear(empty_x, w, nullptr, empty_out);
  Tensor bad_w = random_tensor({5, 9}, rng);
  EXPECT_THROW(be->linear(x, bad_w, nullptr, out), Error);
}

// linear_fp8 is linear over the dequantised weight (the scale applied to the dot product: equal
// up to rounding); quantize_fp8_rows picks amax / 448 and the nearest e4m3 code.
TEST_P(CpuOps, LinearFp8IsLinearOverTheDequantisedWeight) {
  struct Case { int64_t m, n, k; };
  for (Case c : {Case{1, 7, 16}, Case{5, 96, 64}, Case{33, 200, 80}}) {
    Tensor x = random_tensor({c.m, c.k}, rng), w = random_tensor({c.n, c.k}, rng), b = random_tensor({c.n}, rng);
    for (float& v : std::span(w.data_as<float>(), static_cast<size_t>(w.numel()))) v *= 3.0f;
    Tensor codes = Tensor::empty({c.n, c.k}, DType::kF8E4M3), scale = be->empty({c.n}, DType::kF32);
    be->quantize_fp8_rows(w, codes, scale);
    Tensor dequantized = be->empty({c.n, c.k}, DType::kF32);
    for (int64_t r = 0; r < c.n; ++r) {
      float amax = 0;
      for (int64_t i = 0; i < c.k; ++i) amax = std::max(amax, std::fabs(w.data_as<float>()[r * c.k + i]));
      EXPECT_EQ(scale.data_as<float>()[r], amax / 448.0f);
      for (int64_t i = 0; i < c.k; ++i) {
        const float wv = w.data_as<float>()[r * c.k + i], s = amax / 448.0f;
        const uint8_t code = codes.data_as<uint8_t>()[r * c.k + i];
        EXPECT_EQ(code, f32_to_f8e4m3(wv / s));
        dequantized.data_as<float>()[r * c.k + i] = f8e4m3_to_f32(code) * s;
      }
    }
    for (const Tensor* bias : {static_cast<const Tensor*>(nullptr), static_cast<const Tensor*>(&b)}) {
      Tensor got = be->empty({c.m, c.n}, DType::kF32), want = be->empty({c.m, c.n}, DType::kF32);
      be->linear(x, LinearWeight{codes, scale}, bias, got);
      be->linear(x, dequantized, bias, want);
      const double tol = 1e-5 * std::sqrt(double(c.k));
      const std::vector<float> w32 = values(want);
      expect_close(values(got), std::vector<double>(w32.begin(), w32.end()), tol, tol, "linear_fp8");
    }
  }
  // An all-zero row gets scale 1 and zero codes.
  Tensor zero = Tensor::zeros({2, 16}, DType::kF32), codes = Tensor::empty({2, 16}, DType::kF8E4M3);
  Tensor scale = be->empty({2}, DType::kF32);
  be->quantize_fp8_rows(zero, codes, scale);
  EXPECT_EQ(values(scale), (std::vector<float>{1.0f, 1.0f}));
  // A scale per row it is not: an error.
  Tensor bad_scale = be->empty({3}, DType::kF32), out = be->empty({1, 2}, DType::kF32);
  EXPECT_THROW(be->linear_fp8(random_tensor({1, 16}, rng), codes, bad_scale, nullptr, out), Error);
}

INSTANTIATE_TEST_SUITE_P(Threads, CpuOps, ::testing::Values(1, 2));

}  // namespace
}  // namespace specula
