// Row-wise ops on the GPU (bf16, and f32 where supported) against the CPU backend (fp32) on the
// same bf16-rounded inputs, over ragged shapes that take both the 16-byte vector path and the
// scalar tail path.
//
// Tolerances (|gpu - cpu| <= atol + rtol |cpu|): copies are exact. Elementwise ops compute in fp32
// and round once to bf16 (relative 2^-9 = 0.2%): rtol 8e-3. RMSNorm adds a reduction and, when
// fused, the rounding of the stored residual before normalising (as torch does in bf16): rtol
// 1.6e-2, atol 1e-2 on O(1) outputs. In fp32 the GPU must agree to 1e-5 relative.
#include <gtest/gtest.h>

#include <cmath>

#include "cuda_test_util.h"

namespace specula {
namespace {

using testing::expect_close;
using testing::expect_equal;
using testing::random_bf16_values;
using testing::to_gpu;
using testing::to_host;

class CudaRowwise : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    cpu_ = make_cpu_backend(2);
    gpu_ = make_cuda_backend(0);
  }
  // Tolerances for a dtype: bf16 per the header comment, f32 near-exact.
  static double rtol(DType dt, double bf16_rtol) { return dt == DType::kF32 ? 1e-5 : bf16_rtol; }
  static double atol(DType dt, double bf16_atol) { return dt == DType::kF32 ? 1e-5 : bf16_atol; }

  std::unique_ptr<Backend> cpu_, gpu_;
  std::mt19937 rng_{42};
};

TEST_F(CudaRowwise, EmbeddingCopiesRowsExactly) {
  for (int64_t h : {64, 36, 4096, 7}) {
    Tensor table = random_bf16_values({50, h}, rng_);
    Tensor ids = Tensor::from_i32({3, 0, 49, 3, 17, 17, 1});
    Tensor want = Tensor::zeros({7, h}, DType::kF32);
    cpu_->embedding(ids, table, want);
    Tensor out = gpu_->empty({7, h}, DType::kBF16);
    gpu_->embedding(to_gpu(*gpu_, ids), to_gpu(*gpu_, table), out);
    expect_equal(to_host(*gpu_, out), want.to_f32_vector(), "embedding H=" + std::to_string(h));
  }
}

TEST_F(CudaRowwise, EmbeddingOfAnOutOfRangeIdIsAZeroRow) {
  Tensor table = random_bf16_values({10, 64}, rng_);
  Tensor out = gpu_->empty({2, 64}, DType::kBF16);
  gpu_->embedding(to_gpu(*gpu_, Tensor::from_i32({-1, 10})), to_gpu(*gpu_, table), out);
  expect_equal(to_host(*gpu_, out), std::vector<float>(128, 0.0f), "invalid ids");
}

TEST_F(CudaRowwise, VocabParallelEmbeddingMatchesTheCpu) {
  Tensor table = random_bf16_values({20, 64}, rng_);
  Tensor ids = Tensor::from_i32({3, 12, 19, 10, 9, 0, 40});
  for (int64_t first : {0, 10}) {
    Tensor share = table.slice(first, first + 10);
    Tensor want = Tensor::zeros({7, 64}, DType::kF32);
    cpu_->vocab_parallel_embedding(ids, share, first, want);
    Tensor out = gpu_->empty({7, 64}, DType::kBF16);
    gpu_->vocab_parallel_embedding(to_gpu(*gpu_, ids), to_gpu(*gpu_, share), first, out);
    expect_equal(to_host(*gpu_, out), want.to_f32_vector(), "rows from " + std::to_string(first));
  }
}

