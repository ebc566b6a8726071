// Draft-model speculation with real architectures (tests/fixtures/models, written by
// transformers; random weights, vocabulary 320): the target's greedy continuation must equal
// transformers' whatever the draft, including a draft of another architecture (an MLA target with
// a GQA draft: different KV layouts on the same block tables), under chunked prefill, prefix-cache
// hits and preemption.
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/engine_core.h"
#include "sampling/sampler.h"
#include "unit/engine/engine_fakes.h"
#include "model/weight_source.h"
#include "spec_decode/draft_model_proposer.h"
#include "spec_decode/adaptive_speculator.h"
#include "test_paths.h"
#include "unit/spec_decode/reference_fixture.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

struct SpecRun {
  std::vector<std::vector<int32_t>> tokens;
  SchedulerStats stats;
};

std::unique_ptr<Model> load(const std::string& name, Backend& backend) {
  const fs::path dir = testing::fixtures_dir() / "models" / name;
  return create_model(load_model_config(dir), *open_safetensors_checkpoint(dir), backend);
}

SpecRun run_greedy(const std::string& target_name, const std::string& draft_name, const std::vector<std::vector<int32_t>>& prompts,
               int max_tokens, int budget, int num_blocks, int k) {
  auto backend = make_cpu_backend(0);
  std::unique_ptr<Model> target = load(target_name, *backend);
  EngineCoreConfig c;
  c.max_model_len = 128;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = budget;
  c.block_size = 16;
  c.num_blocks = num_blocks;
  c.vocab_size = target->config().vocab_size;
  c.num_speculative_tokens = k;
  auto sampler = make_cpu_sampler(*backend);
  ModelRunnerConfig rc;
  rc.max_num_seqs = c.max_num_seqs;
  rc.max_num_batched_tokens = c.max_num_batched_tokens;
  rc.max_model_len = c.max_model_len;
  rc.block_size = c.block_size;
  rc.num_blocks = c.num_blocks;
  rc.num_speculative_tokens = k;
  ModelRunner runner(*target, *backend, *sampler, rc);
  DraftModelProposerConfig dc;
  dc.num_speculative_tokens = k;
  dc.max_num_seqs = c.max_num_seqs;
  dc.max_num_batched_tokens = c.max_num_batched_tokens;
  dc.max_model_len = c.max_model_len;
  dc.draft_max_model_len = c.max_model_len;
  auto proposer = std::make_unique<DraftModelProposer>(load(draft_name, *backend), *backend,
                                                       make_cpu_draft_sampler(*backend), dc);
  proposer->allocate_kv_cache(c.num_blocks, c.block_size);
  AdaptiveSpeculator speculator(std::move(proposer), AdaptiveSpeculatorConfig{k, /*adaptive=*/false});
  runner.set_speculator(&speculator);
  testing::FakeTokenizer tok(c.vocab_size);
  EngineCore core(c, runner, tok);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    streams.push_back(std::make_shared<RequestStream>());
    core.add_request(NewRequest{"r" + std::to_string(i), prompts[i], p}, streams.back());
  }
  while (core.step()) {
  }
  SpecRun run;
  run.tokens.resize(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestOutput o;
    while (streams[i]->pop(&o, std::chrono::milliseconds(0))) {
      EXPECT_FALSE(o.error.has_value()) << *o.error;
      for (const ChoiceDelta& d : o.choices) run.tokens[i].insert(run.tokens[i].end(), d.token_ids.begin(), d.token_ids.end());
    }
  }
  EXPECT_EQ(core.scheduler().kv_cache().num_free_blocks(), c.num_blocks);
  run.stats = core.scheduler().stats();
  return run;
}

struct Pair {
  const char* target;
  const char* draft;
};

class SpecFixturePair : public ::testing::TestWithParam<Pair> {};

TEST_P(SpecFixturePair, GreedyEqualsTransformers) {
  const Pair pair = GetParam();
  const testing::GreedyReference ref =
      testing::read_greedy_reference(testing::fixtures_dir() / "models" / pair.target / "reference.safetensors");
  ASSERT_FALSE(ref.prompts.empty());
  const int n = static_cast<int>(ref.greedy[0].size());
  // Every prompt twice (prefix-cache hits), in chunks of 16 tokens with verifications mixed in.
  std::vector<std::vector<int32_t>> prompts = ref.prompts;
  prompts.insert(prompts.end(), ref.prompts.begin(), ref.prompts.end());
  const SpecRun together = run_greedy(pair.target, pair.draft, prompts, n, /*budget=*/16, /*num_blocks=*/64, /*k=*/3);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(together.tokens[i], ref.greedy[i % ref.prompts.size()]) << pair.target << " <- " << pair.draft << " " << i;
  EXPECT_GT(together.stats.spec_num_draft_tokens, 0);
  // A cache of 8 blocks of 16 cannot hold all four requests: preemption and recomputation.
  const SpecRun tight = run_greedy(pair.target, pair.draft, prompts, n, /*budget=*/32, /*num_blocks=*/8, /*k=*/2);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(tight.tokens[i], ref.greedy[i % ref.prompts.size()]) << pair.target << " <- " << pair.draft << " " << i;
  EXPECT_GT(tight.stats.num_preemptions, 0);
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, SpecFixturePair,
                         ::testing::Values(Pair{"llama", "llama"}, Pair{"llama", "qwen2_bias_tied"},
                                           Pair{"qwen3_qknorm_headdim", "mistral_sharded"},
                                           Pair{"deepseek_v3", "llama3_rope_new_style"},
                                           Pair{"deepseek_v2_greedy", "deepseek_v3_no_qlora"}),
                         [](const ::testing::TestParamInfo<Pair>& info) {
                           return std::string(info.param.target) + "_from_" + info.param.draft;
                         });

TEST(SpecFixture, TheTargetAsItsOwnDraftIsAlwaysAccepted) {
  const testing::GreedyReference ref =
      testing::read_greedy_reference(testing::fixtures_dir() / "models" / "qwen3_qknorm_headdim" / "reference.safetensors");
  const SpecRun run = run_greedy("qwen3_qknorm_headdim", "qwen3_qknorm_headdim", ref.prompts,
                             static_cast<int>(ref.greedy[0].size()), 64, 64, 4);
  for (size_t i = 0; i < ref.prompts.size(); ++i) EXPECT_EQ(run.tokens[i], ref.greedy[i]);
  EXPECT_GT(run.stats.spec_num_draft_tokens, 20);
  EXPECT_EQ(run.stats.spec_num_accepted_tokens, run.stats.spec_num_draft_tokens);
}

}  // namespace
}  // namespace specula
