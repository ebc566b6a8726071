#include "engine/async_scheduling_default.h"

#include <gtest/gtest.h>

namespace specula {
namespace {

AsyncSchedulingFacts one_gpu() {
  return {/*on_cuda=*/true, /*speculative=*/false, /*drafts_on_device=*/false, /*tensor_parallel_size=*/1, false};
}

TEST(AsyncSchedulingDefault, OnForOneGpuWithGraphsAndNoSpeculation) {
  const AsyncSchedulingChoice c = choose_async_scheduling(std::nullopt, one_gpu());
  EXPECT_TRUE(c.on);
  EXPECT_NE(c.reason.find("default"), std::string::npos) << c.reason;
  EXPECT_NE(c.reason.find("--no-async-scheduling"), std::string::npos) << c.reason;
}

// draft_model, eagle3 and mtp leave greedy drafts on the device for the next step: measured faster
// at concurrency 1 to 256 (docs/PERFORMANCE.md).
TEST(AsyncSchedulingDefault, OnWithAProposerWhoseDraftsStayOnTheDevice) {
  AsyncSchedulingFacts spec = one_gpu();
  spec.speculative = true;
  spec.drafts_on_device = true;
  const AsyncSchedulingChoice c = choose_async_scheduling(std::nullopt, spec);
  EXPECT_TRUE(c.on);
  EXPECT_NE(c.reason.find("drafts chained on the device"), std::string::npos) << c.reason;
  spec.tensor_parallel_size = 2;
  EXPECT_FALSE(choose_async_scheduling(std::nullopt, spec).on);
}

TEST(AsyncSchedulingDefault, EachUnmeasuredCaseIsOffAndNamed) {
  AsyncSchedulingFacts cpu = one_gpu();
  cpu.on_cuda = false;
  AsyncSchedulingFacts spec = one_gpu();
  spec.speculative = true;
  AsyncSchedulingFacts tp = one_gpu();
  tp.tensor_parallel_size = 2;
  AsyncSchedulingFacts eager = one_gpu();
  eager.enforce_eager = true;
  const std::pair<AsyncSchedulingFacts, const char*> cases[] = {
      {cpu, "CPU"}, {spec, "drafts are made on the host"}, {tp, "tensor parallel"}, {eager, "--enforce-eager"}};
  for (const auto& [facts, named] : cases) {
    const AsyncSchedulingChoice c = choose_async_scheduling(std::nullopt, facts);
    EXPECT_FALSE(c.on) << named;
    EXPECT_NE(c.reason.find(named), std::string::npos) << c.reason;
    EXPECT_NE(c.reason.find("--async-scheduling"), std::string::npos) << c.reason;
  }
}

TEST(AsyncSchedulingDefault, TheFlagWinsEitherWay) {
  AsyncSchedulingFacts spec = one_gpu();
  spec.speculative = true;
  EXPECT_TRUE(choose_async_scheduling(true, spec).on);
  EXPECT_EQ(choose_async_scheduling(true, spec).reason, "on (--async-scheduling)");
  EXPECT_FALSE(choose_async_scheduling(false, one_gpu()).on);
  EXPECT_EQ(choose_async_scheduling(false, one_gpu()).reason, "off (--no-async-scheduling)");
}

}  // namespace
}  // namespace specula
