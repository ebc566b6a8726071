// Async scheduling on the device: plain decode steps leave their tokens on the GPU when submit()
// returns (the CUDA sampler's results are read at the next step), speculative steps run at once.
// Either way the same workload gives the same tokens, text, finish reasons and speculative counts
// with --async-scheduling on and off (async_workload.h). Requests end on length here: one that an
// eos or a stop string ends is still in the step in flight, which changes that step's batch, and
// the device's bf16 kernels are not batch invariant (async_workload.h). For the same reason every
// sequence (n = 2 counts twice) has a seat from the start: a seat freed on length is free for
// admission a step later under async scheduling.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string_view>

#include "unit/app/async_stress.h"
#include "unit/app/async_workload.h"
#include "unit/app/mtp_test_util.h"
#include "unit/app/scheduled_speculator.h"
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

// Hidden-state proposers launch their greedy drafts ahead of the verification (the catch-up of
// every verified row, moved on the device by what was accepted): the same tokens and counts as
// the synchronous engine, on the catch-up and chain graphs.
TEST(CudaAsyncScheduling, Eagle3AndMtpLaunchedAhead) {
  SKIP_WITHOUT_GPU();
  for (int k : {1, 3, 5}) {
    SCOPED_TRACE("k=" + std::to_string(k));
    expect_same(tiny_config(eagle3_spec(k), "cuda"), Workload{4, 1, false, 0, false, true}, tiny_prompts());
    if (!have_moe()) continue;
    EngineConfig ec = moe_engine_config(mtp_spec(k));
    ec.device = "cuda";
    ec.num_gpu_blocks_override = 1024;
    ec.enable_prefix_caching = false;
    expect_same(ec, Workload{4, 1, false, 0, false, true}, moe_prompts());
  }
}

// A depth that changes every step, launched ahead where it can (scheduled_speculator.h), on the
// catch-up and chain graphs.
TEST(CudaAsyncScheduling, DepthsThatChangeEveryStepLaunchedAhead) {
  SKIP_WITHOUT_GPU();
  const Workload w{12, 1, false, 0, false, true};
  expect_same(tiny_config(eagle3_spec(5), "cuda"), w, tiny_prompts(), true, scheduled_speculator(eagle3_spec(5), tiny()));
  expect_same(tiny_config(draft_spec(5), "cuda"), w, tiny_prompts(), true, scheduled_speculator(draft_spec(5), tiny()));
  if (!have_moe()) return;
  EngineConfig ec = moe_engine_config(mtp_spec(5));
  ec.device = "cuda";
  ec.num_gpu_blocks_override = 1024;
  ec.enable_prefix_caching = false;
  expect_same(ec, w, moe_prompts(), true, scheduled_speculator(mtp_spec(5), moe_dir()));
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

// 1000 requests per configuration (every method, async_stress.h) of random arrivals, lengths,
// sampling and client aborts with a step always in flight; tools/gpu/run_tests.sh runs a shorter
// one under compute-sanitizer memcheck, synccheck and racecheck too.
TEST(CudaAsyncScheduling, StressRandomArrivalsAndAborts) {
  SKIP_WITHOUT_GPU();
  const int n = std::getenv("SPECULA_STRESS_REQUESTS") ? std::atoi(std::getenv("SPECULA_STRESS_REQUESTS")) : 1000;
  // SPECULA_STRESS_EAGER=1: no CUDA graphs (compute-sanitizer's racecheck stopped the process at
  // their capture on the H200); SPECULA_STRESS_CONFIG: only the configurations whose name holds it.
  const bool eager = std::getenv("SPECULA_STRESS_EAGER") && std::string_view(std::getenv("SPECULA_STRESS_EAGER")) == "1";
  const char* only = std::getenv("SPECULA_STRESS_CONFIG");
  for (StressConfig& c : stress_configs("cuda")) {
    if (only && c.name.find(only) == std::string::npos) continue;
    SCOPED_TRACE(c.name);
    c.engine.enforce_eager = eager;
    const StressWorkload w{n, 32, 0.25, 11};
    expect_stress_invariants(run_stress(c.engine, w, c.prompts), w);
  }
}

}  // namespace
}  // namespace specula
