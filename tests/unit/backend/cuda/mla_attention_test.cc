// Paged attention in the MLA form (no separate V: the value of a key is the first Dv dims of its K
// entry) on the GPU against the CPU backend: DeepSeek's real dims (D = 576 = 512 + 64, Dv = 512)
// with V2-Lite's 16 and V3's 128 query heads on one latent head, and small dims (the fixtures'
// 24/16, specula-tiny-moe's 48/32, D not a multiple of 16, Dv = D, Dv = 8); decode (split-KV with
// merge, empty splits), verification, prefill, chunked prefill, mixed batches; block sizes
// 1/5/16/32; shuffled block ids; NaN in every cache slot no sequence owns (reading past a
// sequence's keys turns the output NaN); padding rows of q left untouched; a GQA ratio with two
// latent heads. The cache's V is undefined in some cases and an empty tensor in others (both mean
// the MLA form). Also write_kv_cache in the MLA form (K only).
//
// Tolerance, as in cuda_attention_test.cc: |gpu - cpu| <= 1e-2 + 1e-2 |cpu| (P rounded to bf16
// for P.V on the tensor cores, output rounded to bf16; values |v| <= 1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cuda_test_util.h"

namespace specula {
namespace {

using testing::expect_close;
using testing::expect_equal;
using testing::random_bf16_values;
using testing::to_gpu;
using testing::to_host;

struct MlaCase {
  std::string name;
  int hq, hk, d, dv, block_size;
  std::vector<int> q_lens, seq_lens;
  int padding_rows = 2;
  bool empty_v = false;  // cache.v an empty (0-element) tensor instead of undefined
};

constexpr float kSentinel = 3.0f;

void run_case(const MlaCase& c, Backend& cpu, Backend& gpu, unsigned seed) {
  std::mt19937 rng(seed);
  const int num_seqs = static_cast<int>(c.q_lens.size());
  ASSERT_EQ(c.seq_lens.size(), c.q_lens.size());
  const int bs = c.block_size;

  int needed = 0, max_blocks = 1;
  for (int len : c.seq_lens) {
    needed += (len + bs - 1) / bs;
    max_blocks = std::max(max_blocks, (len + bs - 1) / bs + 1);
  }
  const int num_blocks = needed + 3;
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> tables(static_cast<size_t>(num_seqs) * max_blocks, -1);
  int next = 0;
  for (int s = 0; s < num_seqs; ++s) {
    for (int b = 0; b < (c.seq_lens[s] + bs - 1) / bs; ++b) tables[s * max_blocks + b] = ids[next++];
  }

  // The latent cache: NaN everywhere, random entries in each sequence's first seq_len slots.
  const Shape k_shape{num_blocks, bs, c.hk, c.d};
  std::vector<float> kc(static_cast<size_t>(testing::numel_of(k_shape)), NAN);
  std::vector<float> kr = testing::random_floats(kc.size(), rng);
  for (int s = 0; s < num_seqs; ++s) {
    for (int j = 0; j < c.seq_lens[s]; ++j) {
      const int64_t slot = int64_t{tables[s * max_blocks + j / bs]} * bs + j % bs;
      for (int64_t i = slot * c.hk * c.d; i < (slot + 1) * c.hk * c.d; ++i) kc[i] = bf16_to_f32(f32_to_bf16(kr[i]));
    }
  }
  Tensor no_v_cpu = c.empty_v ? Tensor::zeros({num_blocks, bs, c.hk, 0}, DType::kF32) : Tensor();
  KVCacheLayer cache_cpu{Tensor::from_f32(kc, k_shape), no_v_cpu};

  std::vector<int32_t> qsl = {0};
  for (int s = 0; s < num_seqs; ++s) qsl.push_back(qsl.back() + c.q_lens[s]);
  const int rows = qsl.back(), t = rows + c.padding_rows;
  Tensor q = random_bf16_values({t, c.hq, c.d}, rng, 1.5f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));

  AttentionMetadata md_cpu;
  md_cpu.num_seqs = num_seqs;
  md_cpu.num_tokens = t;
  md_cpu.max_query_len = num_seqs ? *std::max_element(c.q_lens.begin(), c.q_lens.end()) : 0;
  md_cpu.max_seq_len = num_seqs ? *std::max_element(c.seq_lens.begin(), c.seq_lens.end()) : 0;
  md_cpu.block_size = bs;
  md_cpu.query_start_loc = Tensor::from_i32(qsl);
  md_cpu.seq_lens = Tensor::from_i32(std::vector<int32_t>(c.seq_lens.begin(), c.seq_lens.end()));
  md_cpu.block_tables = Tensor::from_i32(tables, {num_seqs, max_blocks});
  md_cpu.query_start_loc_host = qsl;
  md_cpu.seq_lens_host.assign(c.seq_lens.begin(), c.seq_lens.end());
  Tensor out_cpu = Tensor::zeros({t, c.hq, c.dv}, DType::kF32);
  cpu.paged_attention(q, cache_cpu, md_cpu, scale, out_cpu);

