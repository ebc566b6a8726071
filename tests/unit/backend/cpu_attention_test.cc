// CPU paged KV cache and paged attention against dense causal attention computed in double.
//
// Each batch mixes what one engine step holds: first-token decode, prefill of exactly one block,
// prefill with a tail block, decode deep into a sequence, a chunked-prefill chunk, and a
// speculative-verification slice (several query rows at the end of a long sequence), plus padding
// rows. Block ids are a random permutation, so sequences own non-contiguous blocks, and the cache
// is pre-filled with noise, so reading a wrong slot shows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/backend.h"
#include "cpu_test_util.h"

namespace specula {
namespace {

using testing::expect_close;
using testing::random_floats;
using testing::random_tensor;
using testing::values;

struct SeqSpec {
  int seq_len;
  int query_len;
};

struct PagedBatch {
  AttentionMetadata md;
  KVCacheLayer cache;
  std::vector<std::vector<float>> k, v;  // per sequence, dense [seq_len, hk, d] / [seq_len, hk, dv]
  int64_t rows = 0;                      // real query rows (padding follows)
};

// Lays the sequences' K/V into a paged cache through shuffled block tables.
PagedBatch make_batch(const std::vector<SeqSpec>& seqs, int64_t hk, int64_t d, int64_t dv, int block_size,
                      int padding_rows, std::mt19937& rng) {
  PagedBatch b;
  const int64_t n = static_cast<int64_t>(seqs.size());
  int64_t max_blocks = 0, total_blocks = 0;
  for (auto s : seqs) {
    int64_t blocks = (s.seq_len + block_size - 1) / block_size;
    max_blocks = std::max(max_blocks, blocks);
    total_blocks += blocks;
  }
  const int64_t num_blocks = total_blocks + 3;  // a few never-used blocks
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  b.cache.k = random_tensor({num_blocks, block_size, hk, d}, rng, 5.0f);  // noise everywhere first
  b.cache.v = random_tensor({num_blocks, block_size, hk, dv}, rng, 5.0f);
  std::vector<int32_t> tables(n * std::max<int64_t>(max_blocks, 1), -1);
  std::vector<int32_t> qsl = {0}, lens;
  size_t next = 0;
  for (int64_t s = 0; s < n; ++s) {
    const SeqSpec spec = seqs[s];
    b.k.push_back(random_floats(spec.seq_len * hk * d, rng));
    b.v.push_back(random_floats(spec.seq_len * hk * dv, rng));
    for (int j = 0; j < spec.seq_len; ++j) {
      if (j % block_size == 0) tables[s * max_blocks + j / block_size] = ids[next++];
      const int64_t slot = int64_t{tables[s * max_blocks + j / block_size]} * block_size + j % block_size;
      std::copy_n(&b.k[s][j * hk * d], hk * d, b.cache.k.data_as<float>() + slot * hk * d);
      std::copy_n(&b.v[s][j * hk * dv], hk * dv, b.cache.v.data_as<float>() + slot * hk * dv);
    }
    qsl.push_back(qsl.back() + spec.query_len);
    lens.push_back(spec.seq_len);
  }
  b.rows = qsl.back();
  b.md.num_seqs = static_cast<int32_t>(n);
  b.md.num_tokens = static_cast<int32_t>(b.rows + padding_rows);
  b.md.block_size = block_size;
  b.md.max_query_len = 0;
  b.md.max_seq_len = 0;
  for (auto s : seqs) {
    b.md.max_query_len = std::max(b.md.max_query_len, s.query_len);
    b.md.max_seq_len = std::max(b.md.max_seq_len, s.seq_len);
  }
  b.md.query_start_loc = Tensor::from_i32(qsl);
  b.md.seq_lens = Tensor::from_i32(lens);
  b.md.block_tables = Tensor::from_i32(tables, {n, std::max<int64_t>(max_blocks, 1)});
  b.md.query_start_loc_host = qsl;
  b.md.seq_lens_host = lens;
  return b;
}

// Dense causal attention in double for the real rows.
std::vector<double> attention_ref(const PagedBatch& b, const std::vector<float>& q, int64_t hq, int64_t hk, int64_t d,
                                  int64_t dv, double scale) {
  std::vector<double> out(b.rows * hq * dv);
  const int64_t group = hq / hk;
  for (int32_t s = 0; s < b.md.num_seqs; ++s) {
    const int64_t q0 = b.md.query_start_loc_host[s], q1 = b.md.query_start_loc_host[s + 1];
    const int64_t seq_len = b.md.seq_lens_host[s];
    for (int64_t r = q0; r < q1; ++r) {
      const int64_t pos = seq_len - (q1 - q0) + (r - q0);
      for (int64_t h = 0; h < hq; ++h) {
        const int64_t g = h / group;
        std::vector<double> sc(pos + 1);
        double mx = -1e300;
        for (int64_t j = 0; j <= pos; ++j) {
          double dot = 0;
          for (int64_t i = 0; i < d; ++i) dot += double(q[(r * hq + h) * d + i]) * b.k[s][(j * hk + g) * d + i];
          sc[j] = dot * scale;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (auto& x : sc) sum += (x = std::exp(x - mx));
        for (int64_t i = 0; i < dv; ++i) {
          double acc = 0;
          for (int64_t j = 0; j <= pos; ++j) acc += sc[j] / sum * b.v[s][(j * hk + g) * dv + i];
          out[(r * hq + h) * dv + i] = acc;
        }
      }
    }
  }
  return out;
}

struct AttnCase {
  int64_t hq, hk, d, dv;
  int block_size;
  int threads;
};
void PrintTo(const AttnCase& c, std::ostream* os) {
  *os << "hq=" << c.hq << " hk=" << c.hk << " d=" << c.d << " dv=" << c.dv << " block=" << c.block_size
      << " threads=" << c.threads;
}

class CpuPagedAttention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(CpuPagedAttention, MatchesDenseCausalAttention) {
  const AttnCase c = GetParam();
  auto be = make_cpu_backend(c.threads);
  std::mt19937 rng(static_cast<unsigned>(c.hq * 31 + c.hk * 7 + c.block_size));
  const std::vector<SeqSpec> seqs = {
      {1, 1},    // first decode step of a one-token prompt
      {16, 16},  // prefill of exactly one block
      {17, 17},  // prefill with a one-token tail block
      {40, 1},   // decode deep into a sequence
      {33, 9},   // a chunk of chunked prefill
      {21, 4},   // speculative verification: k + 1 rows at the end
  };
  const int padding = 3;
  PagedBatch b = make_batch(seqs, c.hk, c.d, c.dv, c.block_size, padding, rng);
  const int64_t t = b.md.num_tokens;
  // Large-ish q so that softmax is peaked and a wrong key shows.
  Tensor q = random_tensor({t, c.hq, c.d}, rng, 2.0f);
  Tensor out = be->empty({t, c.hq, c.dv}, DType::kF32);
  std::fill_n(out.data_as<float>(), out.numel(), 12345.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  be->paged_attention(q, b.cache, b.md, scale, out);

  auto got = values(out);
  std::vector<float> real(got.begin(), got.begin() + b.rows * c.hq * c.dv);
  expect_close(real, attention_ref(b, values(q), c.hq, c.hk, c.d, c.dv, scale), 1e-5, 1e-5, "attention");
  for (size_t i = real.size(); i < got.size(); ++i) ASSERT_EQ(got[i], 12345.0f) << "padding row touched at " << i;
}

INSTANTIATE_TEST_SUITE_P(
    GqaAndBlocks, CpuPagedAttention,
    ::testing::Values(AttnCase{4, 4, 16, 16, 16, 1},    // MHA
                      AttnCase{4, 2, 16, 16, 16, 2},    // GQA 2
                      AttnCase{8, 2, 32, 32, 16, 2},    // GQA 4
                      AttnCase{8, 2, 32, 32, 5, 2},     // odd block size, many tail blocks
                      AttnCase{4, 1, 24, 8, 16, 1}));  // Dv != D, one kv head

TEST(CpuPagedAttentionErrors, RejectsInconsistentMetadata) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(5);
  PagedBatch b = make_batch({{5, 5}, {9, 2}}, 2, 8, 8, 4, 0, rng);
  Tensor q = random_tensor({b.md.num_tokens, 4, 8}, rng);
  Tensor out = be->empty({b.md.num_tokens, 4, 8}, DType::kF32);
  AttentionMetadata bad = b.md;
  bad.seq_lens_host = {5, 1};  // fewer tokens than query rows
  EXPECT_THROW(be->paged_attention(q, b.cache, bad, 0.3f, out), Error);
  bad = b.md;
  bad.block_tables.data_as<int32_t>()[0] = 1000;  // block id outside the cache
  EXPECT_THROW(be->paged_attention(q, b.cache, bad, 0.3f, out), Error);
  bad.block_tables.data_as<int32_t>()[0] = 0;
  bad = b.md;
  bad.block_size = 16;
  EXPECT_THROW(be->paged_attention(q, b.cache, bad, 0.3f, out), Error);
  Tensor q3 = random_tensor({b.md.num_tokens, 3, 8}, rng);  // 3 query heads over 2 kv heads
  Tensor out3 = be->empty({b.md.num_tokens, 3, 8}, DType::kF32);
  EXPECT_THROW(be->paged_attention(q3, b.cache, b.md, 0.3f, out3), Error);
}

TEST(CpuKvCache, WritesRowsAtTheirSlotsAndSkipsMinusOne) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(9);
  const int64_t blocks = 6, bs = 4, hk = 2, d = 8;
  KVCacheLayer cache{random_tensor({blocks, bs, hk, d}, rng), random_tensor({blocks, bs, hk, d}, rng)};
  const auto k_before = values(cache.k), v_before = values(cache.v);
  const int64_t t = 7;
  Tensor k = random_tensor({t, hk, d}, rng), v = random_tensor({t, hk, d}, rng);
  std::vector<int64_t> slots = {5, 23, -1, 0, 12, -1, 13};
  be->write_kv_cache(k, v, cache, Tensor::from_i64(slots));
  auto kv = values(k), vv = values(v), ck = values(cache.k), cv = values(cache.v);
  std::vector<bool> written(blocks * bs, false);
  const int64_t row = hk * d;
  for (int64_t i = 0; i < t; ++i) {
    if (slots[i] < 0) continue;
    written[slots[i]] = true;
    for (int64_t e = 0; e < row; ++e) {
      ASSERT_EQ(ck[slots[i] * row + e], kv[i * row + e]);
      ASSERT_EQ(cv[slots[i] * row + e], vv[i * row + e]);
    }
  }
  for (int64_t s = 0; s < blocks * bs; ++s) {
    if (written[s]) continue;
    for (int64_t e = 0; e < row; ++e) {
      ASSERT_EQ(ck[s * row + e], k_before[s * row + e]) << "slot " << s << " was not to be written";
      ASSERT_EQ(cv[s * row + e], v_before[s * row + e]);
    }
  }
  EXPECT_THROW(be->write_kv_cache(k, v, cache, Tensor::from_i64({0, 1, 2, 3, 4, 5, 24})), Error);
}

// write_kv_cache then paged_attention, the order a model layer runs them in: prefill of two
// sequences, then one decode step each, must equal attention over the whole sequences at once.
TEST(CpuKvCache, PrefillThenDecodeThroughTheCache) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(21);
  const int64_t hq = 4, hk = 2, d = 16, bs = 4, blocks = 10;
  KVCacheLayer cache{be->empty({blocks, bs, hk, d}, DType::kF32), be->empty({blocks, bs, hk, d}, DType::kF32)};
  // Sequence 0 owns blocks 7, 2; sequence 1 owns blocks 4, 9, 0 (non-contiguous).
  const std::vector<int32_t> table = {7, 2, -1, 4, 9, 0};
  auto slot = [&](int s, int j) { return int64_t{table[s * 3 + j / bs]} * bs + j % bs; };
  const int len0 = 6, len1 = 9;  // final lengths, last token of each decoded
  Tensor q_all = random_tensor({len0 + len1, hq, d}, rng), k_all = random_tensor({len0 + len1, hk, d}, rng),
         v_all = random_tensor({len0 + len1, hk, d}, rng);
  auto run = [&](std::vector<int> rows_of_batch, std::vector<int32_t> qsl, std::vector<int32_t> lens,
                 std::vector<int64_t> slots) {
    const int64_t t = static_cast<int64_t>(rows_of_batch.size());
    Tensor idx = Tensor::from_i32(std::vector<int32_t>(rows_of_batch.begin(), rows_of_batch.end()));
    Tensor q = be->empty({t, hq, d}, DType::kF32), k = be->empty({t, hk, d}, DType::kF32),
           v = be->empty({t, hk, d}, DType::kF32), out = be->empty({t, hq, d}, DType::kF32);
    be->gather_rows(q_all, idx, q);
    be->gather_rows(k_all, idx, k);
    be->gather_rows(v_all, idx, v);
    AttentionMetadata md;
    md.num_seqs = 2;
    md.num_tokens = static_cast<int32_t>(t);
    md.block_size = bs;
    md.query_start_loc = Tensor::from_i32(qsl);
    md.seq_lens = Tensor::from_i32(lens);
    md.block_tables = Tensor::from_i32(table, {2, 3});
    md.slot_mapping = Tensor::from_i64(slots);
    md.query_start_loc_host = qsl;
    md.seq_lens_host = lens;
    be->write_kv_cache(k, v, cache, md.slot_mapping);
    be->paged_attention(q, cache, md, 0.25f, out);
    return values(out);
  };
  // Rows 0..5 are sequence 0, rows 6..14 sequence 1.
  std::vector<int> prefill_rows;
  std::vector<int64_t> prefill_slots;
  for (int j = 0; j < len0 - 1; ++j) prefill_rows.push_back(j), prefill_slots.push_back(slot(0, j));
  for (int j = 0; j < len1 - 1; ++j) prefill_rows.push_back(len0 + j), prefill_slots.push_back(slot(1, j));
  auto pre = run(prefill_rows, {0, len0 - 1, len0 + len1 - 2}, {len0 - 1, len1 - 1}, prefill_slots);
  auto dec = run({len0 - 1, len0 + len1 - 1}, {0, 1, 2}, {len0, len1}, {slot(0, len0 - 1), slot(1, len1 - 1)});