TEST_F(CudaRowwise, GatherRowsOfEveryWidth) {
  Tensor idx = Tensor::from_i32({4, 4, 0, 2, 1});
  for (int64_t h : {64, 6, 3}) {  // 128 / 12 / 6 bytes per bf16 row: 16-byte, 4-byte, 2-byte units
    Tensor x = random_bf16_values({5, h}, rng_);
    Tensor want = Tensor::zeros({5, h}, DType::kF32);
    cpu_->gather_rows(x, idx, want);
    Tensor out = gpu_->empty({5, h}, DType::kBF16);
    gpu_->gather_rows(to_gpu(*gpu_, x), to_gpu(*gpu_, idx), out);
    expect_equal(to_host(*gpu_, out), want.to_f32_vector(), "gather_rows H=" + std::to_string(h));
  }
  // Integer rows (I32 [5, 3] = 12 bytes a row).
  std::vector<int32_t> vals(15);
  for (int i = 0; i < 15; ++i) vals[i] = 1000 + i;
  Tensor xi = Tensor::from_i32(vals, {5, 3});
  Tensor oi = gpu_->empty({5, 3}, DType::kI32);
  gpu_->gather_rows(to_gpu(*gpu_, xi), to_gpu(*gpu_, idx), oi);
  Tensor back = Tensor::empty({5, 3}, DType::kI32);
  gpu_->copy(oi, back);
  EXPECT_EQ(back.to_i32_vector(), (std::vector<int32_t>{1012, 1013, 1014, 1012, 1013, 1014, 1000, 1001, 1002, 1006,
                                                        1007, 1008, 1003, 1004, 1005}));
}

// Async scheduling's draft feed: the device replaces exactly what the host does (placeholders
// -(1 + i) by source[i], other ids untouched), over more ids than one block covers; an index past
// the source gives 0 on the device.
TEST_F(CudaRowwise, FeedTokensIsTheHostsFeed) {
  std::vector<int32_t> ids(1000), source(37);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<int32_t>(5000 + i);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = i % 3 == 0 ? -static_cast<int32_t>(1 + (i * 7) % source.size()) : static_cast<int32_t>(i);
  Tensor want = Tensor::from_i32(ids);
  cpu_->feed_tokens(want, Tensor::from_i32(source));
  Tensor got = to_gpu(*gpu_, Tensor::from_i32(ids));
  gpu_->feed_tokens(got, to_gpu(*gpu_, Tensor::from_i32(source)));
  expect_equal(to_host(*gpu_, got), want.to_f32_vector(), "feed_tokens");
  Tensor past = to_gpu(*gpu_, Tensor::from_i32({-38, 3}));
  gpu_->feed_tokens(past, to_gpu(*gpu_, Tensor::from_i32(source)));
  expect_equal(to_host(*gpu_, past), {0.0f, 3.0f}, "feed_tokens past the source");
}

