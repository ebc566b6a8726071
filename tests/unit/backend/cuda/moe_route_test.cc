// moe_route on the GPU against the CPU twin, for every MoeRouting variant: softmax (V2) and
// sigmoid (V3) scoring, with and without the correction bias, greedy and group-limited selection
// with max and top-two-sum group scores (one-expert groups included), renormalisation, scaling,
// and fused shared slots with replicas. The ids must be EQUAL (the GPU picks exactly the experts
// the CPU picks, ties to the lower id), the weights equal within fp32 rounding (the softmax sum
// runs in a different order: relative 1e-6). Logits are random, and in the tie cases drawn from a
// handful of values so that many scores tie exactly; in the near-tie cases (V2 softmax, group
// max) those values are moved by multiples of 1e-3, so that many scores are nearly tied — the
// bf16-sized router-logit gaps of the whole-model tests (deepseek_routing_pin.h), scaled down to
// a thousandth but still far wider than the few ulps expf may differ by.
#include <gtest/gtest.h>

#include <random>

#include "cuda_test_util.h"

namespace specula {
namespace {

using testing::expect_close;
using testing::expect_equal;
using testing::to_gpu;
using testing::to_host;

struct RouteCase {
  std::string name;
  int experts;
  MoeRouting routing;
  bool bias = false;
  bool ties = false;       // logits (and bias) from a few values: many exact ties
  bool near_ties = false;  // those values moved by -2e-3 ... 2e-3: near ties (softmax cases only)
};

MoeRouting routing(MoeRouting::Scoring scoring, int top_k, int groups, int topk_groups, MoeRouting::GroupScore gs,
                   bool renormalize, float scale, int shared_slots = 0, int replicas = 1, int shared_first = 0) {
  MoeRouting r;
  r.scoring = scoring;
  r.top_k = top_k;
  r.num_groups = groups;
  r.topk_groups = topk_groups;
  r.group_score = gs;
  r.renormalize = renormalize;
  r.routed_scaling_factor = scale;
  r.shared_slots = shared_slots;
  r.shared_replicas = replicas;
  r.shared_first = shared_first;
  return r;
}

constexpr auto kSoftmax = MoeRouting::Scoring::kSoftmax;
constexpr auto kSigmoid = MoeRouting::Scoring::kSigmoid;
constexpr auto kMax = MoeRouting::GroupScore::kMax;
constexpr auto kTopTwo = MoeRouting::GroupScore::kTopTwoSum;

std::vector<RouteCase> route_cases() {
  return {
      // DeepSeek-V2-Lite: softmax, greedy top-6 of 64, no renormalisation.
      {"v2_lite_greedy", 64, routing(kSoftmax, 6, 1, 1, kMax, false, 1.0f)},
      // DeepSeek-V2: group-limited greedy (8 groups of 20, 3 kept), scaled by 16.
      {"v2_group_limited", 160, routing(kSoftmax, 6, 8, 3, kMax, false, 16.0f)},
      {"v2_group_limited_renorm", 160, routing(kSoftmax, 6, 8, 3, kMax, true, 1.0f)},
      // DeepSeek-V3: sigmoid + correction bias, top-two-sum groups (8 of 32, 4 kept), top-8, renorm, 2.5.
      {"v3", 256, routing(kSigmoid, 8, 8, 4, kTopTwo, true, 2.5f), true},
      {"v3_no_bias", 256, routing(kSigmoid, 8, 8, 4, kTopTwo, true, 2.5f)},
      {"v3_fused_shared_x1", 256, routing(kSigmoid, 8, 8, 4, kTopTwo, true, 2.5f, 1, 1, 256), true},
      {"v3_fused_shared_x2", 256, routing(kSigmoid, 8, 8, 4, kTopTwo, true, 2.5f, 1, 2, 256), true},
      {"v2_lite_fused_shared_2x3", 64, routing(kSoftmax, 6, 1, 1, kMax, false, 1.0f, 2, 3, 64)},
      // The fixtures' shapes: 8 experts, groups of 2 / 4, top-2.
      {"tiny_v3_groups4", 8, routing(kSigmoid, 2, 4, 2, kTopTwo, true, 2.5f, 1, 2, 8), true},
      {"tiny_v2_groups2", 8, routing(kSoftmax, 2, 2, 1, kMax, false, 1.0f)},
      {"one_expert_groups_top_two", 8, routing(kSigmoid, 3, 8, 3, kTopTwo, false, 1.5f), true},
      {"one_expert_groups_max", 16, routing(kSoftmax, 2, 16, 5, kMax, true, 1.0f)},
      {"top1_of_256", 256, routing(kSoftmax, 1, 1, 1, kMax, false, 1.0f)},
      {"all_selected", 32, routing(kSigmoid, 32, 4, 4, kTopTwo, true, 1.0f), true},
      {"odd_expert_count", 37, routing(kSoftmax, 5, 1, 1, kMax, true, 3.0f)},
      // Exact ties: the lower id (and lower group) must win on both sides.
      {"ties_softmax", 64, routing(kSoftmax, 6, 1, 1, kMax, true, 1.0f), false, true},
      {"ties_groups_max", 64, routing(kSoftmax, 4, 8, 3, kMax, false, 1.0f), false, true},
      // (No bias here: with a bias, different (logit, bias) pairs can have mathematically equal
      // sums that fp32 rounds apart differently on each side; equal logits tie exactly on both.)
      {"ties_v3", 256, routing(kSigmoid, 8, 8, 4, kTopTwo, true, 2.5f), false, true},
      // Near ties for V2's group-limited routing (issue 7's fixture shape, and DeepSeek-V2's).
      // (Softmax with group max only: a top-two sum can bring two pairs' sums within an ulp.)
      {"near_ties_tiny_v2_groups2", 8, routing(kSoftmax, 2, 2, 1, kMax, false, 1.0f), false, false, true},
      {"near_ties_v2_group_limited", 160, routing(kSoftmax, 6, 8, 3, kMax, false, 16.0f), false, false, true},
      {"near_ties_v2_lite_greedy", 64, routing(kSoftmax, 6, 1, 1, kMax, false, 1.0f), false, false, true},
  };
}

class CudaMoeRoute : public ::testing::TestWithParam<RouteCase> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    cpu_ = make_cpu_backend(2);
    gpu_ = make_cuda_backend(0);
  }
  std::unique_ptr<Backend> cpu_, gpu_;
};

