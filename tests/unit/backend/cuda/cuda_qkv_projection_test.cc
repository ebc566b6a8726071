// The qkv projection with the attention prologue in its epilogue (CudaBackend::qkv_projection,
// one decode row) against the two ops it fuses on the same GPU (Backend::qkv_projection:
// fused_linear, then qkv_prologue): the q heads and every cache slot, bit for bit, for bf16 and
// FP8 weights, bf16 and fp8 caches, with and without the input norm, q/k norms and bias, in both
// one-launch forms (a cluster a head for small weights; the GEMV with a rope epilogue for Llama-
// 3.1-8B's, which have no q/k norms). FP8
// weights over more rows than the GEMV's: the prologue applying the FP8 GEMM's scales as it
// reads the product, against the scale pass then the prologue.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cuda/cuda_engine_kernels.h"
#include "cuda_test_util.h"

namespace specula {
namespace {

using testing::expect_equal;
using testing::random_bf16_values;
using testing::rope_table;
using testing::to_gpu;
using testing::to_host;

struct ProjectionCase {
  std::string name;
  int hq, hk, d, k, rotary;
  bool neox = true, input_norm = true, head_norms = true, fp8_weights = false, fp8_cache = false;
  bool bias = false;
  DType bias_dtype = DType::kBF16;
  int32_t position = 41;         // >= the table's 97 rows: no rotation
  int64_t slot = 37;             // -1: K/V not kept
  bool fused = true;             // whether the shape takes the fused kernel
  int64_t rows = 1;              // tokens (row r at position + r, slot + r)
};

class CudaQkvProjection : public ::testing::TestWithParam<ProjectionCase> {};

TEST_P(CudaQkvProjection, IsTheProjectionThenThePrologueBitForBit) {
  SKIP_WITHOUT_GPU();
  const ProjectionCase c = GetParam();
  auto gpu = make_cuda_backend(0);
  std::mt19937 rng(11 + c.d + c.k);
  const int64_t n = static_cast<int64_t>(c.hq + 2 * c.hk) * c.d, max_pos = 97, bs = 16, blocks = 4;
  Tensor x = to_gpu(*gpu, random_bf16_values({c.rows, c.k}, rng, 2.0f));
  Tensor gamma = to_gpu(*gpu, random_bf16_values({c.k}, rng));
  Tensor w = to_gpu(*gpu, random_bf16_values({n, c.k}, rng, 1.0f / std::sqrt(static_cast<float>(c.k))));
  LinearWeight weight{w, Tensor()};
  if (c.fp8_weights) {
    weight = LinearWeight{gpu->empty({n, c.k}, DType::kF8E4M3), gpu->empty({n}, DType::kF32)};
    gpu->quantize_fp8_rows(w, weight.weight, weight.scale);
  }
  Tensor bias;
  if (c.bias) bias = to_gpu(*gpu, random_bf16_values({n}, rng), c.bias_dtype);
  Tensor q_norm = to_gpu(*gpu, random_bf16_values({c.d}, rng)), k_norm = to_gpu(*gpu, random_bf16_values({c.d}, rng));
  Tensor cos_sin = to_gpu(*gpu, rope_table(max_pos, c.rotary), DType::kF32);
  std::vector<int32_t> positions;
  std::vector<int64_t> slot_ids;
  for (int64_t r = 0; r < c.rows; ++r) {
    positions.push_back(c.position + static_cast<int32_t>(r));
    slot_ids.push_back(c.slot < 0 ? -1 : c.slot + r);
  }
  Tensor pos = to_gpu(*gpu, Tensor::from_i32(positions), DType::kI32);
  Tensor slots = to_gpu(*gpu, Tensor::from_i64(slot_ids), DType::kI64);
  Backend::QkvPrologue p;
  p.num_q_heads = c.hq;
  p.num_kv_heads = c.hk;
  p.q_norm = c.head_norms ? &q_norm : nullptr;
  p.k_norm = c.head_norms ? &k_norm : nullptr;
  p.eps = 1e-6f;
  p.positions = &pos;
  p.cos_sin = &cos_sin;
  p.rotary_dim = c.rotary;
  p.neox = c.neox;
  const LinearPrologue norm = c.input_norm ? LinearPrologue::rms_norm(gamma, 1e-5f) : LinearPrologue::none();

  struct Out {
    std::vector<float> q, k, v;
  };
  auto run = [&](bool fused) {
    const DType cache_dt = c.fp8_cache ? DType::kF8E4M3 : DType::kBF16;
    KVCacheLayer cache{gpu->empty({blocks, bs, c.hk, c.d}, cache_dt), gpu->empty({blocks, bs, c.hk, c.d}, cache_dt)};
    if (c.fp8_cache) {
      cache.k_scale = 0.25f;
      cache.v_scale = 1.0f / 16;
    }
    gpu->zero(cache.k);
    gpu->zero(cache.v);
    Tensor q = gpu->empty({c.rows, c.hq, c.d}, DType::kBF16);
    gpu->reset_scratch();
    const Tensor* b = bias.defined() ? &bias : nullptr;
    if (fused) {
      gpu->qkv_projection(x, norm, weight, b, p, cache, slots, q);
    } else {
      gpu->Backend::qkv_projection(x, norm, weight, b, p, cache, slots, q);
    }
    return Out{to_host(*gpu, q), to_host(*gpu, cache.k), to_host(*gpu, cache.v)};
  };
  const Out want = run(false), got = run(true);
  expect_equal(got.q, want.q, c.name + " q");
  expect_equal(got.k, want.k, c.name + " cache.k");
  expect_equal(got.v, want.v, c.name + " cache.v");
  if (c.slot >= 0) {  // the kept token's K/V are not all zero: the op wrote them
    bool written = false;
    for (float v : got.v) written |= v != 0.0f;
    EXPECT_TRUE(written) << c.name;
  }

  // Whether the one-row kernel takes this shape (otherwise the op above ran the two ops).
  if (c.rows > 1) return;
  cuda::QkvProjectionParams kp;
  kp.x = x.data();
  kp.w = weight.weight.data();
  kp.w_fp8 = c.fp8_weights;
  kp.w_scale = c.fp8_weights ? weight.scale.data_as<float>() : nullptr;
  kp.norm_weight = c.input_norm ? gamma.data() : nullptr;
  kp.k = c.k;
  kp.prologue.tokens = 1;
  kp.prologue.head_dim = c.d;
  kp.prologue.num_q_heads = c.hq;
  kp.prologue.num_kv_heads = c.hk;
  kp.prologue.q_norm = c.head_norms ? q_norm.data() : nullptr;
  kp.prologue.k_norm = c.head_norms ? k_norm.data() : nullptr;
  kp.prologue.rotary_dim = c.rotary;
  kp.prologue.neox = c.neox;
  EXPECT_EQ(cuda::qkv_projection_supports(kp), c.fused) << c.name;
}

ProjectionCase with(ProjectionCase c, void (*change)(ProjectionCase&)) {
  change(c);
  return c;
}

const ProjectionCase kQwen3{"qwen3_0_6b", 16, 8, 128, 1024, 128};
// Llama's K of 4096 (four passes over a row) with fewer heads: 8 MB of weights.
const ProjectionCase kLlama{"k4096_four_passes", 4, 2, 128, 4096, 128, true, true, false};

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaQkvProjection,
    ::testing::Values(
        kQwen3, kLlama,
        with(kQwen3, [](ProjectionCase& c) { c.name = "fp8_cache", c.fp8_cache = true; }),
        with(kLlama, [](ProjectionCase& c) { c.name = "fp8_weights", c.fp8_weights = true; }),
        with(kLlama, [](ProjectionCase& c) { c.name = "fp8_weights_fp8_cache", c.fp8_weights = c.fp8_cache = true; }),
        with(kLlama, [](ProjectionCase& c) { c.name = "fp8_weights_24_rows", c.fp8_weights = true, c.rows = 24; }),
        with(kQwen3,
             [](ProjectionCase& c) {
               c.name = "fp8_weights_fp8_cache_f32_bias_8_rows", c.fp8_weights = c.fp8_cache = true, c.bias = true,
               c.bias_dtype = DType::kF32, c.rows = 8;
             }),
        with(kQwen3,
             [](ProjectionCase& c) {
               c.name = "fp8_weights_bias_no_input_norm_5_rows", c.fp8_weights = true, c.input_norm = false,
               c.bias = true, c.rows = 5, c.slot = 3;
             }),
        with(kQwen3,
             [](ProjectionCase& c) {
               c.name = "fp8_weights_16_rows_past_table", c.fp8_weights = true, c.rows = 16, c.position = 90;
             }),
        with(kQwen3, [](ProjectionCase& c) { c.name = "qwen2_bias", c.head_norms = false, c.bias = true; }),
        with(kQwen3,
             [](ProjectionCase& c) {
               c.name = "f32_bias_no_input_norm", c.input_norm = false, c.bias = true, c.bias_dtype = DType::kF32;
             }),
        with(kQwen3, [](ProjectionCase& c) { c.name = "kv_not_kept", c.slot = -1; }),
        with(kQwen3, [](ProjectionCase& c) { c.name = "position_past_table", c.position = 97; }),
        ProjectionCase{"head_dim_64_partial_rotary", 4, 2, 64, 512, 32},
        ProjectionCase{"head_dim_32_interleaved", 4, 4, 32, 256, 32, false},
        ProjectionCase{"small_k_one_chunk_a_lane", 2, 1, 128, 128, 128},
        ProjectionCase{"head_dim_80_clusters_of_5", 6, 2, 80, 512, 80},
        with(ProjectionCase{"head_dim_72_two_ops", 6, 2, 72, 512, 72}, [](ProjectionCase& c) { c.fused = false; }),
        // Llama-3.1-8B's 50 MB: the GEMV with the rope epilogue.
        with(kLlama, [](ProjectionCase& c) { c.name = "llama8b_rope_epilogue", c.hq = 32, c.hk = 8; }),
        with(kLlama,
             [](ProjectionCase& c) {
               c.name = "llama8b_fp8_weights_fp8_cache", c.hq = 32, c.hk = 8, c.fp8_weights = c.fp8_cache = true;
             }),
        with(kLlama, [](ProjectionCase& c) { c.name = "llama8b_kv_not_kept", c.hq = 32, c.hk = 8, c.slot = -1; }),
        with(kLlama, [](ProjectionCase& c) { c.name = "llama8b_past_table", c.hq = 32, c.hk = 8, c.position = 97; }),
        ProjectionCase{"qwen2_7b_bias", 28, 4, 128, 3584, 128, true, true, false, false, false, true},
        with(kLlama,
             [](ProjectionCase& c) {
               c.name = "llama8b_no_input_norm_two_ops", c.hq = 32, c.hk = 8, c.input_norm = false, c.fused = false;
             }),
        with(kLlama,
             [](ProjectionCase& c) {
               c.name = "qwen3_8b_head_norms_two_ops", c.hq = 32, c.hk = 8, c.head_norms = true, c.fused = false;
             }),
        with(kLlama,
             [](ProjectionCase& c) {
               c.name = "llama8b_interleaved_two_ops", c.hq = 32, c.hk = 8, c.neox = false, c.fused = false;
             }),
        with(ProjectionCase{"head_dim_256_two_ops", 4, 1, 256, 512, 256}, [](ProjectionCase& c) { c.fused = false; })),
    [](const ::testing::TestParamInfo<ProjectionCase>& i) { return i.param.name; });

}  // namespace
}  // namespace specula
