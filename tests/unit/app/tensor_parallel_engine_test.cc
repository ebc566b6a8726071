// -tp through LLMEngine::create on the embedded target (CPU, the real checkpoint and tokenizer):
// split over 2 and 4 ranks (4 ranks share its 2 kv heads), greedy output is transformers'
// continuation, without speculation and with draft_model, ngram and eagle3 drafting for the
// split target (the draft and the head run on rank 0's backend; a random EAGLE-1 head reads the
// split target's lm_head put together), with async scheduling too; and
// the embedded DeepSeek-V3 target split likewise, with MTP.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "app/create_engine.h"
#include "core/error.h"
#include "eagle_head_files.h"
#include "engine/llm_engine.h"
#include "model/config.h"
#include "mtp_test_util.h"
#include "tensor_parallel_workload.h"
#include "test_paths.h"
#include "unit/spec_decode/reference_fixture.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

fs::path tiny() { return testing::models_dir() / "specula-tiny"; }
fs::path tiny_draft() { return testing::models_dir() / "specula-tiny-draft"; }
fs::path eagle3_head() { return testing::models_dir() / "specula-tiny-eagle3"; }
fs::path reference_file() { return testing::fixtures_dir() / "embedded" / "specula-tiny" / "reference.safetensors"; }

bool have_models() {
  return fs::exists(tiny() / "model.safetensors") && fs::exists(tiny_draft() / "model.safetensors") &&
         fs::exists(eagle3_head() / "model.safetensors") && fs::exists(reference_file());
}

std::string split_draft_spec(int ranks) {
  return R"({"method": "draft_model", "model": ")" + tiny_draft().string() +
         R"(", "num_speculative_tokens": 3, "adaptive": false, "draft_tensor_parallel_size": )" +
         std::to_string(ranks) + "}";
}

EngineConfig engine_config(int tp, const std::string& spec, bool async = false) {
  EngineConfig ec;
  ec.model = tiny().string();
  ec.device = "cpu";
  ec.cpu_threads = 1;
  ec.tensor_parallel_size = tp;
  ec.max_num_seqs = 8;
  ec.max_model_len = 512;
  ec.max_num_batched_tokens = 64;  // chunked prefill beside decodes
  ec.speculative_config = spec;
  ec.async_scheduling = async;
  return ec;
}

using testing::expect_tiny_greedy_reference;

TEST(TensorParallelEngine, SplitTargetKeepsTransformersGreedyOutput) {
  ASSERT_TRUE(have_models()) << "committed embedded models or reference missing";
  for (int tp : {2, 4}) expect_tiny_greedy_reference(engine_config(tp, ""), "tp " + std::to_string(tp));
  expect_tiny_greedy_reference(engine_config(2, "", /*async=*/true), "tp 2, async scheduling");
}

TEST(TensorParallelEngine, SpeculationDraftsForTheSplitTarget) {
  ASSERT_TRUE(have_models()) << "committed embedded models or reference missing";
  const std::vector<std::string> specs = {
      R"({"method": "draft_model", "model": ")" + tiny_draft().string() +
          R"(", "num_speculative_tokens": 3, "adaptive": false})",
      R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4, "adaptive": false})",
      R"({"method": "eagle3", "model": ")" + eagle3_head().string() + R"(", "num_speculative_tokens": 3, "adaptive": false})",
  };
  for (const std::string& spec : specs) expect_tiny_greedy_reference(engine_config(2, spec), "tp 2 " + spec);
  // The draft model split like the target (draft_tensor_parallel_size = the target's size).
  for (int tp : {2, 4})
    expect_tiny_greedy_reference(engine_config(tp, split_draft_spec(tp), /*async=*/tp == 4),
                                 "tp " + std::to_string(tp) + ", draft split over as many ranks");
  // EAGLE-1 drafts through the target's lm_head: the split target lends its ranks' rows put together.
  testing::RandomEagleHead eagle1;
  eagle1.eagle3 = false;
  const fs::path head = fs::temp_directory_path() / ("specula_tp_eagle1_" + std::to_string(::getpid()));
  fs::remove_all(head);
  testing::write_random_eagle_head(head, load_model_config(tiny()), eagle1);
  expect_tiny_greedy_reference(
      engine_config(4, R"({"method": "eagle", "model": ")" + head.string() +
                           R"(", "num_speculative_tokens": 2, "adaptive": false})"),
      "tp 4, random EAGLE-1 head", /*drafts_accepted=*/false);
  fs::remove_all(head);
  expect_tiny_greedy_reference(engine_config(4, specs[0], /*async=*/true), "tp 4, async, " + specs[0]);
}

// specula-tiny-moe (DeepSeek-V3: MLA, 8 routed experts + 1 shared, one MTP layer) split over 2
// and 4 ranks: transformers' greedy continuations, with shared-expert fusion, and with its MTP
// layer drafting on rank 0 (the split target lends its embedding and lm_head put together).
TEST(TensorParallelEngine, SplitDeepseekKeepsTransformersGreedyOutput) {
  ASSERT_TRUE(testing::have_moe()) << "committed specula-tiny-moe or its reference missing";
  const testing::GreedyReference ref = testing::read_greedy_reference(testing::moe_reference_file());
  for (int tp : {2, 4}) {
    for (const std::string& spec : {std::string(), testing::mtp_spec(2)}) {
      for (int fusion : {0, 1}) {
        EngineConfig c = testing::moe_engine_config(spec);
        c.tensor_parallel_size = tp;
        c.cpu_threads = 1;
        c.shared_expert_fusion = fusion;
        auto engine = create_engine(c);
        engine->start();
        const std::vector<SamplingParams> params(ref.prompts.size(),
                                                 testing::greedy_params(static_cast<int>(ref.greedy[0].size())));
        const auto got = testing::run_all(*engine, ref.prompts, params, "tp");
        const std::string what = "tp " + std::to_string(tp) + " fusion " + std::to_string(fusion) + " " + spec;
        for (size_t i = 0; i < ref.prompts.size(); ++i) EXPECT_EQ(got[i], ref.greedy[i]) << what << " prompt " << i;
        if (!spec.empty()) EXPECT_GT(testing::settled(*engine).spec_num_accepted_tokens, 0) << what;
        engine->shutdown();
      }
    }
  }
}

TEST(TensorParallelEngine, WhatCannotBeSplitIsAnErrorAtCreate) {
  ASSERT_TRUE(have_models()) << "committed embedded models or reference missing";
  auto error_of = [](const EngineConfig& c) -> std::string {
    try {
      create_engine(c);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  // specula-tiny: 8 query heads, 2 kv heads, vocabulary 8192.
  EXPECT_NE(error_of(engine_config(3, "")).find("num_attention_heads (8) is not divisible by 3"), std::string::npos);
  EXPECT_NE(error_of(engine_config(0, "")).find("--tensor-parallel-size must be positive"), std::string::npos);
  EXPECT_NE(error_of(engine_config(16, "")).find("num_attention_heads (8) is not divisible by 16"), std::string::npos);
  EXPECT_NE(error_of(engine_config(2, split_draft_spec(4)))
                .find("draft_tensor_parallel_size=4 must be 1 or the target's --tensor-parallel-size (2)"),
            std::string::npos);
}

}  // namespace
}  // namespace specula