// Speculative decoding's launch-ahead: the device moves staged rows exactly as the host does,
// over more requests than one block of threads, every accepted count 0..k, slots kept at -1 and
// run past the block table, in a catch-up's layout (tokens written), a chain's, and row indices alone.
TEST_F(CudaRowwise, ShiftByAcceptedIsTheHostsShift) {
  const int n = 150, k = 5, width = 6, bs = 16, steps = 4, padded = 160;
  std::uniform_int_distribution<int> token(0, 999), block(0, 500), pos(0, width * bs - 1);
  std::vector<int32_t> inputs, sampled, tables;
  for (int i = 0; i < n; ++i) {
    const int accept = i % (k + 1);
    std::vector<int32_t> in(k + 1), out(k + 1);
    for (int j = 0; j <= k; ++j) in[j] = token(rng_);
    for (int j = 0; j <= k; ++j) out[j] = j < accept ? in[j + 1] : 1000 + j;  // rejected: never a draft
    inputs.insert(inputs.end(), in.begin(), in.end());
    sampled.insert(sampled.end(), out.begin(), out.end());
    for (int b = 0; b < width; ++b) tables.push_back(block(rng_));
  }
  for (const bool chain : {false, true}) {
    SCOPED_TRACE(chain ? "chain" : "catch-up");
    const int entries = chain ? steps : 2, rows = chain ? steps * padded : 2 * n;
    std::vector<int32_t> positions(rows), lens(chain ? rows : n), tokens(rows, -1);
    std::vector<int64_t> slots(rows);
    for (int r = 0; r < rows; ++r) {
      positions[r] = pos(rng_);
      slots[r] = r % 7 == 3 ? -1 : 0;
    }
    for (int32_t& l : lens) l = pos(rng_) + 1;
    AcceptedShift want;
    want.k = k;
    want.num_requests = n;
    want.inputs = Tensor::from_i32(inputs);
    want.sampled = Tensor::from_i32(sampled);
    want.block_tables = Tensor::from_i32(tables).reshape({n, width});
    want.block_size = bs;
    want.positions = Tensor::from_i32(positions);
    want.slots = Tensor::from_i64(slots);
    want.seq_lens = Tensor::from_i32(lens);
    want.entries = entries;
    want.request_stride = chain ? 1 : 2;
    want.entry_stride = chain ? padded : 1;
    want.seq_lens_request_stride = 1;
    want.seq_lens_entry_stride = chain ? padded : 0;
    if (!chain) want.tokens = Tensor::from_i32(tokens);
    AcceptedShift got = want;
    for (Tensor* t : {&got.inputs, &got.sampled, &got.block_tables, &got.positions, &got.slots, &got.seq_lens})
      *t = to_gpu(*gpu_, *t);
    if (!chain) got.tokens = to_gpu(*gpu_, want.tokens);
    cpu_->shift_by_accepted(want);
    gpu_->shift_by_accepted(got);
    expect_equal(to_host(*gpu_, got.positions), want.positions.to_f32_vector(), "positions");
    Tensor got_slots = Tensor::empty(got.slots.shape(), DType::kI64);
    gpu_->copy(got.slots, got_slots);
    gpu_->synchronize();
    EXPECT_EQ(std::vector<int64_t>(got_slots.data_as<int64_t>(), got_slots.data_as<int64_t>() + got_slots.numel()),
              std::vector<int64_t>(want.slots.data_as<int64_t>(), want.slots.data_as<int64_t>() + want.slots.numel()));
    expect_equal(to_host(*gpu_, got.seq_lens), want.seq_lens.to_f32_vector(), "seq_lens");
    if (!chain) expect_equal(to_host(*gpu_, got.tokens), want.tokens.to_f32_vector(), "tokens");
  }
  // Row indices alone (a hidden-state catch-up's rows): no slots, lengths or block tables.
  AcceptedShift want;
  want.k = k;
  want.num_requests = n;
  want.inputs = Tensor::from_i32(inputs);
  want.sampled = Tensor::from_i32(sampled);
  std::vector<int32_t> rows(n);
  for (int i = 0; i < n; ++i) rows[i] = i * (k + 1);
  want.positions = Tensor::from_i32(rows);
  want.entries = 1;
  want.request_stride = 1;
  AcceptedShift got = want;
  for (Tensor* t : {&got.inputs, &got.sampled, &got.positions}) *t = to_gpu(*gpu_, *t);
  cpu_->shift_by_accepted(want);
  gpu_->shift_by_accepted(got);
  expect_equal(to_host(*gpu_, got.positions), want.positions.to_f32_vector(), "row indices");
}