  AttentionMetadata md_gpu = md_cpu;
  md_gpu.query_start_loc = to_gpu(gpu, md_cpu.query_start_loc);
  md_gpu.seq_lens = to_gpu(gpu, md_cpu.seq_lens.numel() ? md_cpu.seq_lens : Tensor::from_i32({0}));
  md_gpu.block_tables = to_gpu(gpu, md_cpu.block_tables);
  Tensor no_v_gpu = c.empty_v ? gpu.empty({num_blocks, bs, c.hk, 0}, DType::kBF16) : Tensor();
  KVCacheLayer cache_gpu{to_gpu(gpu, cache_cpu.k), no_v_gpu};
  Tensor q_gpu = to_gpu(gpu, q);
  std::vector<float> sentinel(static_cast<size_t>(t) * c.hq * c.dv, kSentinel);
  Tensor out_gpu = to_gpu(gpu, Tensor::from_f32(sentinel, {t, c.hq, c.dv}));
  gpu.reset_scratch();
  gpu.paged_attention(q_gpu, cache_gpu, md_gpu, scale, out_gpu);
  std::vector<float> got = to_host(gpu, out_gpu);

  const size_t valid = static_cast<size_t>(rows) * c.hq * c.dv;
  std::vector<float> want = out_cpu.to_f32_vector();
  expect_close(std::vector<float>(got.begin(), got.begin() + valid), std::vector<float>(want.begin(), want.begin() + valid),
               1e-2, 1e-2, c.name + " out");
  expect_equal(std::vector<float>(got.begin() + valid, got.end()), std::vector<float>(sentinel.begin() + valid, sentinel.end()),
               c.name + " padding rows");
}

class CudaMlaAttention : public ::testing::TestWithParam<MlaCase> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    cpu_ = make_cpu_backend(2);
    gpu_ = make_cuda_backend(0);
  }
  std::unique_ptr<Backend> cpu_, gpu_;
};

TEST_P(CudaMlaAttention, MatchesCpu) { run_case(GetParam(), *cpu_, *gpu_, 4321); }

std::vector<int> ones(size_t n) { return std::vector<int>(n, 1); }

std::vector<MlaCase> decode_cases() {
  const std::vector<int> lens = {1, 2, 15, 16, 17, 33, 100, 257};
  std::vector<MlaCase> cases = {
      // V2-Lite: 16 heads on one 576-dim latent, Dv 512.
      {"decode_v2lite", 16, 1, 576, 512, 16, ones(lens.size()), lens},
      // Long sequences: many splits, the merge, and a short sequence whose later splits are empty.
      {"decode_v2lite_long_splits", 16, 1, 576, 512, 16, {1, 1, 1}, {3000, 7, 1500}},
      // V3: 128 heads = two 64-row tiles per token.
      {"decode_v3_heads", 128, 1, 576, 512, 16, {1, 1, 1}, {5, 300, 700}, 1, true},
      {"decode_v2lite_batch32", 16, 1, 576, 512, 16, ones(32), [] {
         std::vector<int> l;
         for (int i = 0; i < 32; ++i) l.push_back(1 + (i * 53) % 400);
         return l;
       }()},
      {"decode_fixture_dims", 4, 1, 24, 16, 16, ones(lens.size()), lens},
      {"decode_tiny_moe_dims", 4, 1, 48, 32, 16, ones(lens.size()), lens, 2, true},
      {"decode_block1", 16, 1, 576, 512, 1, {1, 1}, {9, 130}},
      {"decode_block5", 16, 1, 576, 512, 5, {1, 1, 1}, {4, 5, 611}},
      {"decode_block32", 16, 1, 576, 512, 32, {1, 1, 1}, {31, 32, 700}},
      {"decode_two_latent_heads", 8, 2, 64, 32, 16, {1, 1, 1}, {3, 90, 400}},
      // Verification: a few rows per sequence, each with its own causal limit.
      {"verify_v2lite", 16, 1, 576, 512, 16, {4, 2, 8, 1, 0}, {4, 19, 300, 1000, 7}},
      {"verify_v3_heads", 128, 1, 576, 512, 16, {3, 2}, {40, 900}},
      {"verify_fixture_dims", 4, 1, 24, 16, 16, {5, 1, 3}, {90, 400, 3}},
  };
  // Head dims: not multiples of 16 (a zero-padded last mma step), Dv = D, Dv = 8, widest.
  for (auto [d, dv] : {std::pair{40, 24}, {64, 64}, {72, 8}, {136, 128}, {264, 256}, {328, 256}, {520, 512},
                       {576, 512}, {576, 8}, {512, 512}}) {
    cases.push_back({"decode_d" + std::to_string(d) + "_dv" + std::to_string(dv), 16, 1, d, dv, 16, {1, 1, 1},
                     {5, 70, 300}});
  }
  return cases;
}

