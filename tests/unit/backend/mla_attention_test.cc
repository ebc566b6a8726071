// The MLA form of the paged cache (cache.v undefined or empty): write_kv_cache stores only K, and
// paged_attention takes each key's value from the first Dv dims of its own K entry. Checked
// against dense causal multi-query attention in double over the same entries, for a batch that
// mixes decode, prefill, chunked prefill and verification rows, with shuffled blocks, noise in
// unused slots and padding rows.
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

struct Seq {
  int seq_len;
  int query_len;
};

struct MlaBatch {
  AttentionMetadata md;
  KVCacheLayer cache;
  std::vector<std::vector<float>> entries;  // per sequence, dense [seq_len, D]
  int64_t rows = 0;
};

// Entries of width d for every position, laid into shuffled blocks; the rest of the cache is noise.
MlaBatch make_mla_batch(const std::vector<Seq>& seqs, int64_t d, int block_size, int padding, std::mt19937& rng) {
  MlaBatch b;
  const int64_t n = static_cast<int64_t>(seqs.size());
  int64_t max_blocks = 1, total = 0;
  for (auto s : seqs) {
    max_blocks = std::max<int64_t>(max_blocks, (s.seq_len + block_size - 1) / block_size);
    total += (s.seq_len + block_size - 1) / block_size;
  }
  const int64_t num_blocks = total + 2;
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  b.cache.k = random_tensor({num_blocks, block_size, 1, d}, rng, 5.0f);
  std::vector<int32_t> tables(n * max_blocks, -1), qsl = {0}, lens;
  size_t next = 0;
  for (int64_t s = 0; s < n; ++s) {
    b.entries.push_back(random_floats(seqs[s].seq_len * d, rng));
    for (int j = 0; j < seqs[s].seq_len; ++j) {
      if (j % block_size == 0) tables[s * max_blocks + j / block_size] = ids[next++];
      const int64_t slot = int64_t{tables[s * max_blocks + j / block_size]} * block_size + j % block_size;
      std::copy_n(&b.entries[s][j * d], d, b.cache.k.data_as<float>() + slot * d);
    }
    qsl.push_back(qsl.back() + seqs[s].query_len);
    lens.push_back(seqs[s].seq_len);
  }
  b.rows = qsl.back();
  b.md.num_seqs = static_cast<int32_t>(n);
  b.md.num_tokens = static_cast<int32_t>(b.rows + padding);
  b.md.block_size = block_size;
  for (auto s : seqs) {
    b.md.max_query_len = std::max(b.md.max_query_len, s.query_len);
    b.md.max_seq_len = std::max(b.md.max_seq_len, s.seq_len);
  }
  b.md.query_start_loc = Tensor::from_i32(qsl);
  b.md.seq_lens = Tensor::from_i32(lens);
  b.md.block_tables = Tensor::from_i32(tables, {n, max_blocks});
  b.md.query_start_loc_host = qsl;
  b.md.seq_lens_host = lens;
  return b;
}

// softmax(q . entry * scale) @ entry[:dv], one kv head, in double.
std::vector<double> mla_reference(const MlaBatch& b, const std::vector<float>& q, int64_t hq, int64_t d, int64_t dv,
                                  double scale) {
  std::vector<double> out(b.rows * hq * dv);
  for (int32_t s = 0; s < b.md.num_seqs; ++s) {
    const int64_t q0 = b.md.query_start_loc_host[s], q1 = b.md.query_start_loc_host[s + 1];
    for (int64_t r = q0; r < q1; ++r) {
      const int64_t pos = b.md.seq_lens_host[s] - (q1 - q0) + (r - q0);
      for (int64_t h = 0; h < hq; ++h) {
        std::vector<double> p(pos + 1);
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= pos; ++j) {
          double dot = 0;
          for (int64_t i = 0; i < d; ++i) dot += double(q[(r * hq + h) * d + i]) * b.entries[s][j * d + i];
          mx = std::max(mx, p[j] = dot * scale);
        }
        for (auto& x : p) sum += (x = std::exp(x - mx));
        for (int64_t i = 0; i < dv; ++i) {
          double acc = 0;
          for (int64_t j = 0; j <= pos; ++j) acc += p[j] / sum * b.entries[s][j * d + i];
          out[(r * hq + h) * dv + i] = acc;
        }
      }
    }
  }
  return out;
}