// The greedy draft chain's argmax: exactly the host's first argmax, with repeated maxima (ties
// go to the lower index), rows of -inf, a row list with repeats, and vocabularies from one
// element to Llama-3's 128k (several strided passes per thread).
TEST_F(CudaRowwise, ArgmaxRowsIsTheHostsFirstArgmax) {
  for (int64_t vocab : {1, 7, 300, 8192, 128256}) {
    const int64_t rows = 6;
    std::vector<float> v = testing::random_floats(static_cast<size_t>(rows * vocab), rng_);
    // Row 1: its maximum three times (the first must win); row 2: all -inf; row 3: -inf but one.
    std::fill(v.begin() + vocab, v.begin() + 2 * vocab, 0.5f);
    v[static_cast<size_t>(vocab + vocab / 2)] = 3.0f;
    v[static_cast<size_t>(vocab + vocab - 1)] = 3.0f;
    v[static_cast<size_t>(vocab + vocab / 3)] = 3.0f;
    std::fill(v.begin() + 2 * vocab, v.begin() + 4 * vocab, -INFINITY);
    v[static_cast<size_t>(3 * vocab + vocab - 1)] = -1e30f;
    const Tensor x = Tensor::from_f32(v, {rows, vocab});
    const Tensor x_gpu = to_gpu(*gpu_, x, DType::kF32);
    for (const std::vector<int32_t>& list : {std::vector<int32_t>{5, 1, 1, 2, 3, 0}, std::vector<int32_t>{}}) {
      const bool all = list.empty();
      const int64_t n = all ? rows : static_cast<int64_t>(list.size());
      Tensor want = Tensor::empty({n}, DType::kI32);
      Tensor got = gpu_->empty({n}, DType::kI32);
      if (all) {
        cpu_->argmax_rows(x, nullptr, want);
        gpu_->argmax_rows(x_gpu, nullptr, got);
      } else {
        const Tensor idx = Tensor::from_i32(list);
        const Tensor idx_gpu = to_gpu(*gpu_, idx);
        cpu_->argmax_rows(x, &idx, want);
        gpu_->argmax_rows(x_gpu, &idx_gpu, got);
      }
      expect_equal(to_host(*gpu_, got), want.to_f32_vector(), "argmax V=" + std::to_string(vocab));
      if (!all && vocab > 1) {
        const std::vector<float> w = want.to_f32_vector();
        EXPECT_EQ(w[1], static_cast<float>(vocab / 3 < vocab / 2 ? vocab / 3 : vocab / 2)) << "first of the tied maxima";
        EXPECT_EQ(w[3], 0.0f) << "a row of -inf gives 0";
        EXPECT_EQ(w[4], static_cast<float>(vocab - 1)) << "the one finite value";
      }
    }
  }
}

TEST_F(CudaRowwise, RmsNormMatchesCpu) {
  for (DType dt : {DType::kBF16, DType::kF32}) {
    for (auto [rows, h] : {std::pair<int64_t, int64_t>{1, 64}, {7, 100}, {33, 4096}, {3, 5120}, {2, 12}}) {
      Tensor x = random_bf16_values({rows, h}, rng_, 3.0f);
      Tensor w = random_bf16_values({h}, rng_, 1.5f);
      Tensor want = Tensor::zeros({rows, h}, DType::kF32);
      cpu_->rms_norm(x, w, 1e-6f, want);
      Tensor xg = to_gpu(*gpu_, x, dt), out = gpu_->empty({rows, h}, dt);
      gpu_->rms_norm(xg, to_gpu(*gpu_, w, dt), 1e-6f, out);
      const std::string what = fmt::format("rms_norm {} [{}, {}]", dtype_name(dt), rows, h);
      expect_close(to_host(*gpu_, out), want.to_f32_vector(), rtol(dt, 1.6e-2), atol(dt, 1e-2), what);
      gpu_->rms_norm(xg, to_gpu(*gpu_, w, dt), 1e-6f, xg);  // in place
      expect_close(to_host(*gpu_, xg), want.to_f32_vector(), rtol(dt, 1.6e-2), atol(dt, 1e-2), what + " in place");
    }
  }
}

