// Async scheduling on the device: plain decode steps leave their tokens on the GPU when submit()
// returns (the CUDA sampler's results are read at the next step), speculative steps run at once.
// Either way the same workload gives the same tokens, text, finish reasons and speculative counts
// with --async-scheduling on and off (async_workload.h).
#include <gtest/gtest.h>

#include "unit/app/async_workload.h"
#include "unit/backend/cuda/cuda_test_util.h"

namespace specula {
namespace {

using namespace specula::testing;

TEST(CudaAsyncScheduling, WithoutSpeculation) {
  SKIP_WITHOUT_GPU();
  for (bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "temperature 1" : "greedy");
    expect_same(tiny_config("", "cuda"), Workload{16, 16, sampled, 0, !sampled}, tiny_prompts(), /*expect_drafts=*/false);
    expect_same(tiny_config("", "cuda"), Workload{64, 64, sampled, 0, !sampled}, tiny_prompts(), /*expect_drafts=*/false);
    expect_same(tiny_config("", "cuda"), Workload{3, 1, sampled}, tiny_prompts(), /*expect_drafts=*/false);
  }
}

TEST(CudaAsyncScheduling, DraftModelAndNgram) {
  SKIP_WITHOUT_GPU();
  for (bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "temperature 1" : "greedy");
    expect_same(tiny_config(draft_spec(3), "cuda"), Workload{16, 16, sampled, 0, !sampled}, tiny_prompts());
    expect_same(tiny_config(ngram_spec(4), "cuda"), Workload{16, 16, sampled}, tiny_prompts());
  }
}

TEST(CudaAsyncScheduling, PreemptionWithASmallCache) {
  SKIP_WITHOUT_GPU();
  Workload w{12, 8, false, 16};
  const Outcome sync = run(tiny_config("", "cuda"), false, w, tiny_prompts());
  const Outcome async = run(tiny_config("", "cuda"), true, w, tiny_prompts());
  EXPECT_GT(async.metrics.num_preemptions, 0);
  for (const auto& [id, choices] : sync.requests)
    for (const auto& [index, r] : choices) EXPECT_TRUE(r == async.requests.at(id).at(index)) << id << " choice " << index;
}

}  // namespace
}  // namespace specula
