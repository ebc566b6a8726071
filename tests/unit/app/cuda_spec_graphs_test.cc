// CUDA graphs of speculative steps: the target's verification forwards (every request verifying
// the same number of drafts) and the draft model's / MTP's draft steps replay captured graphs, and
// greedy output stays token for token transformers' continuation (which is also the output
// without speculation; up to a bf16 near-tie, reference_fixture.h), with graphs and with
// enforce_eager, alone and in a mixed batch; on any prompts, graphs give the eager engine's tokens.
#include <gtest/gtest.h>

#include <thread>

#include "sampling/device_sampler.h"
#include "engine/engine_core.h"
#include "app/create_engine.h"
#include "engine/llm_engine.h"
#include "model/deepseek_mtp.h"
#include "model/model.h"
#include "model/weight_source.h"
#include "sampling/device_rejection_sampler.h"
#include "sampling/device_draft_sampler.h"
#include "spec_decode/draft_model_proposer.h"
#include "sampling/draft_sampler.h"
#include "spec_decode/mtp_proposer.h"
#include "spec_decode/adaptive_speculator.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"
#include "unit/backend/cuda/cuda_test_util.h"
#include "unit/engine/greedy_streams.h"
#include "unit/spec_decode/reference_fixture.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

fs::path tiny() { return testing::models_dir() / "specula-tiny"; }
fs::path tiny_draft() { return testing::models_dir() / "specula-tiny-draft"; }
fs::path tiny_moe() { return testing::models_dir() / "specula-tiny-moe"; }

testing::GreedyReference reference(const char* model) {
  return testing::read_greedy_reference(testing::fixtures_dir() / "embedded" / model / "reference.safetensors");
}

std::string draft_spec(int k) {
  return R"({"method": "draft_model", "model": ")" + tiny_draft().string() +
         R"(", "num_speculative_tokens": )" + std::to_string(k) + R"(, "adaptive": false})";
}
std::string eagle3_spec(int k) {
  return R"({"method": "eagle3", "model": ")" + (testing::models_dir() / "specula-tiny-eagle3").string() +
         R"(", "num_speculative_tokens": )" + std::to_string(k) + R"(, "adaptive": false})";
}
bool have_eagle3_head() { return fs::exists(testing::models_dir() / "specula-tiny-eagle3" / "model.safetensors"); }
std::string mtp_spec(int k) {
  return R"({"method": "mtp", "num_speculative_tokens": )" + std::to_string(k) + R"(, "adaptive": false})";
}

EngineConfig engine_config(const fs::path& model, const std::string& spec, bool eager) {
  EngineConfig c;
  c.model = model.string();
  c.device = "cuda";
  c.max_model_len = 512;
  c.max_num_seqs = 8;
  c.gpu_memory_utilization = 0.3;
  c.speculative_config = spec;
  c.enforce_eager = eager;
  return c;
}

std::vector<std::vector<int32_t>> greedy(const EngineConfig& c, const std::vector<std::vector<int32_t>>& prompts,
                                         int tokens, EngineMetrics* metrics = nullptr) {
  auto engine = create_engine(c);
  engine->start();
  auto out = testing::greedy_streams(*engine, prompts, tokens);
  if (metrics) {  // once the loop has published its last step
    *metrics = engine->metrics();
    for (int i = 0; i < 500 && metrics->num_requests_running + metrics->num_requests_waiting > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      *metrics = engine->metrics();
    }
  }
  engine->shutdown();
  return out;
}

// Each reference prompt alone, then a mixed batch of five (both prompts, repeated: prefix-cache
// hits, different lengths in one verification batch), with graphs and eagerly.
void expect_reference_greedy(const char* model_name, const fs::path& model, const std::string& spec) {
  const testing::GreedyReference ref = reference(model_name);
  ASSERT_EQ(ref.prompts.size(), 2u);
  const int n = static_cast<int>(ref.greedy[0].size());
  for (bool eager : {false, true}) {
    SCOPED_TRACE(spec + (eager ? " (eager)" : " (graphs)"));
    const EngineConfig c = engine_config(model, spec, eager);
    for (size_t i = 0; i < ref.prompts.size(); ++i) EXPECT_TRUE(testing::greedy_matches(greedy(c, {ref.prompts[i]}, n)[0], ref, i, testing::kBf16NearTie)) << i;
    std::vector<std::vector<int32_t>> mixed;
    for (size_t i = 0; i < 5; ++i) mixed.push_back(ref.prompts[i % 2]);
    const auto got = greedy(c, mixed, n);
    for (size_t i = 0; i < mixed.size(); ++i) EXPECT_TRUE(testing::greedy_matches(got[i], ref, i % 2, testing::kBf16NearTie)) << "mixed " << i;
  }
}