TEST_F(CudaRowwise, AddRmsNormMatchesCpu) {
  for (DType dt : {DType::kBF16, DType::kF32}) {
    for (auto [rows, h] : {std::pair<int64_t, int64_t>{1, 64}, {5, 100}, {17, 4096}, {2, 12}}) {
      Tensor x = random_bf16_values({rows, h}, rng_, 2.0f);
      Tensor r = random_bf16_values({rows, h}, rng_, 2.0f);
      Tensor w = random_bf16_values({h}, rng_, 1.5f);
      Tensor xg = to_gpu(*gpu_, x, dt), rg = to_gpu(*gpu_, r, dt);
      cpu_->add_rms_norm(x, r, w, 1e-5f);
      gpu_->add_rms_norm(xg, rg, to_gpu(*gpu_, w, dt), 1e-5f);
      const std::string what = fmt::format("add_rms_norm {} [{}, {}]", dtype_name(dt), rows, h);
      expect_close(to_host(*gpu_, rg), r.to_f32_vector(), rtol(dt, 8e-3), atol(dt, 1e-6), what + " residual");
      expect_close(to_host(*gpu_, xg), x.to_f32_vector(), rtol(dt, 1.6e-2), atol(dt, 1e-2), what + " x");
    }
  }
}

// The one-kernel EAGLE-3 layer input against its ops run one by one on the same GPU (the base
// class's form): bit for bit, with ids outside the table (zero rows), both residual forms, the
// head sizes of the embedded model and of Llama-3.1-8B's head, and a width the kernel leaves to
// the ops (8192).
TEST_F(CudaRowwise, Eagle3LayerInputIsItsOpsBitForBit) {
  for (auto [rows, h] : {std::pair<int64_t, int64_t>{1, 256}, {8, 256}, {130, 256}, {5, 4096}, {3, 2048},
                         {2, 40}, {2, 8192}}) {
    const int64_t vocab = 300;
    Tensor table = to_gpu(*gpu_, random_bf16_values({vocab, h}, rng_, 2.0f));
    Tensor input_norm = to_gpu(*gpu_, random_bf16_values({h}, rng_, 1.5f));
    Tensor hidden_norm = to_gpu(*gpu_, random_bf16_values({h}, rng_, 1.5f));
    Tensor g = to_gpu(*gpu_, random_bf16_values({rows, h}, rng_, 3.0f));
    std::vector<int32_t> ids(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 37 + 5) % vocab);
    ids[0] = rows > 1 ? -1 : 7;
    ids.back() = rows > 1 ? static_cast<int32_t>(vocab) : ids.back();
    Tensor token_ids = to_gpu(*gpu_, Tensor::from_i32(ids));
    for (bool norm_before_residual : {false, true}) {
      Backend::Eagle3LayerInput p;
      p.embed_tokens = &table;
      p.input_norm = &input_norm;
      p.hidden_norm = &hidden_norm;
      p.eps = 1e-5f;
      p.norm_before_residual = norm_before_residual;
      Tensor x = gpu_->empty({rows, 2 * h}, DType::kBF16), residual = gpu_->empty({rows, h}, DType::kBF16);
      Tensor want_x = gpu_->empty({rows, 2 * h}, DType::kBF16), want_residual = gpu_->empty({rows, h}, DType::kBF16);
      gpu_->eagle3_layer_input(token_ids, g, p, x, residual);
      gpu_->Backend::eagle3_layer_input(token_ids, g, p, want_x, want_residual);
      const std::string what =
          fmt::format("eagle3_layer_input [{}, {}]{}", rows, h, norm_before_residual ? " norm before residual" : "");
      expect_equal(to_host(*gpu_, x), to_host(*gpu_, want_x), what + " x");
      expect_equal(to_host(*gpu_, residual), to_host(*gpu_, want_residual), what + " residual");
    }
  }
}

TEST_F(CudaRowwise, SiluMulMatchesCpu) {
  for (DType dt : {DType::kBF16, DType::kF32}) {
    for (auto [rows, inter] : {std::pair<int64_t, int64_t>{5, 8}, {3, 100}, {9, 1376}, {1, 14336}}) {
      Tensor gu = random_bf16_values({rows, 2 * inter}, rng_, 4.0f);
      Tensor want = Tensor::zeros({rows, inter}, DType::kF32);
      cpu_->silu_mul(gu, want);
      Tensor out = gpu_->empty({rows, inter}, dt);
      gpu_->silu_mul(to_gpu(*gpu_, gu, dt), out);
      expect_close(to_host(*gpu_, out), want.to_f32_vector(), rtol(dt, 8e-3), atol(dt, 1e-3),
                   fmt::format("silu_mul {} [{}, {}]", dtype_name(dt), rows, inter));
    }
  }
}