TEST_P(CudaMoeRoute, SameExpertsAndWeightsAsCpu) {
  const RouteCase& c = GetParam();
  std::mt19937 rng(static_cast<unsigned>(c.experts * 31 + c.routing.top_k));
  for (int64_t t : {1, 7, 64, 300}) {
    std::vector<float> logits(static_cast<size_t>(t * c.experts)), bias(static_cast<size_t>(c.experts));
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::uniform_int_distribution<int> few(-3, 3), nudge(-2, 2);
    for (float& l : logits) {
      if (c.near_ties) {
        l = few(rng) * 0.5f + nudge(rng) * 1e-3f;
      } else {
        l = c.ties ? few(rng) * 0.5f : normal(rng);
      }
    }
    for (float& b : bias) b = c.ties ? few(rng) * 0.125f : normal(rng) * 0.05f;
    Tensor logits_cpu = Tensor::from_f32(logits, {t, c.experts}), bias_cpu = Tensor::from_f32(bias);
    const int64_t cols = c.routing.columns();
    Tensor ids_cpu = Tensor::zeros({t, cols}, DType::kI32), w_cpu = Tensor::zeros({t, cols}, DType::kF32);
    cpu_->moe_route(logits_cpu, c.bias ? &bias_cpu : nullptr, c.routing, ids_cpu, w_cpu);

    Tensor logits_gpu = to_gpu(*gpu_, logits_cpu, DType::kF32), bias_gpu = to_gpu(*gpu_, bias_cpu, DType::kF32);
    Tensor ids_gpu = gpu_->empty({t, cols}, DType::kI32), w_gpu = gpu_->empty({t, cols}, DType::kF32);
    gpu_->moe_route(logits_gpu, c.bias ? &bias_gpu : nullptr, c.routing, ids_gpu, w_gpu);
    const std::string what = c.name + " T=" + std::to_string(t);
    std::vector<float> want_ids;
    for (int32_t id : ids_cpu.to_i32_vector()) want_ids.push_back(static_cast<float>(id));
    expect_equal(to_host(*gpu_, ids_gpu), want_ids, what + " ids");
    expect_close(to_host(*gpu_, w_gpu), w_cpu.to_f32_vector(), 1e-5, 1e-7, what + " weights");
  }
}

INSTANTIATE_TEST_SUITE_P(Routing, CudaMoeRoute, ::testing::ValuesIn(route_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(CudaMoeRouteEdge, RejectsMoreExpertsThanAWarpHolds) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  Tensor logits = gpu->empty({2, 300}, DType::kF32);
  Tensor ids = gpu->empty({2, 2}, DType::kI32), w = gpu->empty({2, 2}, DType::kF32);
  MoeRouting r;
  r.top_k = 2;
  try {
    gpu->moe_route(logits, nullptr, r, ids, w);
    FAIL() << "300 experts accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("300 experts"), std::string::npos) << e.what();
  }
}

TEST(CudaMoeRouteEdge, RejectsTopKBeyondTheKeptGroups) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  Tensor logits = gpu->empty({2, 16}, DType::kF32);
  Tensor ids = gpu->empty({2, 5}, DType::kI32), w = gpu->empty({2, 5}, DType::kF32);
  MoeRouting r = routing(kSoftmax, 5, 4, 1, kMax, false, 1.0f);  // one kept group holds 4 experts
  EXPECT_THROW(gpu->moe_route(logits, nullptr, r, ids, w), Error);
}

}  // namespace
}  // namespace specula