const std::vector<Seq> kMixedBatch = {{1, 1}, {16, 16}, {37, 37}, {70, 1}, {45, 13}, {52, 4}};

TEST(MlaAttention, ValuesAreTheLatentPrefixOfEachKeyEntry) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(11);
  const int64_t latent = 32, rope = 8, d = latent + rope, hq = 5;
  for (bool empty_v : {false, true}) {
    MlaBatch b = make_mla_batch(kMixedBatch, d, 16, 2, rng);
    // The engine allocates V as [blocks, block_size, 1, 0]; a hand-built cache may leave it undefined.
    if (empty_v) b.cache.v = Tensor::empty({b.cache.k.size(0), 16, 1, 0}, DType::kF32);
    Tensor q = random_tensor({b.md.num_tokens, hq, d}, rng);
    Tensor out = Tensor::from_f32(std::vector<float>(b.md.num_tokens * hq * latent, 7.0f), {b.md.num_tokens, hq, latent});
    const float scale = 0.23f;
    be->paged_attention(q, b.cache, b.md, scale, out);
    std::vector<float> got = values(out);
    std::vector<float> real(got.begin(), got.begin() + b.rows * hq * latent);
    expect_close(real, mla_reference(b, values(q), hq, d, latent, scale), 2e-5, 2e-6, "mla attention");
    for (size_t i = b.rows * hq * latent; i < got.size(); ++i) ASSERT_EQ(got[i], 7.0f) << "padding row touched";
  }
}

TEST(MlaAttention, FullEntryAsValueMatchesOrdinaryAttentionWithVEqualK) {
  // Dv = D: the MLA form must equal the ordinary form with a V cache that is a copy of K.
  auto be = make_cpu_backend(2);
  std::mt19937 rng(12);
  const int64_t d = 24, hq = 3;
  MlaBatch b = make_mla_batch(kMixedBatch, d, 8, 0, rng);
  Tensor q = random_tensor({b.md.num_tokens, hq, d}, rng);
  Tensor mla_out = Tensor::empty({b.md.num_tokens, hq, d}, DType::kF32);
  be->paged_attention(q, b.cache, b.md, 0.3f, mla_out);
  KVCacheLayer copied{b.cache.k, Tensor::empty(b.cache.k.shape(), DType::kF32)};
  be->copy(b.cache.k, copied.v);
  Tensor ref_out = Tensor::empty({b.md.num_tokens, hq, d}, DType::kF32);
  be->paged_attention(q, copied, b.md, 0.3f, ref_out);
  EXPECT_EQ(values(mla_out), values(ref_out));
}

TEST(MlaAttention, WriteStoresOnlyKAndIgnoresV) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(13);
  const int64_t d = 12, blocks = 4, bs = 4;
  KVCacheLayer cache{Tensor::zeros({blocks, bs, 1, d}, DType::kF32), Tensor()};
  Tensor k = random_tensor({3, 1, d}, rng);
  Tensor slots = Tensor::from_i64({9, -1, 2});
  be->write_kv_cache(k, Tensor(), cache, slots);
  std::vector<float> c = values(cache.k), kv = values(k);
  for (int64_t i = 0; i < d; ++i) {
    EXPECT_EQ(c[9 * d + i], kv[i]);
    EXPECT_EQ(c[2 * d + i], kv[2 * d + i]);
  }
  int64_t nonzero = 0;
  for (float x : c) nonzero += x != 0.0f;
  EXPECT_EQ(nonzero, 2 * d);  // row 1 (slot -1) was skipped
  // An empty V tensor (the engine's allocation for v_head_dim = 0) is the same form.
  cache.v = Tensor::empty({blocks, bs, 1, 0}, DType::kF32);
  Tensor k2 = random_tensor({1, 1, d}, rng);
  be->write_kv_cache(k2, k2, cache, Tensor::from_i64({5}));
  EXPECT_EQ(values(cache.k)[5 * d + 3], values(k2)[3]);
}

TEST(MlaAttention, RejectsValueWiderThanTheEntry) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(14);
  MlaBatch b = make_mla_batch({{3, 3}}, 8, 4, 0, rng);
  Tensor q = random_tensor({3, 2, 8}, rng);
  Tensor out = Tensor::empty({3, 2, 9}, DType::kF32);
  EXPECT_THROW(be->paged_attention(q, b.cache, b.md, 1.0f, out), Error);
}

}  // namespace
}  // namespace specula