TEST_F(CudaRowwise, AddMatchesCpu) {
  for (DType dt : {DType::kBF16, DType::kF32}) {
    for (int64_t n : {1, 1000, 1003, 65536 + 5}) {
      Tensor a = random_bf16_values({n}, rng_), b = random_bf16_values({n}, rng_);
      Tensor want = Tensor::zeros({n}, DType::kF32);
      cpu_->add(a, b, want);
      Tensor out = gpu_->empty({n}, dt);
      gpu_->add(to_gpu(*gpu_, a, dt), to_gpu(*gpu_, b, dt), out);
      expect_close(to_host(*gpu_, out), want.to_f32_vector(), rtol(dt, 8e-3), atol(dt, 1e-6),
                   fmt::format("add {} [{}]", dtype_name(dt), n));
    }
  }
}

// A real rotary table: row p holds cos(p f_i) then sin(p f_i).
Tensor rope_table(int64_t max_pos, int rotary_dim, double theta) {
  std::vector<float> v(static_cast<size_t>(max_pos * rotary_dim));
  const int half = rotary_dim / 2;
  for (int64_t p = 0; p < max_pos; ++p) {
    for (int i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * std::pow(theta, -2.0 * i / rotary_dim);
      v[p * rotary_dim + i] = static_cast<float>(std::cos(angle));
      v[p * rotary_dim + half + i] = static_cast<float>(std::sin(angle));
    }
  }
  return Tensor::from_f32(v, {max_pos, rotary_dim});
}

TEST_F(CudaRowwise, RopeMatchesCpu) {
  struct Case {
    int64_t t, hq, hk, d;
    int rot;
    bool neox;
  };
  for (DType dt : {DType::kBF16, DType::kF32}) {
    for (Case c : {Case{5, 8, 2, 128, 128, true}, {9, 4, 4, 64, 64, false}, {3, 4, 1, 64, 32, true},
                   {6, 2, 2, 192, 64, false}, {1, 32, 8, 128, 128, true}, {4, 4, 2, 16, 16, true}}) {
      const int64_t max_pos = 4096;
      Tensor table = rope_table(max_pos, c.rot, 10000.0);
      std::vector<int32_t> pos;
      for (int64_t i = 0; i < c.t; ++i) pos.push_back(static_cast<int32_t>(rng_() % max_pos));
      Tensor positions = Tensor::from_i32(pos);
      Tensor q = random_bf16_values({c.t, c.hq, c.d}, rng_), k = random_bf16_values({c.t, c.hk, c.d}, rng_);
      Tensor qg = to_gpu(*gpu_, q, dt), kg = to_gpu(*gpu_, k, dt);
      cpu_->rope(q, k, positions, table, c.rot, c.neox);
      gpu_->rope(qg, kg, to_gpu(*gpu_, positions), to_gpu(*gpu_, table, DType::kF32), c.rot, c.neox);
      const std::string what = fmt::format("rope {} t{} hq{} hk{} d{} rot{} {}", dtype_name(dt), c.t, c.hq, c.hk, c.d,
                                           c.rot, c.neox ? "neox" : "interleaved");
      expect_close(to_host(*gpu_, qg), q.to_f32_vector(), rtol(dt, 1e-2), atol(dt, 1e-2), what + " q");
      expect_close(to_host(*gpu_, kg), k.to_f32_vector(), rtol(dt, 1e-2), atol(dt, 1e-2), what + " k");
    }
  }
}

}  // namespace
}  // namespace specula
