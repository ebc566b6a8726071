// -tp on GPUs (one rank per GPU, NCCL): the embedded target split over 2 (and 4, where there are
// 4 GPUs) ranks serves transformers' greedy continuations (the reference keeps a margin between
// the top two logits, so bf16 cannot flip them), with draft_model and eagle3 drafting for it, and
// with async scheduling; asking for more ranks than GPUs is an error at create.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "app/create_engine.h"
#include "backend/backend.h"
#include "core/error.h"
#include "engine/llm_engine.h"
#include "mtp_test_util.h"
#include "tensor_parallel_workload.h"
#include "test_paths.h"
#include "unit/backend/cuda/cuda_test_util.h"
#include "unit/spec_decode/reference_fixture.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

fs::path tiny() { return testing::models_dir() / "specula-tiny"; }

EngineConfig engine_config(int tp, const std::string& spec, bool async = false) {
  EngineConfig ec;
  ec.model = tiny().string();
  ec.device = "cuda";
  ec.tensor_parallel_size = tp;
  ec.max_num_seqs = 8;
  ec.max_model_len = 512;
  ec.max_num_batched_tokens = 64;
  ec.gpu_memory_utilization = 0.3;
  ec.speculative_config = spec;
  ec.async_scheduling = async;
  return ec;
}

using testing::expect_tiny_greedy_reference;

TEST(CudaTensorParallel, SplitTargetServesTransformersGreedyOutput) {
  SKIP_WITHOUT_GPU();
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  const std::string draft = R"({"method": "draft_model", "model": ")" +
                            (testing::models_dir() / "specula-tiny-draft").string() +
                            R"(", "num_speculative_tokens": 3, "adaptive": false})";
  const std::string eagle3 = R"({"method": "eagle3", "model": ")" +
                             (testing::models_dir() / "specula-tiny-eagle3").string() +
                             R"(", "num_speculative_tokens": 3, "adaptive": false})";
  for (int tp : {2, 4}) {
    if (tp > cuda_device_count()) continue;
    const std::string t = "tp " + std::to_string(tp);
    expect_tiny_greedy_reference(engine_config(tp, ""), t);
    expect_tiny_greedy_reference(engine_config(tp, "", /*async=*/true), t + ", async");
    expect_tiny_greedy_reference(engine_config(tp, draft), t + ", draft_model");
    expect_tiny_greedy_reference(engine_config(tp, eagle3, /*async=*/true), t + ", eagle3, async");
  }
}

TEST(CudaTensorParallel, MoreRanksThanGpusIsAnErrorAtCreate) {
  SKIP_WITHOUT_GPU();
  const int gpus = cuda_device_count();
  try {
    create_engine(engine_config(2 * gpus, ""));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tensor-parallel-size " + std::to_string(2 * gpus)), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("visible"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace specula