  // Reference: both whole sequences as one prefill into a fresh cache with the same tables.
  PagedBatch ref;
  ref.rows = len0 + len1;
  ref.md.num_seqs = 2;
  ref.md.query_start_loc_host = {0, len0, len0 + len1};
  ref.md.seq_lens_host = {len0, len1};
  auto kv = values(k_all), vv = values(v_all);
  ref.k = {std::vector<float>(kv.begin(), kv.begin() + len0 * hk * d), std::vector<float>(kv.begin() + len0 * hk * d, kv.end())};
  ref.v = {std::vector<float>(vv.begin(), vv.begin() + len0 * hk * d), std::vector<float>(vv.begin() + len0 * hk * d, vv.end())};
  auto want = attention_ref(ref, values(q_all), hq, hk, d, d, 0.25);
  const int64_t row = hq * d;
  std::vector<float> got(want.size());
  for (size_t i = 0; i < prefill_rows.size(); ++i)
    std::copy_n(&pre[i * row], row, &got[prefill_rows[i] * row]);
  std::copy_n(&dec[0], row, &got[(len0 - 1) * row]);
  std::copy_n(&dec[row], row, &got[(len0 + len1 - 1) * row]);
  expect_close(got, want, 1e-5, 1e-5, "prefill then decode");
}

// --kv-cache-dtype fp8: the cache holds e4m3(x / scale), each element rounded once (as the CUDA
// writers do), and attention reads x back as e4m3 * scale: exactly dense attention over the
// rounded K/V.
TEST(CpuKvCache, Fp8CacheHoldsTheRoundedRowsOverTheirScales) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(33);
  const int64_t blocks = 6, bs = 4, hk = 2, d = 8, row = hk * d;
  KVCacheLayer cache{be->empty({blocks, bs, hk, d}, DType::kF8E4M3), be->empty({blocks, bs, hk, d}, DType::kF8E4M3)};
  cache.k_scale = 0.5f;
  cache.v_scale = 4.0f;  // powers of two: x / scale is exact however it is computed
  std::fill_n(cache.k.data_as<uint8_t>(), cache.k.numel(), uint8_t{0x11});
  std::fill_n(cache.v.data_as<uint8_t>(), cache.v.numel(), uint8_t{0x11});
  const int64_t t = 5;
  Tensor k = random_tensor({t, hk, d}, rng, 200.0f), v = random_tensor({t, hk, d}, rng, 4.0f);  // k saturates
  const std::vector<int64_t> slots = {5, -1, 0, 23, 12};
  be->write_kv_cache(k, v, cache, Tensor::from_i64(slots));
  const auto kv = values(k), vv = values(v);
  const uint8_t* ck = cache.k.data_as<uint8_t>();
  const uint8_t* cv = cache.v.data_as<uint8_t>();
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t e = 0; e < row; ++e) {
      if (slots[i] < 0) continue;
      ASSERT_EQ(ck[slots[i] * row + e], f32_to_f8e4m3(kv[i * row + e] / 0.5f)) << "row " << i << " element " << e;
      ASSERT_EQ(cv[slots[i] * row + e], f32_to_f8e4m3(vv[i * row + e] / 4.0f)) << "row " << i << " element " << e;
    }
  }
  EXPECT_EQ(ck[1 * row], 0x11) << "an unwritten slot changed";
  cache.v_scale = 0.0f;
  EXPECT_THROW(be->write_kv_cache(k, v, cache, Tensor::from_i64(slots)), Error);
}

