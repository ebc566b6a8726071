// Async scheduling on the device: plain decode steps leave their tokens on the GPU when submit()
// returns (the CUDA sampler's results are read at the next step), speculative steps run at once.
// Either way the same workload gives the same tokens, text, finish reasons and speculative counts
// with --async-scheduling on and off (async_workload.h). Requests end on length here: one that an
// eos or a stop string ends is still in the step in flight, which changes that step's batch, and
// the device's bf16 kernels are not batch invariant (async_workload.h). For the same reason every
// sequence (n = 2 counts twice) has a seat from the start: a seat freed on length is free for
// admission a step later under async scheduling.
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
    expect_same(tiny_config("", "cuda"), Workload{16, 32, sampled, 0, false}, tiny_prompts(), /*expect_drafts=*/false);
    expect_same(tiny_config("", "cuda"), Workload{64, 128, sampled, 0, false}, tiny_prompts(), /*expect_drafts=*/false);
    expect_same(tiny_config("", "cuda"), Workload{2, 1, sampled, 0, false}, tiny_prompts(), /*expect_drafts=*/false);
  }
}

TEST(CudaAsyncScheduling, DraftModelAndNgram) {
  SKIP_WITHOUT_GPU();
  for (bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "temperature 1" : "greedy");
    expect_same(tiny_config(draft_spec(3), "cuda"), Workload{16, 32, sampled, 0, false}, tiny_prompts());
    expect_same(tiny_config(ngram_spec(4), "cuda"), Workload{16, 32, sampled, 0, false}, tiny_prompts());
  }
}

TEST(CudaAsyncScheduling, PreemptionWithASmallCache) {
  SKIP_WITHOUT_GPU();
  Workload w{12, 8, false, 16, false};
  const Outcome sync = run(tiny_config("", "cuda"), false, w, tiny_prompts());
  const Outcome async = run(tiny_config("", "cuda"), true, w, tiny_prompts());
  EXPECT_GT(async.metrics.num_preemptions, 0);
  for (const auto& [id, choices] : sync.requests)
    for (const auto& [index, r] : choices) EXPECT_TRUE(r == async.requests.at(id).at(index)) << id << " choice " << index;
}

}  // namespace
}  // namespace specula
