// fused_moe on the GPU, both paths (GEMV for T * C <= 64, sort + grouped tensor-core GEMM above),
// for T = 1, 3, 8, 64, 300 with E = 8 and 64 experts (plus fused shared-expert replicas), C = 2..8
// columns, routed by the CPU moe_route (with and without fused shared slots), against:
//  - the CPU twin (fp32 throughout): |gpu - cpu| <= 2e-2 |cpu| + 1e-2 max|cpu|. The GPU rounds
//    gate/up, silu * up and each expert output to bf16 (relative 2^-9 each) as the unfused ops do;
//    a wrong expert, slot, weight or row moves outputs by O(max|cpu|);
//  - the same computation with the GPU's roundings done in exact arithmetic (moe_reference.h):
//    within a couple of bf16 ulps, |gpu - ref| <= 1e-2 |ref| + 2e-3 max|ref| (the only freedom
//    left is fp32 summation order deciding an occasional rounding).
// Plus edge shapes: hidden / inter not multiples of 8 (the scalar GEMV path, also for large T),
// every token on the same two experts (one expert with several row tiles), duplicate ids in a
// row, and C = 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "cuda_test_util.h"
#include "moe_reference.h"

namespace specula {
namespace {

using testing::expect_close;
using testing::random_bf16_values;
using testing::to_gpu;
using testing::to_host;

struct MoeShape {
  int64_t hidden, inter, routed, top_k;
  int shared_slots = 0, replicas = 1;
  std::string name;
};

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(double(x)));
  return m;
}

// |got - want| <= rtol |want| + atol_rel max|want|.
void expect_near_scaled(const std::vector<float>& got, const std::vector<float>& want, double rtol, double atol_rel,
                        const std::string& what) {
  const double scale = max_abs(want);
  ASSERT_GT(scale, 0.0) << what << ": the reference is all zeros";
  expect_close(got, want, rtol, atol_rel * scale, what);
}

class CudaFusedMoe : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    cpu_ = make_cpu_backend(2);
    gpu_ = make_cuda_backend(0);
  }

  // Runs one case: ids from the CPU router (or `forced_ids`), compared three ways.
  void run(const MoeShape& s, int64_t t, unsigned seed, const std::vector<int32_t>* forced_ids = nullptr,
           int64_t forced_cols = 0) {
    std::mt19937 rng(seed);
    const int64_t experts = s.routed + int64_t{s.replicas} * s.shared_slots;
    const float w_scale = 1.0f / std::sqrt(static_cast<float>(s.hidden));
    const float w2_scale = 1.0f / std::sqrt(static_cast<float>(s.inter));
    Tensor x = random_bf16_values({t, s.hidden}, rng);
    Tensor w13 = random_bf16_values({experts, 2 * s.inter, s.hidden}, rng, 2.0f * w_scale);
    Tensor w2 = random_bf16_values({experts, s.hidden, s.inter}, rng, 2.0f * w2_scale);

    Tensor ids, weights;
    if (forced_ids != nullptr) {
      ids = Tensor::from_i32(*forced_ids, {t, forced_cols});
      std::uniform_real_distribution<float> u(0.1f, 1.0f);
      std::vector<float> w(forced_ids->size());
      for (float& v : w) v = u(rng);
      weights = Tensor::from_f32(w, {t, forced_cols});
    } else {
      MoeRouting r;
      r.scoring = MoeRouting::Scoring::kSigmoid;
      r.top_k = static_cast<int>(s.top_k);
      r.renormalize = true;
      r.routed_scaling_factor = 2.5f;
      r.shared_slots = s.shared_slots;
      r.shared_replicas = s.replicas;
      r.shared_first = static_cast<int>(s.routed);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> logits(static_cast<size_t>(t * s.routed));
      for (float& l : logits) l = normal(rng);
      ids = Tensor::zeros({t, r.columns()}, DType::kI32);
      weights = Tensor::zeros({t, r.columns()}, DType::kF32);
      cpu_->moe_route(Tensor::from_f32(logits, {t, s.routed}), nullptr, r, ids, weights);
    }
    const int64_t cols = ids.size(1);

    Tensor out_cpu = Tensor::zeros({t, s.hidden}, DType::kF32);
    cpu_->fused_moe(x, w13, w2, ids, weights, out_cpu);
    const std::vector<float> want = out_cpu.to_f32_vector();
    const std::vector<float> ref = testing::fused_moe_bf16_reference(
        x.to_f32_vector(), w13.to_f32_vector(), w2.to_f32_vector(), ids.to_i32_vector(), weights.to_f32_vector(), t,
        s.hidden, s.inter, experts, cols);

    Tensor out_gpu = gpu_->empty({t, s.hidden}, DType::kBF16);
    gpu_->reset_scratch();
    gpu_->fused_moe(to_gpu(*gpu_, x), to_gpu(*gpu_, w13), to_gpu(*gpu_, w2), to_gpu(*gpu_, ids),
                    to_gpu(*gpu_, weights, DType::kF32), out_gpu);
    const std::vector<float> got = to_host(*gpu_, out_gpu);
    const std::string what = s.name + " T=" + std::to_string(t) + " C=" + std::to_string(cols) +
                             (t * cols <= 64 ? " (gemv)" : " (grouped)");
    expect_near_scaled(got, want, 2e-2, 1e-2, what + " vs cpu");
    expect_near_scaled(got, ref, 1e-2, 2e-3, what + " vs bf16 reference");
  }

  std::unique_ptr<Backend> cpu_, gpu_;
};