std::vector<MlaCase> prefill_cases() {
  std::vector<MlaCase> cases = {
      {"prefill_v2lite", 16, 1, 576, 512, 16, {7, 33, 64, 65, 130}, {7, 33, 64, 65, 130}},
      {"prefill_v3_heads", 128, 1, 576, 512, 16, {9, 40}, {9, 40}, 2, true},
      {"prefill_long", 16, 1, 576, 512, 16, {600}, {600}},
      {"chunked_prefill", 16, 1, 576, 512, 16, {20, 64, 1, 5}, {100, 141, 50, 5}},
      {"verification_9_rows", 16, 1, 576, 512, 16, {9, 9, 9}, {9, 64, 300}},
      {"mixed_prefill_decode", 16, 1, 576, 512, 16, {1, 37, 1, 1, 128, 0}, {90, 37, 1, 513, 200, 17}},
      {"mixed_block1", 16, 1, 576, 512, 1, {1, 12}, {30, 20}},
      {"mixed_block5", 16, 1, 576, 512, 5, {1, 12, 3}, {30, 20, 3}},
      {"mixed_block32", 16, 1, 576, 512, 32, {1, 50, 9}, {70, 50, 77}},
      {"prefill_fixture_dims", 4, 1, 24, 16, 16, {3, 70, 16}, {40, 70, 16}},
      {"prefill_tiny_moe_dims", 4, 1, 48, 32, 16, {3, 70}, {40, 70}, 2, true},
      {"prefill_two_latent_heads", 8, 2, 64, 32, 16, {3, 70}, {40, 70}},
  };
  for (auto [d, dv] : {std::pair{40, 24}, {72, 8}, {328, 256}, {520, 512}}) {
    cases.push_back({"prefill_d" + std::to_string(d) + "_dv" + std::to_string(dv), 16, 1, d, dv, 16, {3, 70},
                     {40, 70}});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Decode, CudaMlaAttention, ::testing::ValuesIn(decode_cases()),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(Prefill, CudaMlaAttention, ::testing::ValuesIn(prefill_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(CudaMlaAttentionEdge, EmptyBatchAndNoQueryRowsLeaveOutUntouched) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend(1);
  auto gpu = make_cuda_backend(0);
  run_case({"empty_batch", 16, 1, 576, 512, 16, {}, {}, 3}, *cpu, *gpu, 1);
  run_case({"no_query_rows", 16, 1, 576, 512, 16, {0, 0}, {5, 40}, 3}, *cpu, *gpu, 2);
}

TEST(CudaMlaAttentionEdge, RejectsUnsupportedDims) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  AttentionMetadata md;
  md.num_seqs = 1;
  md.block_size = 16;
  for (auto [d, dv] : {std::pair{584, 512}, {576, 520}, {64, 72}, {60, 32}}) {
    Tensor q = gpu->empty({1, 4, d}, DType::kBF16), out = gpu->empty({1, 4, dv}, DType::kBF16);
    KVCacheLayer cache{gpu->empty({1, 16, 1, d}, DType::kBF16), Tensor()};
    try {
      gpu->paged_attention(q, cache, md, 1.0f, out);
      FAIL() << "MLA dims " << d << "/" << dv << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("MLA head dims"), std::string::npos) << e.what();
    }
  }
}

// write_kv_cache in the MLA form: K rows by slot, -1 rows skipped, other slots untouched, v ignored.
TEST(CudaMlaKvCache, WriteLatentOnlyMatchesCpu) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend(1);
  auto gpu = make_cuda_backend(0);
  std::mt19937 rng(11);
  for (auto [d, bs, empty_v] : {std::tuple{576, 16, false}, {24, 5, true}, {48, 1, false}, {20, 16, true}}) {
    const int t = 23, num_blocks = (t + bs - 1) / bs + 2;
    Tensor ck = random_bf16_values({num_blocks, bs, 1, d}, rng);
    Tensor k = random_bf16_values({t, 1, d}, rng);
    std::vector<int64_t> slots(num_blocks * bs);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    slots.resize(t);
    slots[4] = -1;
    slots[t - 1] = -1;
    Tensor slot_t = Tensor::from_i64(slots);
    KVCacheLayer cache_cpu{ck, empty_v ? Tensor::zeros({num_blocks, bs, 1, 0}, DType::kF32) : Tensor()};
    KVCacheLayer cache_gpu{to_gpu(*gpu, ck), empty_v ? gpu->empty({num_blocks, bs, 1, 0}, DType::kBF16) : Tensor()};
    cpu->write_kv_cache(k, Tensor(), cache_cpu, slot_t);
    gpu->write_kv_cache(to_gpu(*gpu, k), Tensor(), cache_gpu, to_gpu(*gpu, slot_t));
    expect_equal(to_host(*gpu, cache_gpu.k), cache_cpu.k.to_f32_vector(),
                 "d " + std::to_string(d) + " bs " + std::to_string(bs));
  }
}

}  // namespace
}  // namespace specula