TEST(CpuPagedAttention, Fp8CacheIsAttentionOverTheRoundedRows) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(41);
  const int64_t hq = 8, hk = 2, d = 32, dv = 32;
  PagedBatch b = make_batch({{1, 1}, {17, 17}, {40, 1}, {21, 4}}, hk, d, dv, 16, 2, rng);
  // The same cache in fp8 (noise included), and the dense reference over what it holds.
  const float k_scale = 0.25f, v_scale = 2.0f;
  KVCacheLayer fp8{be->empty(b.cache.k.shape(), DType::kF8E4M3), be->empty(b.cache.v.shape(), DType::kF8E4M3),
                   k_scale, v_scale};
  auto quantise = [](const Tensor& from, Tensor& to, float scale) {
    const float* f = from.data_as<float>();
    uint8_t* q = to.data_as<uint8_t>();
    for (int64_t i = 0; i < from.numel(); ++i) q[i] = f32_to_f8e4m3(f[i] / scale);
  };
  quantise(b.cache.k, fp8.k, k_scale);
  quantise(b.cache.v, fp8.v, v_scale);
  for (auto [dense, scale] : {std::pair{&b.k, k_scale}, std::pair{&b.v, v_scale}}) {
    for (auto& seq : *dense) {
      for (float& x : seq) x = f8e4m3_to_f32(f32_to_f8e4m3(x / scale)) * scale;
    }
  }
  Tensor q = random_tensor({b.md.num_tokens, hq, d}, rng, 2.0f);
  Tensor out = be->empty({b.md.num_tokens, hq, dv}, DType::kF32);
  be->paged_attention(q, fp8, b.md, 0.2f, out);
  auto got = values(out);
  got.resize(static_cast<size_t>(b.rows * hq * dv));
  expect_close(got, attention_ref(b, values(q), hq, hk, d, dv, 0.2), 1e-5, 1e-5, "fp8 cache attention");
}

}  // namespace
}  // namespace specula