TEST(SpecGraphs, DraftModelGreedyIsTransformersWithAndWithoutGraphs) {
  SKIP_WITHOUT_GPU();
  for (int k : {1, 2, 3}) expect_reference_greedy("specula-tiny", tiny(), draft_spec(k));
}

TEST(SpecGraphs, MtpGreedyIsTransformersWithAndWithoutGraphs) {
  SKIP_WITHOUT_GPU();
  for (int k : {1, 3}) expect_reference_greedy("specula-tiny-moe", tiny_moe(), mtp_spec(k));
}

// The head reads the target's aux-layer features (copied inside the target's graphs) and chains
// its own hidden state through the draft-step graphs.
TEST(SpecGraphs, Eagle3GreedyIsTransformersWithAndWithoutGraphs) {
  SKIP_WITHOUT_GPU();
  if (!have_eagle3_head()) GTEST_SKIP() << "models/specula-tiny-eagle3 missing";
  for (int k : {1, 3}) expect_reference_greedy("specula-tiny", tiny(), eagle3_spec(k));
}

// Any prompts (no reference margin): graphs give exactly the eager engine's tokens, and the
// drafts are as good: a draft graph reading a wrong input or cache entry would lower acceptance
// (greedy drafts of the same contexts differ only where bf16 rounding flips a near tie).
void expect_graphs_give_eager_tokens_and_acceptance(const fs::path& model, std::string (*spec)(int)) {
  auto tok = Tokenizer::from_dir(model);
  const std::vector<std::string> texts{"The quick brown fox", "Once upon a time,", "def main():", "A B C D E F",
                                       "In 1492"};
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& t : texts) prompts.push_back(tok->encode(t));
  for (int k : {1, 3}) {
    SCOPED_TRACE(spec(k));
    EngineMetrics me, mg;
    const auto eager = greedy(engine_config(model, spec(k), true), prompts, 64, &me);
    const auto graphs = greedy(engine_config(model, spec(k), false), prompts, 64, &mg);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(eager[i].size(), 64u);
      EXPECT_EQ(graphs[i], eager[i]) << "prompt " << i;
    }
    ASSERT_GT(me.spec_num_draft_tokens, 100);
    const double rate_e = static_cast<double>(me.spec_num_accepted_tokens) / me.spec_num_draft_tokens;
    const double rate_g = static_cast<double>(mg.spec_num_accepted_tokens) / mg.spec_num_draft_tokens;
    EXPECT_NEAR(rate_g, rate_e, 0.03) << "acceptance eager " << rate_e << ", graphs " << rate_g;
  }
}

TEST(SpecGraphs, GraphsGiveTheEagerSpeculativeEnginesTokensAndAcceptance) {
  SKIP_WITHOUT_GPU();
  expect_graphs_give_eager_tokens_and_acceptance(tiny(), draft_spec);
}

// MTP's catch-up graphs read the target's hidden rows gathered into a static buffer: a wrong or
// stale row would show as lower acceptance, a wrong K/V entry too.
TEST(SpecGraphs, MtpGraphsGiveTheEagerEnginesTokensAndAcceptance) {
  SKIP_WITHOUT_GPU();
  expect_graphs_give_eager_tokens_and_acceptance(tiny_moe(), mtp_spec);
}

// A feature row gathered from the wrong target row, a stale chained hidden state or a wrong K/V
// entry of the head would lower acceptance under graphs.
TEST(SpecGraphs, Eagle3GraphsGiveTheEagerEnginesTokensAndAcceptance) {
  SKIP_WITHOUT_GPU();
  if (!have_eagle3_head()) GTEST_SKIP() << "models/specula-tiny-eagle3 missing";
  expect_graphs_give_eager_tokens_and_acceptance(tiny(), eagle3_spec);
}

// The engine of the hand-built graph tests (k drafts, 8 sequences, 64-token steps).
EngineCoreConfig hand_built_core_config(int k, int vocab_size) {
  EngineCoreConfig c;
  c.max_model_len = 256;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 64;
  c.block_size = 16;
  c.num_blocks = 256;
  c.vocab_size = vocab_size;
  c.num_speculative_tokens = k;
  return c;
}

