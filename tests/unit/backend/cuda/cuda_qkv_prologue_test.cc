// The fused Llama attention prologue (Backend::qkv_prologue) on the GPU against its CPU twin (the
// op sequence gather_rows + rms_norm + rope + write_kv_cache) on random bf16-exact inputs: the
// q heads handed to attention, and every cache slot (written ones, and the untouched ones that
// padding rows with slot -1 must leave alone).
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <utility>

#include "cuda_test_util.h"

namespace specula {
namespace {

using testing::expect_close;
using testing::random_bf16_values;
using testing::rope_table;
using testing::to_gpu;
using testing::to_host;

struct PrologueCase {
  std::string name;
  int tokens, hq, hk, d, rotary;
  bool neox, norm;
};

class CudaQkvPrologue : public ::testing::TestWithParam<PrologueCase> {};

struct PrologueOut {
  std::vector<float> q, k, v;  // the q heads, and the caches dequantised (fp8: times their scales)
};

// The prologue of case c on the CPU (F32, the op sequence) and on the GPU (BF16), writing a cache
// of the compute type or (fp8) e4m3 with scales 1/4 for K and 1/16 for V.
std::pair<PrologueOut, PrologueOut> run_prologue(const PrologueCase& c, bool fp8) {
  auto gpu = make_cuda_backend(0);
  auto cpu = make_cpu_backend(2);
  std::mt19937 rng(7 + c.tokens * 31 + c.d);
  const int64_t t = c.tokens, heads = c.hq + 2 * c.hk, max_pos = 97, bs = 16;
  const int64_t blocks = (t + bs - 1) / bs + 2;  // room for a distinct slot per row
  Tensor qkv = random_bf16_values({t, heads * c.d}, rng, 2.0f);
  Tensor q_norm = random_bf16_values({c.d}, rng), k_norm = random_bf16_values({c.d}, rng);
  std::uniform_int_distribution<int32_t> pos_dist(0, max_pos - 1);
  std::vector<int32_t> positions(static_cast<size_t>(t));
  for (int32_t& p : positions) p = pos_dist(rng);
  // Distinct slots in shuffled order; every fifth row is padding (-1).
  std::vector<int64_t> slots(static_cast<size_t>(blocks * bs));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(static_cast<size_t>(t));
  for (size_t i = 4; i < slots.size(); i += 5) slots[i] = -1;
  Tensor cos_sin = rope_table(max_pos, c.rotary);

  auto run = [&](Backend& be, DType dt, bool on_gpu) {
    auto put = [&](const Tensor& h, DType want) { return on_gpu ? to_gpu(be, h, want) : h; };
    Tensor x = put(qkv, dt), qn = put(q_norm, dt), kn = put(k_norm, dt), cs = put(cos_sin, DType::kF32);
    Tensor pos = put(Tensor::from_i32(positions), DType::kI32), sl = put(Tensor::from_i64(slots), DType::kI64);
    const DType cache_dt = fp8 ? DType::kF8E4M3 : dt;
    KVCacheLayer cache{be.empty({blocks, bs, c.hk, c.d}, cache_dt), be.empty({blocks, bs, c.hk, c.d}, cache_dt)};
    if (fp8) {
      cache.k_scale = 0.25f;
      cache.v_scale = 1.0f / 16;
    }
    be.zero(cache.k);
    be.zero(cache.v);
    Tensor q = be.empty({t, c.hq, c.d}, dt);
    Backend::QkvPrologue p;
    p.num_q_heads = c.hq;
    p.num_kv_heads = c.hk;
    p.q_norm = c.norm ? &qn : nullptr;
    p.k_norm = c.norm ? &kn : nullptr;
    p.eps = 1e-6f;
    p.positions = &pos;
    p.cos_sin = &cs;
    p.rotary_dim = c.rotary;
    p.neox = c.neox;
    be.reset_scratch();
    be.qkv_prologue(x, p, cache, sl, q);
    PrologueOut out = on_gpu ? PrologueOut{to_host(be, q), to_host(be, cache.k), to_host(be, cache.v)}
                             : PrologueOut{q.to_f32_vector(), cache.k.to_f32_vector(), cache.v.to_f32_vector()};
    for (float& x : out.k) x *= cache.k_scale;
    for (float& x : out.v) x *= cache.v_scale;
    return out;
  };
  return {run(*cpu, DType::kF32, false), run(*gpu, DType::kBF16, true)};
}

TEST_P(CudaQkvPrologue, MatchesTheCpuOpSequence) {
  SKIP_WITHOUT_GPU();
  const PrologueCase c = GetParam();
  const auto [want, got] = run_prologue(c, /*fp8=*/false);
  // bf16 storage: the GPU rounds the normalised head and the roped output (2 roundings of 2^-9).
  expect_close(got.q, want.q, 1e-2, 2e-2, c.name + " q");
  expect_close(got.k, want.k, 1e-2, 2e-2, c.name + " cache.k");
  expect_close(got.v, want.v, 0.0, 0.0, c.name + " cache.v");  // v is copied, exactly
}

// An fp8 cache gets each K/V element rounded once from fp32. V is the same rounding of the same
// bf16 value on both sides, exactly. K carries the bf16 test's error (the GPU rounds the normalised
// head before rope, whose cancellations turn that into 2e-2 absolute) plus one e4m3 step (2^-3
// relative) where it moves a value across a rounding boundary, which only a few elements do.
TEST_P(CudaQkvPrologue, Fp8CacheMatchesTheCpuOpSequence) {
  SKIP_WITHOUT_GPU();
  const PrologueCase c = GetParam();
  const auto [want, got] = run_prologue(c, /*fp8=*/true);
  expect_close(got.q, want.q, 1e-2, 2e-2, c.name + " q");
  expect_close(got.v, want.v, 0.0, 0.0, c.name + " cache.v");
  expect_close(got.k, want.k, 0.13, 2e-2, c.name + " cache.k");
  size_t same = 0;
  for (size_t i = 0; i < got.k.size(); ++i) same += got.k[i] == want.k[i];
  EXPECT_GE(same, got.k.size() * 9 / 10) << c.name << ": " << same << " of " << got.k.size() << " K elements agree";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaQkvPrologue,
    ::testing::Values(PrologueCase{"qwen3_decode_1", 1, 16, 8, 128, 128, true, true},
                      PrologueCase{"qwen3_batch", 37, 16, 8, 128, 128, true, true},
                      PrologueCase{"llama8b_heads", 9, 32, 8, 128, 128, true, false},
                      PrologueCase{"partial_rotary", 21, 4, 2, 64, 32, true, true},
                      PrologueCase{"interleaved", 13, 4, 4, 64, 64, false, false},
                      PrologueCase{"head_dim_80", 11, 6, 2, 80, 80, true, true},
                      PrologueCase{"head_dim_256", 5, 4, 1, 256, 256, true, true},
                      PrologueCase{"mqa_many_tokens", 300, 8, 1, 64, 64, true, false}),
    [](const ::testing::TestParamInfo<PrologueCase>& i) { return i.param.name; });

TEST(CudaQkvPrologue, RejectsHeadDimsAboveTheKernelLimit) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  Tensor qkv = gpu->empty({1, 3 * 264}, DType::kBF16), q = gpu->empty({1, 1, 264}, DType::kBF16);
  Tensor pos = gpu->empty({1}, DType::kI32), slots = gpu->empty({1}, DType::kI64);
  Tensor cs = gpu->empty({4, 264}, DType::kF32);
  KVCacheLayer cache{gpu->empty({1, 16, 1, 264}, DType::kBF16), gpu->empty({1, 16, 1, 264}, DType::kBF16)};
  Backend::QkvPrologue p;
  p.num_q_heads = 1;
  p.num_kv_heads = 1;
  p.positions = &pos;
  p.cos_sin = &cs;
  p.rotary_dim = 264;
  EXPECT_THROW(gpu->qkv_prologue(qkv, p, cache, slots, q), Error);
}

}  // namespace
}  // namespace specula
