// -tp on GPUs (one rank per GPU, NCCL): the embedded target split over 2 (and 4, where there are
// 4 GPUs) ranks serves transformers' greedy continuations (leaving them only at a bf16 near-tie,
// reference_fixture.h), with draft_model (on GPU 0 or split like the
// target) and eagle3 drafting for it, and with async scheduling, all with CUDA graphs (one per
// GPU, replayed together); specula-tiny-moe (DeepSeek) the same, with MTP; asking for more ranks
// than GPUs is an error at create.
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
    const std::string split_draft = draft.substr(0, draft.size() - 1) + R"(, "draft_tensor_parallel_size": )" +
                                    std::to_string(tp) + "}";
    expect_tiny_greedy_reference(engine_config(tp, split_draft), t + ", draft_model split like the target");
    expect_tiny_greedy_reference(engine_config(tp, eagle3, /*async=*/true), t + ", eagle3, async");
  }
}

// specula-tiny-moe (DeepSeek-V3 shapes: MLA split by heads, every expert by channels) over the
// GPUs, with CUDA graphs: transformers' greedy continuations, alone and with shared-expert fusion
// and its MTP layer drafting on rank 0.
TEST(CudaTensorParallel, SplitDeepseekServesTransformersGreedyOutput) {
  SKIP_WITHOUT_GPU();
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  ASSERT_TRUE(testing::have_moe()) << "committed specula-tiny-moe or its reference missing";
  const testing::GreedyReference ref = testing::read_greedy_reference(testing::moe_reference_file());
  for (int tp : {2, 4}) {
    if (tp > cuda_device_count()) continue;
    for (const std::string& spec : {std::string(), testing::mtp_spec(2)}) {
      EngineConfig c = testing::moe_engine_config(spec);
      c.device = "cuda";
      c.gpu_memory_utilization = 0.3;
      c.tensor_parallel_size = tp;
      c.shared_expert_fusion = spec.empty() ? 0 : 1;
      auto engine = create_engine(c);
      engine->start();
      const std::vector<SamplingParams> params(ref.prompts.size(),
                                               testing::greedy_params(static_cast<int>(ref.greedy[0].size())));
      const auto got = testing::run_all(*engine, ref.prompts, params, "tp");
      const std::string what = "tp " + std::to_string(tp) + " " + spec;
      for (size_t i = 0; i < ref.prompts.size(); ++i) EXPECT_EQ(got[i], ref.greedy[i]) << what << " prompt " << i;
      if (!spec.empty()) EXPECT_GT(testing::settled(*engine).spec_num_accepted_tokens, 0) << what;
      engine->shutdown();
    }
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
