// Paged attention and KV-cache writes on the GPU against the CPU backend: decode and verification
// (split-KV, with and without the merge, merged in a cluster or by the merge kernel; on the tensor
// cores where the batch has (sequence, kv head) pairs for half the SMs), prefill,
// chunked prefill and mixed batches; GQA ratios 1/4/8/16; head dims from 16 to 256 (multiples of 8) including D != Dv; tail blocks, block sizes
// 1/5/16/32, shuffled (non-contiguous) block ids, -1 in unused block-table columns, NaN in every
// cache slot no sequence owns (a kernel that reads past a sequence's keys turns NaN), and padding
// rows of q that must be left untouched.
//
// Tolerance: |gpu - cpu| <= 1e-2 + 1e-2 |cpu|. The output is a convex combination of V rows with
// |v| <= 1; the GPU rounds the probabilities to bf16 (relative 2^-9) before P.V on the tensor
// cores and rounds the output to bf16 (2^-9), so its error is a few 1e-3; any indexing or masking
// error moves outputs by O(0.1).
//
// An fp8 cache (--kv-cache-dtype fp8) is compared with the CPU over the same e4m3 bytes and
// power-of-two scales, which make every dequantised element exact in bf16: the tolerance stays.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"

namespace specula {
namespace {

using testing::expect_close;
using testing::expect_equal;
using testing::random_bf16_values;
using testing::to_gpu;
using testing::to_host;

struct AttnCase {
  std::string name;
  int hq, hk, d, dv, block_size;
  std::vector<int> q_lens, seq_lens;
  int padding_rows = 2;
};

std::ostream& operator<<(std::ostream& os, const AttnCase& c) { return os << c.name; }

constexpr float kSentinel = 3.0f;  // what padding rows of `out` hold before and after

// The cache's K and V as e4m3 of x / scale (NaN stays NaN).
KVCacheLayer fp8_cache(const std::vector<float>& k, const Shape& k_shape, const std::vector<float>& v,
                       const Shape& v_shape, float k_scale, float v_scale) {
  KVCacheLayer cache{Tensor::empty(k_shape, DType::kF8E4M3), Tensor::empty(v_shape, DType::kF8E4M3), k_scale, v_scale};
  for (auto [from, to, scale] : {std::tuple{&k, &cache.k, k_scale}, std::tuple{&v, &cache.v, v_scale}}) {
    uint8_t* bytes = to->data_as<uint8_t>();
    for (size_t i = 0; i < from->size(); ++i) bytes[i] = f32_to_f8e4m3((*from)[i] / scale);
  }
  return cache;
}

void run_case(const AttnCase& c, Backend& cpu, Backend& gpu, unsigned seed, bool fp8 = false) {
  std::mt19937 rng(seed);
  const int num_seqs = static_cast<int>(c.q_lens.size());
  ASSERT_EQ(c.seq_lens.size(), c.q_lens.size());
  const int bs = c.block_size;

  // Block tables: shuffled ids, -1 in columns a sequence does not use, a few blocks nobody owns.
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

  // Cache: NaN everywhere, random values in each sequence's first seq_len slots.
  const Shape k_shape{num_blocks, bs, c.hk, c.d}, v_shape{num_blocks, bs, c.hk, c.dv};
  std::vector<float> kc(static_cast<size_t>(testing::numel_of(k_shape)), NAN);
  std::vector<float> vc(static_cast<size_t>(testing::numel_of(v_shape)), NAN);
  std::vector<float> kr = testing::random_floats(kc.size(), rng), vr = testing::random_floats(vc.size(), rng);
  for (int s = 0; s < num_seqs; ++s) {
    for (int j = 0; j < c.seq_lens[s]; ++j) {
      const int64_t slot = int64_t{tables[s * max_blocks + j / bs]} * bs + j % bs;
      for (int64_t i = slot * c.hk * c.d; i < (slot + 1) * c.hk * c.d; ++i) kc[i] = bf16_to_f32(f32_to_bf16(kr[i]));
      for (int64_t i = slot * c.hk * c.dv; i < (slot + 1) * c.hk * c.dv; ++i) vc[i] = bf16_to_f32(f32_to_bf16(vr[i]));
    }
  }
  KVCacheLayer cache_cpu = fp8 ? fp8_cache(kc, k_shape, vc, v_shape, 1.0f / 64, 1.0f / 128)
                               : KVCacheLayer{Tensor::from_f32(kc, k_shape), Tensor::from_f32(vc, v_shape)};

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
  md_cpu.seq_lens = Tensor::from_i32(c.seq_lens.empty() ? std::vector<int32_t>{} : std::vector<int32_t>(c.seq_lens.begin(), c.seq_lens.end()));
  md_cpu.block_tables = Tensor::from_i32(tables, {num_seqs, max_blocks});
  md_cpu.query_start_loc_host = qsl;
  md_cpu.seq_lens_host.assign(c.seq_lens.begin(), c.seq_lens.end());
  Tensor out_cpu = Tensor::zeros({t, c.hq, c.dv}, DType::kF32);
  cpu.paged_attention(q, cache_cpu, md_cpu, scale, out_cpu);

  AttentionMetadata md_gpu = md_cpu;
  md_gpu.query_start_loc = to_gpu(gpu, md_cpu.query_start_loc);
  md_gpu.seq_lens = to_gpu(gpu, md_cpu.seq_lens.numel() ? md_cpu.seq_lens : Tensor::from_i32({0}));
  md_gpu.block_tables = to_gpu(gpu, md_cpu.block_tables);
  KVCacheLayer cache_gpu{to_gpu(gpu, cache_cpu.k), to_gpu(gpu, cache_cpu.v), cache_cpu.k_scale, cache_cpu.v_scale};
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

class CudaAttention : public ::testing::TestWithParam<AttnCase> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    cpu_ = make_cpu_backend(2);
    gpu_ = make_cuda_backend(0);
  }
  std::unique_ptr<Backend> cpu_, gpu_;
};

// Every way split-KV decode merges its splits: inside the launch (a thread-block cluster, up to 16
// splits on Hopper), the same cut to 2 splits, and the merge kernel.
TEST_P(CudaAttention, MatchesCpu) {
  auto& cuda = dynamic_cast<CudaBackend&>(*gpu_);
  for (int cluster_splits : {cuda.decode_cluster_splits(), 2, 0}) {
    SCOPED_TRACE("decode_cluster_splits " + std::to_string(cluster_splits));
    cuda.set_decode_cluster_splits(cluster_splits);
    run_case(GetParam(), *cpu_, *gpu_, 1234);
  }
}

// The same batches over an fp8 cache: decode and verification (merged in a cluster and by the
// merge kernel) and the varlen kernel, which widens fp8 tiles to bf16 in shared memory.
TEST_P(CudaAttention, Fp8CacheMatchesCpu) {
  auto& cuda = dynamic_cast<CudaBackend&>(*gpu_);
  for (int cluster_splits : {cuda.decode_cluster_splits(), 0}) {
    SCOPED_TRACE("decode_cluster_splits " + std::to_string(cluster_splits));
    cuda.set_decode_cluster_splits(cluster_splits);
    run_case(GetParam(), *cpu_, *gpu_, 4321, /*fp8=*/true);
  }
}

std::vector<int> ones(size_t n) { return std::vector<int>(n, 1); }

std::vector<AttnCase> decode_cases() {
  const std::vector<int> lens = {1, 2, 15, 16, 17, 33, 100, 257};
  std::vector<AttnCase> cases = {
      {"decode_gqa1", 4, 4, 128, 128, 16, ones(lens.size()), lens},
      {"decode_gqa4", 16, 4, 128, 128, 16, ones(lens.size()), lens},
      {"decode_gqa8_d64", 32, 4, 64, 64, 16, ones(lens.size()), lens},
      {"decode_gqa16", 16, 1, 128, 128, 16, ones(lens.size()), lens},
      {"decode_gqa6", 12, 2, 128, 128, 16, ones(lens.size()), lens},
      {"decode_long_splits", 8, 2, 128, 128, 16, {1, 0, 1}, {3000, 7, 1500}},
      // Qwen3-0.6B's heads: sequences long enough for more splits than a cluster takes.
      {"decode_long_splits_8kv", 16, 8, 128, 128, 16, {1, 1, 1}, {900, 4000, 2100}},
      {"decode_block1", 8, 2, 64, 64, 1, {1, 1}, {9, 130}},
      {"decode_block5", 8, 2, 64, 64, 5, {1, 1, 1}, {4, 5, 611}},
      {"decode_block32", 8, 2, 128, 128, 32, {1, 1, 1}, {31, 32, 700}},
      {"decode_d192_dv128", 8, 2, 192, 128, 16, {1, 1, 1}, {3, 90, 400}},
      {"decode_d24_dv16", 4, 4, 24, 16, 16, {1, 1, 1}, {3, 90, 400}},
  };
  // Verification (a few query rows per sequence) also runs the split-KV kernel, each (row, head)
  // entry with its own causal limit; q_len 0 rows and splits with no visible key included.
  std::vector<AttnCase> verify = {
      {"verify_gqa4", 16, 4, 128, 128, 16, {4, 4, 4, 4, 2, 1}, {4, 19, 64, 300, 1000, 7}},
      {"verify_gqa1", 4, 4, 128, 128, 16, {3, 8, 5}, {3, 50, 2000}},
      {"verify_gqa8_d64", 32, 4, 64, 64, 16, {8, 1, 0, 4}, {40, 9, 12, 600}},
      {"verify_gqa16", 16, 1, 128, 128, 16, {2, 5}, {70, 900}},
      {"verify_long_splits", 8, 2, 128, 128, 16, {4, 4}, {3000, 2500}},
      {"verify_block5", 8, 2, 64, 64, 5, {4, 3}, {33, 211}},
      {"verify_d192_dv128", 8, 2, 192, 128, 16, {4, 2}, {90, 400}},
      {"verify_d24_dv16", 4, 4, 24, 16, 16, {5, 1}, {90, 400}},
  };
  cases.insert(cases.end(), verify.begin(), verify.end());
  // A big batch of short sequences: one split, outputs written directly.
  std::vector<int> many_lens;
  std::mt19937 rng(5);
  for (int i = 0; i < 64; ++i) many_lens.push_back(1 + static_cast<int>(rng() % 128));
  cases.push_back({"decode_batch64", 32, 8, 128, 128, 16, ones(64), many_lens, 5});
  // Verification of a batch that fills the GPU with blocks of 8 entries (small batches take 2).
  std::vector<int> verify_lens;
  for (int i = 0; i < 48; ++i) verify_lens.push_back(std::max(4, many_lens[static_cast<size_t>(i)]));
  cases.push_back({"verify_batch48", 32, 8, 128, 128, 16, std::vector<int>(48, 4), verify_lens});
  // Batches with (sequence, kv head) pairs for at least half the SMs (132 on the H100 / H200)
  // take the tensor-core kernel: head dims 64 and 128, 1 to 16 query heads a kv head, block sizes
  // 5, 16 and 32, lengths around the 16-key chunks and long enough for every warp to run many.
  auto lengths = [&](int n, int max_len) {
    std::vector<int> v = {1, 15, 16, 17, 64, 65};
    while (static_cast<int>(v.size()) < n) v.push_back(1 + static_cast<int>(rng() % max_len));
    v.resize(n);
    return v;
  };
  cases.push_back({"decode_fills_gpu_d64", 32, 8, 64, 64, 16, ones(20), lengths(20, 300)});
  std::vector<int> one_idle = ones(40);
  one_idle[3] = 0;  // a sequence with no query row this step
  cases.push_back({"decode_fills_gpu_gqa1", 4, 4, 128, 128, 16, one_idle, lengths(40, 1000)});
  cases.push_back({"decode_fills_gpu_gqa16", 16, 1, 128, 128, 16, ones(140), lengths(140, 200)});
  cases.push_back({"decode_fills_gpu_block5", 8, 4, 128, 128, 5, ones(36), lengths(36, 700)});
  cases.push_back({"decode_fills_gpu_long", 16, 8, 128, 128, 16, ones(9), lengths(9, 3000)});
  // More pairs than three blocks an SM: the fp8 cache's four-blocks-an-SM form.
  cases.push_back({"decode_fills_gpu_many", 16, 8, 128, 128, 32, ones(60), lengths(60, 1500)});
  for (int d : {16, 32, 48, 64, 80, 96, 112, 128, 160, 256}) {
    cases.push_back({"decode_d" + std::to_string(d), 8, 2, d, d, 16, {1, 1, 1}, {5, 70, 300}});
  }
  return cases;
}

std::vector<AttnCase> prefill_cases() {
  std::vector<AttnCase> cases = {
      {"prefill_gqa4", 8, 2, 128, 128, 16, {7, 33, 64, 65, 130}, {7, 33, 64, 65, 130}},
      {"prefill_gqa1_d64", 4, 4, 64, 64, 16, {7, 33, 64, 65, 130}, {7, 33, 64, 65, 130}},
      {"prefill_gqa8_d64", 16, 2, 64, 64, 16, {7, 33, 130}, {7, 33, 130}},
      {"prefill_gqa16", 16, 1, 128, 128, 16, {9, 40}, {9, 40}},
      {"prefill_long", 8, 8, 128, 128, 16, {1000}, {1000}},
      {"chunked_prefill", 8, 2, 128, 128, 16, {20, 64, 1, 5}, {100, 141, 50, 5}},
      {"verification_9_rows", 8, 2, 128, 128, 16, {9, 9, 9, 9}, {9, 19, 64, 300}},
      // Enough sequences for the flash kernel to fill the GPU: short rows go there, not split.
      {"verification_many_seqs", 8, 2, 128, 128, 16, std::vector<int>(48, 3), []() {
         std::vector<int> lens;
         for (int i = 0; i < 48; ++i) lens.push_back(3 + (i * 37) % 200);
         return lens;
       }()},
      {"mixed_prefill_decode", 8, 2, 128, 128, 16, {1, 37, 1, 1, 128, 0}, {90, 37, 1, 513, 200, 17}},
      {"mixed_block1", 4, 2, 64, 64, 1, {1, 12}, {30, 20}},
      {"mixed_block5", 4, 2, 64, 64, 5, {1, 12, 3}, {30, 20, 3}},
      {"mixed_block32", 8, 2, 128, 128, 32, {1, 50, 9}, {70, 50, 77}},
      {"prefill_d192_dv128", 8, 2, 192, 128, 16, {3, 70}, {40, 70}},
      {"prefill_d24_dv16", 4, 4, 24, 16, 16, {3, 70}, {40, 70}},
  };
  for (int d : {16, 32, 40, 48, 64, 80, 96, 112, 128, 160, 200, 256}) {
    cases.push_back({"prefill_d" + std::to_string(d), 8, 2, d, d, 16, {3, 70}, {40, 70}});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Decode, CudaAttention, ::testing::ValuesIn(decode_cases()),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(Prefill, CudaAttention, ::testing::ValuesIn(prefill_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(CudaAttentionEdge, EmptyBatchAndNoQueryRowsLeaveOutUntouched) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend(1);
  auto gpu = make_cuda_backend(0);
  run_case({"empty_batch", 4, 2, 64, 64, 16, {}, {}, 3}, *cpu, *gpu, 1);
  run_case({"no_query_rows", 4, 2, 64, 64, 16, {0, 0}, {5, 40}, 3}, *cpu, *gpu, 2);
}

TEST(CudaAttentionEdge, RejectsUnsupportedHeadDim) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  Tensor q = gpu->empty({1, 2, 20}, DType::kBF16), out = gpu->empty({1, 2, 20}, DType::kBF16);
  KVCacheLayer cache{gpu->empty({1, 16, 2, 20}, DType::kBF16), gpu->empty({1, 16, 2, 20}, DType::kBF16)};
  AttentionMetadata md;
  md.num_seqs = 1;
  md.block_size = 16;
  try {
    gpu->paged_attention(q, cache, md, 1.0f, out);
    FAIL() << "head dim 20 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head dim 20"), std::string::npos) << e.what();
  }
}

// write_kv_cache: shuffled slots, -1 rows skipped, every other slot untouched.
TEST(CudaKvCache, WriteMatchesCpu) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend(1);
  auto gpu = make_cuda_backend(0);
  std::mt19937 rng(3);
  for (auto [hk, d, dv, bs] : {std::tuple{2, 128, 128, 16}, {4, 24, 16, 5}, {1, 64, 64, 1}}) {
    const int t = 23, num_blocks = (t + bs - 1) / bs + 2;  // room for t distinct slots
    Tensor ck = random_bf16_values({num_blocks, bs, hk, d}, rng), cv = random_bf16_values({num_blocks, bs, hk, dv}, rng);
    Tensor k = random_bf16_values({t, hk, d}, rng), v = random_bf16_values({t, hk, dv}, rng);
    std::vector<int64_t> slots(num_blocks * bs);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    slots.resize(t);
    slots[3] = -1;
    slots[t - 1] = -1;
    KVCacheLayer cache_gpu{to_gpu(*gpu, ck), to_gpu(*gpu, cv)};
    KVCacheLayer cache_cpu{ck, cv};
    Tensor slot_t = Tensor::from_i64(slots);
    cpu->write_kv_cache(k, v, cache_cpu, slot_t);
    gpu->write_kv_cache(to_gpu(*gpu, k), to_gpu(*gpu, v), cache_gpu, to_gpu(*gpu, slot_t));
    const std::string what = "hk " + std::to_string(hk) + " d " + std::to_string(d) + " bs " + std::to_string(bs);
    expect_equal(to_host(*gpu, cache_gpu.k), cache_cpu.k.to_f32_vector(), what + " k");
    expect_equal(to_host(*gpu, cache_gpu.v), cache_cpu.v.to_f32_vector(), what + " v");
  }
}