ModelRunnerConfig runner_config(const EngineCoreConfig& c) {
  ModelRunnerConfig rc;
  rc.max_num_seqs = c.max_num_seqs;
  rc.max_num_batched_tokens = c.max_num_batched_tokens;
  rc.max_model_len = c.max_model_len;
  rc.block_size = c.block_size;
  rc.num_blocks = c.num_blocks;
  rc.num_speculative_tokens = c.num_speculative_tokens;
  return rc;
}

// Runs three greedy requests (the reference's two prompts, the first twice) on an EngineCore over
// `runner` and expects transformers' continuations.
void expect_reference_greedy(const EngineCoreConfig& c, ModelRunner& runner, const Tokenizer& tok,
                             const testing::GreedyReference& ref, const std::string& id_prefix) {
  EngineCore core(c, runner, tok);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < 3; ++i) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = static_cast<int>(ref.greedy[i % 2].size());
    p.ignore_eos = true;
    streams.push_back(std::make_shared<RequestStream>());
    core.add_request(NewRequest{id_prefix + std::to_string(i), ref.prompts[i % 2], p}, streams.back());
  }
  while (core.step()) {
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    std::vector<int32_t> got;
    RequestOutput o;
    while (streams[i]->pop(&o, std::chrono::milliseconds(0))) {
      EXPECT_FALSE(o.error.has_value()) << *o.error;
      for (const ChoiceDelta& d : o.choices) got.insert(got.end(), d.token_ids.begin(), d.token_ids.end());
    }
    EXPECT_TRUE(testing::greedy_matches(got, ref, i % 2, testing::kBf16NearTie)) << i;
  }
}

// The graphs are really used: the engine's pieces put together by hand (as LLMEngine::create
// does), counting replays of verification graphs, draft catch-up graphs and draft-step graphs
// (with the fused chain off: with it, greedy drafts 2..k run as one kernel instead, which
// fused_chain = true checks).
void expect_graphs_replay(bool fused_chain) {
  const int k = 3;
  const testing::GreedyReference ref = reference("specula-tiny");
  auto gpu = make_cuda_backend(0);
  auto weights = open_safetensors_checkpoint(tiny());
  auto model = create_model(load_model_config(tiny()), *weights, *gpu);
  auto draft_weights = open_safetensors_checkpoint(tiny_draft());
  auto draft = create_model(load_model_config(tiny_draft()), *draft_weights, *gpu);
  auto tok = Tokenizer::from_dir(tiny());
  const EngineCoreConfig c = hand_built_core_config(k, model->config().vocab_size);
  auto sampler = make_sampler(*gpu, c.max_num_seqs * (1 + k), c.vocab_size);
  ModelRunner runner(*model, *gpu, *sampler, runner_config(c));
  runner.set_rejection_sampler(make_device_rejection_sampler(*gpu, c.max_num_seqs * (1 + k), c.vocab_size));
  DraftModelProposerConfig dc;
  dc.num_speculative_tokens = k;
  dc.max_num_seqs = c.max_num_seqs;
  dc.max_num_batched_tokens = c.max_num_batched_tokens;
  dc.max_model_len = c.max_model_len;
  dc.draft_max_model_len = c.max_model_len;
  dc.fused_chain = fused_chain;  // else the greedy chains' draft steps run fused, not as graphs
  auto proposer = std::make_unique<DraftModelProposer>(std::move(draft), *gpu, make_cpu_draft_sampler(*gpu), dc);
  DraftModelProposer& dp = *proposer;
  dp.allocate_kv_cache(c.num_blocks, c.block_size);
  AdaptiveSpeculator speculator(std::move(proposer), AdaptiveSpeculatorConfig{k, false});
  runner.set_speculator(&speculator);
  const std::vector<int> sizes = PaddedGraphs::default_sizes(c.max_num_seqs);  // 1, 2, 4, 8
  EXPECT_EQ(runner.capture_decode_graphs(sizes), 4u * (1 + k));
  EXPECT_EQ(runner.num_verify_graphs(), 4u * k);
  // Catch-up forwards of 1 and 2 rows per request, and draft steps, at each size.
  EXPECT_EQ(dp.capture_graphs(sizes), 4u * DraftModelProposer::kCatchUpGraphRows + 4u);
  EXPECT_EQ(dp.num_catch_up_graphs(), 4u * DraftModelProposer::kCatchUpGraphRows);

  expect_reference_greedy(c, runner, *tok, ref, "r");
  EXPECT_GT(runner.num_graph_replays(1 + k), 0) << "no verification step of " << k << " drafts replayed a graph";
  if (fused_chain) {
    EXPECT_GT(dp.num_fused_chains(), 0) << "no greedy chain ran fused";
    EXPECT_EQ(dp.num_fused_chains(), dp.num_multi_step_chains()) << "a greedy chain of the embedded draft ran unfused";
  } else {
    EXPECT_EQ(dp.num_fused_chains(), 0);
    EXPECT_GT(dp.num_step_graph_replays(), 0) << "no draft step replayed a graph";
  }
  EXPECT_GT(dp.num_catch_up_graph_replays(), 0) << "no draft catch-up replayed a graph";
  EXPECT_GT(dp.num_greedy_chains(), 0) << "greedy drafts were not chained on the device";
  // The two prompts end apart: steps where one verifies fewer drafts (near max_tokens) are ragged
  // and run padded in the graph of the longest.
  EXPECT_GT(runner.num_ragged_graph_steps(), 0) << "no ragged verification step ran as a graph";
}