const std::vector<int64_t> kTokens = {1, 3, 8, 64, 300};

TEST_F(CudaFusedMoe, EightExpertsTopTwo) {
  for (int64_t t : kTokens) run({64, 32, 8, 2, 0, 1, "e8_c2"}, t, 1);
}

TEST_F(CudaFusedMoe, EightExpertsWithFusedSharedReplicas) {
  for (int64_t t : kTokens) run({64, 32, 8, 2, 1, 2, "e8_c3_shared_x2"}, t, 2);
  for (int64_t t : kTokens) run({128, 96, 8, 2, 1, 1, "tiny_moe_c3_shared_x1"}, t, 3);
}

TEST_F(CudaFusedMoe, SixtyFourExpertsTopSix) {
  for (int64_t t : kTokens) run({256, 128, 64, 6, 0, 1, "e64_c6"}, t, 4);
}

TEST_F(CudaFusedMoe, SixtyFourExpertsTopSixWithTwoSharedSlots) {
  // V2-Lite's layout: 6 routed + 2 shared experts of the routed width, fused (C = 8).
  for (int64_t t : kTokens) run({256, 128, 64, 6, 2, 1, "e64_c8_shared"}, t, 5);
  for (int64_t t : {int64_t{3}, int64_t{300}}) run({256, 128, 64, 6, 2, 2, "e64_c8_shared_x2"}, t, 6);
}

TEST_F(CudaFusedMoe, WideHiddenAcrossManyGemmTiles) {
  // hidden 1024 = 8 output tiles of the down GEMM; inter 360: a partial 32-wide k tile in the down
  // GEMM and a partial 128-wide output tile (720 columns) in the gate|up GEMM.
  for (int64_t t : {int64_t{8}, int64_t{64}, int64_t{300}}) run({1024, 360, 16, 4, 0, 1, "h1024_i360"}, t, 7);
}

TEST_F(CudaFusedMoe, SizesNotMultiplesOfEightTakeTheScalarPath) {
  for (int64_t t : {int64_t{1}, int64_t{8}, int64_t{64}}) run({60, 36, 8, 2, 1, 1, "h60_i36"}, t, 8);
}

TEST_F(CudaFusedMoe, AllTokensOnTheSameExperts) {
  // One expert gets 300 rows (5 row tiles), another too, the rest none; and duplicate ids.
  const int64_t t = 300;
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < t; ++i) ids.insert(ids.end(), {5, 2});
  run({64, 32, 8, 2, 0, 1, "skewed"}, t, 9, &ids, 2);
  std::vector<int32_t> dup;
  for (int64_t i = 0; i < 40; ++i) dup.insert(dup.end(), {static_cast<int32_t>(i % 8), static_cast<int32_t>(i % 8), 7});
  run({64, 32, 8, 2, 0, 1, "duplicate_ids"}, 40, 10, &dup, 3);
}

TEST_F(CudaFusedMoe, NoColumnsGiveZeros) {
  Tensor x = gpu_->empty({4, 64}, DType::kBF16), w13 = gpu_->empty({2, 64, 64}, DType::kBF16),
         w2 = gpu_->empty({2, 64, 32}, DType::kBF16);
  gpu_->zero(x);
  Tensor ids = gpu_->empty({4, 0}, DType::kI32), w = gpu_->empty({4, 0}, DType::kF32);
  Tensor out = to_gpu(*gpu_, Tensor::from_f32(std::vector<float>(4 * 64, 3.0f), {4, 64}));
  gpu_->fused_moe(x, w13, w2, ids, w, out);
  testing::expect_equal(to_host(*gpu_, out), std::vector<float>(4 * 64, 0.0f), "C = 0");
}

}  // namespace
}  // namespace specula
