// Structured outputs on the device: the CUDA sampler's grammar masks (in its counts kernel) give
// valid objects, greedy and sampled, without and with speculation (draft_model, ngram), and with
// async scheduling. Validity only: bf16 is not batch invariant, so greedy tokens may differ
// between a verification row and a plain decode row (the CPU suite compares tokens).
#include <gtest/gtest.h>

#include "unit/backend/cuda/cuda_test_util.h"
#include "unit/app/structured_output_workload.h"

namespace specula::testing {
namespace {

TEST(CudaStructuredOutputs, JsonSchemaGivesValidObjectsWithEveryMethod) {
  SKIP_WITHOUT_GPU();
  for (const std::string& spec : {std::string(), draft_spec(3), ngram_spec(3)}) {
    for (bool sampled : {false, true}) {
      for (bool async : {false, true}) {
        EngineRun r = run_requests(tiny_config(spec, "cuda"), tool_workload(sampled, 16), async);
        for (const ChoiceResult& c : r.results) {
          EXPECT_EQ(c.finish, FinishReason::kStop) << spec << " " << c.text;
          expect_valid_tool_arguments(c.text);
        }
        if (!spec.empty()) EXPECT_GT(r.metrics.spec_num_draft_tokens, 0) << spec;
      }
    }
  }
}

}  // namespace
}  // namespace specula::testing