// write_kv_cache into an fp8 cache: the same e4m3 bytes as the CPU's from the same bf16 rows
// (saturating at 448 after the scale, here for K), the MLA form (K only) included.
TEST(CudaKvCache, Fp8WriteMatchesCpu) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend(1);
  auto gpu = make_cuda_backend(0);
  std::mt19937 rng(4);
  for (bool mla : {false, true}) {
    const int hk = 2, d = 128, bs = 16, t = 19, num_blocks = 3;
    const Shape shape{num_blocks, bs, hk, d};
    auto fp8_zeros = [&] { return Tensor::zeros(shape, DType::kF8E4M3); };
    KVCacheLayer cache_cpu{fp8_zeros(), mla ? Tensor() : fp8_zeros(), 0.125f, 0.25f};
    KVCacheLayer cache_gpu{to_gpu(*gpu, cache_cpu.k), mla ? Tensor() : to_gpu(*gpu, cache_cpu.v), 0.125f, 0.25f};
    Tensor k = random_bf16_values({t, hk, d}, rng, 100.0f), v = random_bf16_values({t, hk, d}, rng, 30.0f);
    std::vector<int64_t> slots(t);
    std::iota(slots.begin(), slots.end(), 7);
    slots[5] = -1;
    Tensor slot_t = Tensor::from_i64(slots);
    cpu->write_kv_cache(k, v, cache_cpu, slot_t);
    gpu->write_kv_cache(to_gpu(*gpu, k), mla ? Tensor() : to_gpu(*gpu, v), cache_gpu, to_gpu(*gpu, slot_t));
    expect_equal(to_host(*gpu, cache_gpu.k), cache_cpu.k.to_f32_vector(), mla ? "mla k" : "k");
    if (!mla) expect_equal(to_host(*gpu, cache_gpu.v), cache_cpu.v.to_f32_vector(), "v");
  }
}

}  // namespace
}  // namespace specula
