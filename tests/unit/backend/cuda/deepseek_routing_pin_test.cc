// RoutingPin (deepseek_routing_pin.h), on the CPU backend (no GPU needed): it records the
// reference's routing, puts the reference's experts into rows routed differently (weights from
// the pinned backend's own scores), leaves agreeing rows alone, and tells near ties (a witness
// within the bound) from real differences. The logits are the shape of deepseek_v2_group_limited
// (8 experts, 2 groups of 4, one kept, top-2, softmax) and of its layer-1 token-24 tie.
#include <gtest/gtest.h>

#include <cmath>

#include "deepseek_routing_pin.h"

namespace specula {
namespace {

using testing::RoutingPin;

MoeRouting v2_group_limited() {
  MoeRouting r;
  r.scoring = MoeRouting::Scoring::kSoftmax;
  r.top_k = 2;
  r.num_groups = 2;
  r.topk_groups = 1;
  r.group_score = MoeRouting::GroupScore::kMax;
  return r;
}

// Routes `logits` ([rows, 8]) through `backend`; returns {ids, weights}.
std::pair<std::vector<int32_t>, std::vector<float>> route(Backend& backend, const std::vector<float>& logits,
                                                          const MoeRouting& r) {
  const int64_t rows = static_cast<int64_t>(logits.size()) / 8;
  Tensor l = Tensor::from_f32(logits, {rows, 8});
  Tensor ids = Tensor::zeros({rows, r.columns()}, DType::kI32), w = Tensor::zeros({rows, r.columns()}, DType::kF32);
  backend.moe_route(l, nullptr, r, ids, w);
  return {ids.to_i32_vector(), w.to_f32_vector()};
}

// Row 0: the fixture's tie (group 1's best, expert 4, leads group 0's best, expert 1, by 0.084).
// Row 1: a clear choice.
const std::vector<float> kReference = {-0.4511f, 4.7668f, -0.5665f, -1.4064f, 4.8507f, -1.5077f, 0.3218f, -1.5738f,
                                       5.0f,     -3.0f,   2.0f,     -1.0f,    -2.0f,   0.5f,     -4.0f,   1.0f};

class RoutingPinTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cpu_ = make_cpu_backend(1);
    record_ = std::make_unique<RoutingPin>(*cpu_);
    pinned_ = std::make_unique<RoutingPin>(*cpu_);
    record_->record();
    route(*record_, kReference, v2_group_limited());
    ASSERT_EQ(record_->calls().size(), 1u);
  }
  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<RoutingPin> record_, pinned_;
};

TEST_F(RoutingPinTest, RecordsTheChosenExperts) {
  const RoutingPin::Call& c = record_->calls()[0];
  EXPECT_EQ(c.rows, 2);
  EXPECT_EQ(c.experts, 8);
  EXPECT_EQ(c.ids, (std::vector<int32_t>{4, 6, 0, 2}));
  EXPECT_EQ(c.logits, kReference);
}

TEST_F(RoutingPinTest, PinsANearTieToTheReferenceAndLeavesOtherRowsAlone) {
  std::vector<float> noisy = kReference;
  noisy[1] += 0.06f;  // expert 1 now leads: group 0 is kept, experts {1, 0}
  noisy[4] -= 0.03f;
  noisy[13] += 0.01f;  // row 1 moves a little but routes the same
  pinned_->pin(record_->calls(), {0.1});
  const auto [ids, weights] = route(*pinned_, noisy, v2_group_limited());
  ASSERT_EQ(pinned_->pinned().size(), 1u);
  const RoutingPin::Pinned& p = pinned_->pinned()[0];
  EXPECT_EQ(p.row, 0);
  EXPECT_EQ(p.own, (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(p.ref, (std::vector<int32_t>{4, 6}));
  EXPECT_TRUE(p.near_tie) << p.describe();
  EXPECT_EQ(ids, (std::vector<int32_t>{4, 6, 0, 2}));
  // The pinned row's weights: softmax of its own logits at the reference's experts.
  double sum = 0;
  for (int i = 0; i < 8; ++i) sum += std::exp(double(noisy[i]) - noisy[1]);
  EXPECT_NEAR(weights[0], std::exp(double(noisy[4]) - noisy[1]) / sum, 1e-6);
  EXPECT_NEAR(weights[1], std::exp(double(noisy[6]) - noisy[1]) / sum, 1e-6);
  // The agreeing row keeps the backend's own weights.
  const auto [own_ids, own_weights] = route(*cpu_, noisy, v2_group_limited());
  EXPECT_EQ(weights[2], own_weights[2]);
  EXPECT_EQ(weights[3], own_weights[3]);
  ASSERT_EQ(pinned_->deviations().size(), 1u);
  EXPECT_NEAR(pinned_->deviations()[0], 0.06, 1e-6);
}

TEST_F(RoutingPinTest, ADifferenceBeyondTheBoundIsNoNearTie) {
  std::vector<float> noisy = kReference;
  noisy[1] += 0.06f;
  noisy[4] -= 0.03f;
  pinned_->pin(record_->calls(), {0.02});  // the tie needs a move of about 0.03 per side
  route(*pinned_, noisy, v2_group_limited());
  ASSERT_EQ(pinned_->pinned().size(), 1u);
  EXPECT_FALSE(pinned_->pinned()[0].near_tie) << pinned_->pinned()[0].describe();
}

TEST_F(RoutingPinTest, AClearChoiceRoutedDifferentlyIsNoNearTie) {
  std::vector<float> swapped = kReference;
  std::swap(swapped[8], swapped[15]);  // row 1: expert 7 now leads by 4 logits
  pinned_->pin(record_->calls(), {0.5});
  route(*pinned_, swapped, v2_group_limited());
  ASSERT_EQ(pinned_->pinned().size(), 1u);
  EXPECT_EQ(pinned_->pinned()[0].row, 1);
  EXPECT_FALSE(pinned_->pinned()[0].near_tie) << pinned_->pinned()[0].describe();
}

TEST_F(RoutingPinTest, PassThroughChangesNothing) {
  std::vector<float> noisy = kReference;
  noisy[1] += 0.06f;
  pinned_->pass_through();
  const auto got = route(*pinned_, noisy, v2_group_limited());
  const auto want = route(*cpu_, noisy, v2_group_limited());
  EXPECT_EQ(got.first, want.first);
  EXPECT_EQ(got.second, want.second);
  EXPECT_TRUE(pinned_->pinned().empty());
}

TEST_F(RoutingPinTest, ACallBeyondTheRecordIsAnError) {
  pinned_->pin(record_->calls(), {});
  route(*pinned_, kReference, v2_group_limited());
  EXPECT_THROW(route(*pinned_, kReference, v2_group_limited()), Error);
}

}  // namespace
}  // namespace specula
