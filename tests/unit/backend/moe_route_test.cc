// moe_route against naive references written the way transformers 5 writes the two routers
// (DeepseekV2Moe.route_tokens_to_experts: softmax, greedy or group-limited with max group scores
// and zero-filled masks; DeepseekV3MoE.route_tokens_to_experts: sigmoid, bias for the choice
// only, top-2-sum group scores, -inf masks, renormalisation, scaling), in double, plus the
// columns shared-expert fusion appends.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "backend/backend.h"
#include "cpu_test_util.h"

namespace specula {
namespace {

using testing::random_floats;

// Indices of the k largest values, best first (ties: lower index).
std::vector<int> topk(const std::vector<double>& v, int k) {
  std::vector<int> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return v[a] > v[b]; });
  idx.resize(k);
  return idx;
}

struct Routed {
  std::vector<int> ids;
  std::vector<double> weights;
};

// DeepSeek-V2: scores = softmax; group_limited_greedy keeps the topk_group groups with the
// highest max score and zeroes the others' scores; weights are the (masked) scores * scaling.
Routed v2_reference(const float* logits, int e, int k, bool group_limited, int n_group, int topk_group, double scale) {
  std::vector<double> s(e);
  double mx = *std::max_element(logits, logits + e), sum = 0;
  for (int i = 0; i < e; ++i) sum += (s[i] = std::exp(double(logits[i]) - mx));
  for (auto& x : s) x /= sum;
  std::vector<double> tmp = s;
  if (group_limited) {
    const int g = e / n_group;
    std::vector<double> group(n_group);
    for (int j = 0; j < n_group; ++j) group[j] = *std::max_element(s.begin() + j * g, s.begin() + (j + 1) * g);
    std::vector<int> keep = topk(group, topk_group);
    for (int j = 0; j < n_group; ++j)
      if (std::find(keep.begin(), keep.end(), j) == keep.end()) std::fill_n(tmp.begin() + j * g, g, 0.0);
  }
  Routed r;
  r.ids = topk(tmp, k);
  for (int i : r.ids) r.weights.push_back(tmp[i] * scale);
  return r;
}

// DeepSeek-V3: scores = sigmoid; choice = scores + bias; group score = sum of the group's top-2
// choices; other groups' choices -> -inf; weights = unbiased scores, renormalised, * scaling.
Routed v3_reference(const float* logits, const float* bias, int e, int k, int n_group, int topk_group, bool norm,
                    double scale) {
  std::vector<double> s(e), c(e);
  for (int i = 0; i < e; ++i) {
    s[i] = 1.0 / (1.0 + std::exp(-double(logits[i])));
    c[i] = s[i] + bias[i];
  }
  const int g = e / n_group;
  std::vector<double> group(n_group);
  for (int j = 0; j < n_group; ++j) {
    std::vector<double> part(c.begin() + j * g, c.begin() + (j + 1) * g);
    std::vector<int> two = topk(part, 2);
    group[j] = part[two[0]] + part[two[1]];
  }
  std::vector<int> keep = topk(group, topk_group);
  for (int j = 0; j < n_group; ++j)
    if (std::find(keep.begin(), keep.end(), j) == keep.end())
      std::fill_n(c.begin() + j * g, g, -std::numeric_limits<double>::infinity());
  Routed r;
  r.ids = topk(c, k);
  double sum = 0;
  for (int i : r.ids) sum += s[i];
  for (int i : r.ids) r.weights.push_back((norm ? s[i] / (sum + 1e-20) : s[i]) * scale);
  return r;
}

struct Output {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Output route(Backend& be, const std::vector<float>& logits, int t, int e, const MoeRouting& p,
             const std::vector<float>* bias = nullptr) {
  Tensor l = Tensor::from_f32(logits, {t, e});
  Tensor b = bias ? Tensor::from_f32(*bias) : Tensor();
  Tensor ids = Tensor::empty({t, p.columns()}, DType::kI32);
  Tensor w = Tensor::empty({t, p.columns()}, DType::kF32);
  be.moe_route(l, bias ? &b : nullptr, p, ids, w);
  return {ids.to_i32_vector(), w.to_f32_vector()};
}

void expect_row(const Output& got, int row, int cols, const Routed& want, const std::string& what) {
  for (size_t k = 0; k < want.ids.size(); ++k) {
    EXPECT_EQ(got.ids[row * cols + k], want.ids[k]) << what << " row " << row << " slot " << k;
    EXPECT_NEAR(got.weights[row * cols + k], want.weights[k], 1e-6 * std::max(1.0, std::fabs(want.weights[k])))
        << what << " row " << row << " slot " << k;
  }
}

TEST(MoeRoute, V2GreedySoftmaxMatchesReference) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(1);
  const int t = 37, e = 64, k = 6;
  auto logits = random_floats(t * e, rng, 3.0f);
  MoeRouting p;
  p.scoring = MoeRouting::Scoring::kSoftmax;
  p.top_k = k;
  p.routed_scaling_factor = 16.0f;
  Output got = route(*be, logits, t, e, p);
  for (int r = 0; r < t; ++r)
    expect_row(got, r, k, v2_reference(&logits[r * e], e, k, false, 1, 1, 16.0), "v2 greedy");
}