TEST(SpecGraphs, VerificationAndDraftStepsReplayGraphs) {
  SKIP_WITHOUT_GPU();
  expect_graphs_replay(false);
}

// Greedy drafts 2..k of the embedded draft run as the fused chain kernel, and greedy output stays
// transformers'.
TEST(SpecGraphs, GreedyDraftChainsRunFused) {
  SKIP_WITHOUT_GPU();
  expect_graphs_replay(true);
}

// MTP's graphs are really used: catch-up forwards (r = 1..1+k rows per request) and chained
// draft steps replay, the greedy drafts chained on the device, and greedy stays transformers'.
TEST(SpecGraphs, MtpCatchUpAndDraftStepsReplayGraphs) {
  SKIP_WITHOUT_GPU();
  const int k = 3;
  const testing::GreedyReference ref = reference("specula-tiny-moe");
  auto gpu = make_cuda_backend(0);
  const ModelConfig config = load_model_config(tiny_moe());
  auto weights = open_safetensors_checkpoint(tiny_moe());
  auto model = create_model(config, *weights, *gpu);
  auto tok = Tokenizer::from_dir(tiny_moe());
  const EngineCoreConfig c = hand_built_core_config(k, config.vocab_size);
  auto sampler = make_sampler(*gpu, c.max_num_seqs * (1 + k), c.vocab_size);
  ModelRunner runner(*model, *gpu, *sampler, runner_config(c));
  runner.set_rejection_sampler(make_device_rejection_sampler(*gpu, c.max_num_seqs * (1 + k), c.vocab_size));
  auto mtp = std::make_unique<DeepseekMtp>(config, *weights, *gpu, ModelOptions{}, model.get(), false);
  MtpProposerConfig mc;
  mc.num_speculative_tokens = k;
  mc.max_num_seqs = c.max_num_seqs;
  mc.max_num_batched_tokens = c.max_num_batched_tokens;
  mc.max_model_len = c.max_model_len;
  auto proposer = std::make_unique<MtpProposer>(std::move(mtp), *gpu,
                                                make_draft_sampler(*gpu, c.max_num_seqs, c.vocab_size), mc);
  MtpProposer& mp = *proposer;
  mp.allocate_kv_cache(c.num_blocks, c.block_size);
  AdaptiveSpeculator speculator(std::move(proposer), AdaptiveSpeculatorConfig{k, false});
  runner.set_speculator(&speculator);
  const std::vector<int> sizes = PaddedGraphs::default_sizes(c.max_num_seqs);  // 1, 2, 4, 8
  EXPECT_EQ(runner.capture_decode_graphs(sizes), 4u * (1 + k));
  // Catch-ups of 1..1+k rows per request (all four sizes fit 64 tokens), one MTP layer's steps.
  EXPECT_EQ(mp.capture_graphs(sizes), 4u * (1 + k) + 4u);
  EXPECT_EQ(mp.num_catch_up_graphs(), 4u * (1 + k));
  EXPECT_EQ(mp.num_step_graphs(), 4u);

  expect_reference_greedy(c, runner, *tok, ref, "m");
  EXPECT_GT(runner.num_graph_replays(1 + k), 0) << "no verification step of " << k << " drafts replayed a graph";
  EXPECT_GT(mp.num_catch_up_graph_replays(), 0) << "no MTP catch-up replayed a graph";
  EXPECT_GT(mp.num_step_graph_replays(), 0) << "no MTP draft step replayed a graph";
  // With graphs, every catch-up in the padded layout is a replay.
  EXPECT_EQ(mp.num_uniform_catch_ups(), mp.num_catch_up_graph_replays());
  EXPECT_GT(mp.num_greedy_chains(), 0) << "greedy MTP drafts were not chained on the device";
}

}  // namespace
}  // namespace specula