TEST(MoeRoute, V2GroupLimitedGreedyMatchesReference) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(2);
  const int t = 41, e = 32, k = 3;
  auto logits = random_floats(t * e, rng, 3.0f);
  for (auto [groups, kept] : {std::pair{4, 1}, std::pair{8, 3}, std::pair{2, 2}}) {
    MoeRouting p;
    p.top_k = k;
    p.num_groups = groups;
    p.topk_groups = kept;
    p.group_score = MoeRouting::GroupScore::kMax;
    p.routed_scaling_factor = 1.5f;
    Output got = route(*be, logits, t, e, p);
    for (int r = 0; r < t; ++r)
      expect_row(got, r, k, v2_reference(&logits[r * e], e, k, true, groups, kept, 1.5), "v2 group-limited");
  }
}

TEST(MoeRoute, V3SigmoidWithBiasForChoiceOnlyMatchesReference) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(3);
  const int t = 29, e = 64, k = 8;
  auto logits = random_floats(t * e, rng, 4.0f);
  // A bias as large as the scores, so that selecting by biased scores visibly differs from
  // selecting by the raw ones (and weights must come from the raw ones).
  auto bias = random_floats(e, rng, 0.5f);
  for (bool norm : {true, false}) {
    for (auto [groups, kept] : {std::pair{8, 4}, std::pair{1, 1}, std::pair{4, 2}}) {
      MoeRouting p;
      p.scoring = MoeRouting::Scoring::kSigmoid;
      p.top_k = k;
      p.num_groups = groups;
      p.topk_groups = kept;
      p.group_score = MoeRouting::GroupScore::kTopTwoSum;
      p.renormalize = norm;
      p.routed_scaling_factor = 2.5f;
      Output got = route(*be, logits, t, e, p, &bias);
      for (int r = 0; r < t; ++r)
        expect_row(got, r, k, v3_reference(&logits[r * e], bias.data(), e, k, groups, kept, norm, 2.5), "v3");
    }
  }
}

TEST(MoeRoute, BiasChangesTheChoiceButNotTheWeightsSource) {
  // Expert 0 has the highest raw score, but a strongly negative bias removes it from the choice.
  auto be = make_cpu_backend(1);
  std::vector<float> logits = {3.0f, 1.0f, 0.5f, -1.0f};
  std::vector<float> bias = {-2.0f, 0.0f, 0.0f, 0.0f};
  MoeRouting p;
  p.scoring = MoeRouting::Scoring::kSigmoid;
  p.top_k = 2;
  p.group_score = MoeRouting::GroupScore::kTopTwoSum;
  Output got = route(*be, logits, 1, 4, p, &bias);
  EXPECT_EQ(got.ids, (std::vector<int32_t>{1, 2}));
  EXPECT_FLOAT_EQ(got.weights[0], 1.0f / (1.0f + std::exp(-1.0f)));
  EXPECT_FLOAT_EQ(got.weights[1], 1.0f / (1.0f + std::exp(-0.5f)));
}

TEST(MoeRoute, SharedExpertFusionAppendsOneReplicaPerRowWithUnitWeight) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(4);
  const int t = 10, e = 16, k = 4;
  auto logits = random_floats(t * e, rng, 2.0f);
  auto bias = random_floats(e, rng, 0.1f);
  for (auto [slots, replicas] : {std::pair{1, 1}, std::pair{1, 2}, std::pair{2, 3}}) {
    MoeRouting p;
    p.scoring = MoeRouting::Scoring::kSigmoid;
    p.top_k = k;
    p.num_groups = 4;
    p.topk_groups = 2;
    p.group_score = MoeRouting::GroupScore::kTopTwoSum;
    p.renormalize = true;
    p.routed_scaling_factor = 2.5f;
    p.shared_slots = slots;
    p.shared_replicas = replicas;
    p.shared_first = e;
    const int cols = k + slots;
    Output got = route(*be, logits, t, e, p, &bias);
    for (int r = 0; r < t; ++r) {
      // The routed columns are untouched by fusion (scaled as before)...
      expect_row(got, r, cols, v3_reference(&logits[r * e], bias.data(), e, k, 4, 2, true, 2.5), "fused routed");
      // ...and the shared ones name replica r % replicas, part j, with weight exactly 1.
      for (int j = 0; j < slots; ++j) {
        EXPECT_EQ(got.ids[r * cols + k + j], e + (r % replicas) * slots + j);
        EXPECT_EQ(got.weights[r * cols + k + j], 1.0f);
      }
    }
  }
}

TEST(MoeRoute, RejectsImpossibleParameters) {
  auto be = make_cpu_backend(1);
  std::vector<float> logits(2 * 8, 0.5f);
  MoeRouting p;
  p.top_k = 3;
  p.num_groups = 4;
  p.topk_groups = 1;  // only 2 selectable experts
  EXPECT_THROW(route(*be, logits, 2, 8, p), Error);
  p.num_groups = 3;  // does not divide 8
  p.top_k = 1;
  EXPECT_THROW(route(*be, logits, 2, 8, p), Error);
  MoeRouting ok;
  ok.top_k = 2;
  Tensor l = Tensor::from_f32(logits, {2, 8});
  Tensor ids = Tensor::empty({2, 3}, DType::kI32), w = Tensor::empty({2, 3}, DType::kF32);
  EXPECT_THROW(be->moe_route(l, nullptr, ok, ids, w), Error);  // 3 columns for top_k 2
}

}  // namespace
}  // namespace specula
