// The eagle and eagle3 methods through LLMEngine::create on the embedded target (CPU): greedy
// output equals transformers' continuation (chunked prefill, prefix-cache hits, batch mixes), for
// the trained head and for random heads in both public layouts; sampling through the engine
// follows the target (the chi-square test of the suite); a head that does not fit the target is an
// error at create naming what does not match.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include "app/create_engine.h"
#include "core/error.h"
#include "eagle_head_files.h"
#include "engine/llm_engine.h"
#include "engine_chi_square.h"
#include "mtp_test_util.h"
#include "model/config.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"
#include "unit/spec_decode/reference_fixture.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

fs::path tiny() { return testing::models_dir() / "specula-tiny"; }
fs::path trained_head() { return testing::models_dir() / "specula-tiny-eagle3"; }
fs::path reference_file() { return testing::fixtures_dir() / "embedded" / "specula-tiny" / "reference.safetensors"; }

bool have_models() { return fs::exists(tiny() / "model.safetensors") && fs::exists(reference_file()); }

fs::path temp_head(const std::string& name, const testing::RandomEagleHead& spec) {
  const fs::path dir = fs::temp_directory_path() / ("specula_eagle_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  return testing::write_random_eagle_head(dir, load_model_config(tiny()), spec);
}

std::string spec_json(const std::string& method, const fs::path& head, int k, bool adaptive = false) {
  return R"({"method": ")" + method + R"(", "model": ")" + head.string() + R"(", "num_speculative_tokens": )" +
         std::to_string(k) + (adaptive ? "" : R"(, "adaptive": false)") + "}";
}

EngineConfig engine_config(const std::string& spec) {
  EngineConfig ec;
  ec.model = tiny().string();
  ec.device = "cpu";
  ec.max_num_seqs = 8;
  ec.max_model_len = 512;
  ec.max_num_batched_tokens = 64;  // chunked prefill of the ~50-token prompts alongside verifications
  ec.speculative_config = spec;
  return ec;
}

using testing::collect_tokens;
using testing::settled;

// Both reference prompts twice (the repeats hit the prefix cache), then once more one at a time
// after the batch (a different batch mix), all greedy: transformers' continuations.
EngineMetrics expect_transformers_greedy(const std::string& spec) {
  const testing::GreedyReference ref = testing::read_greedy_reference(reference_file());
  auto engine = create_engine(engine_config(spec));
  engine->start();
  auto request = [&](const std::string& id, size_t i) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.ignore_eos = true;
    p.max_tokens = static_cast<int>(ref.greedy[i].size());
    return engine->add_request(NewRequest{id, ref.prompts[i], p});
  };
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int copy = 0; copy < 2; ++copy)
    for (size_t i = 0; i < ref.prompts.size(); ++i) streams.push_back(request("r" + std::to_string(copy) + std::to_string(i), i));
  for (size_t k = 0; k < streams.size(); ++k) EXPECT_EQ(collect_tokens(*streams[k]), ref.greedy[k % ref.prompts.size()]) << spec;
  for (size_t i = 0; i < ref.prompts.size(); ++i) EXPECT_EQ(collect_tokens(*request("s" + std::to_string(i), i)), ref.greedy[i]) << spec;
  const EngineMetrics m = settled(*engine);
  EXPECT_GT(m.spec_num_draft_tokens, 0) << spec;
  EXPECT_GT(m.prefix_cache_hits, 0);
  EXPECT_EQ(m.kv_cache_usage, 0.0);
  engine->shutdown();
  return m;
}

TEST(EagleEngine, RandomEagle3HeadKeepsTheGreedyOutput) {
  ASSERT_TRUE(have_models()) << "committed embedded models or reference missing";
  expect_transformers_greedy(spec_json("eagle3", temp_head("eagle3", {}), 3));
}

TEST(EagleEngine, RandomEagle1HeadKeepsTheGreedyOutput) {
  ASSERT_TRUE(have_models()) << "committed embedded models or reference missing";
  testing::RandomEagleHead spec;
  spec.eagle3 = false;
  expect_transformers_greedy(spec_json("eagle", temp_head("eagle1", spec), 2));
}

TEST(EagleEngine, TrainedEagle3HeadKeepsTheGreedyOutputAndIsAccepted) {
  ASSERT_TRUE(have_models()) << "committed embedded models or reference missing";
  if (!fs::exists(trained_head() / "model.safetensors")) GTEST_SKIP() << "models/specula-tiny-eagle3 not trained yet";
  for (int k : {1, 3}) {
    const EngineMetrics m = expect_transformers_greedy(spec_json("eagle3", trained_head(), k));
    // The trained head agrees with the target's greedy token most of the time
    // (tools/train/results/specula-tiny-eagle3.eval.json).
    EXPECT_GE(static_cast<double>(m.spec_num_accepted_tokens), 0.5 * m.spec_num_draft_tokens) << "k=" << k;
  }
  // Adaptive depth (the default) too.
  expect_transformers_greedy(spec_json("eagle3", trained_head(), 4, /*adaptive=*/true));
}

// temperature 1, top_k 4: the pairs follow the target's p1(y1) p2(y2 | y1) (engine_chi_square.h),
// with drafts sampled from the head's q and with argmax drafts.
TEST(EagleEngine, SamplingWithEagle3FollowsTheTarget) {
  ASSERT_TRUE(have_models()) << "committed embedded models or reference missing";
  // A random head's top-k never meets the target's: only the trained head has drafts to accept.
  if (!fs::exists(trained_head() / "model.safetensors")) GTEST_SKIP() << "models/specula-tiny-eagle3 not trained yet";
  const fs::path head = trained_head();
  const std::vector<int32_t> prompt = Tokenizer::from_dir(tiny())->encode("import os\nimport sys\nimport ");
  const SamplingParams p = testing::chi_square_params();
  const testing::TargetPairs target = testing::target_pairs(tiny(), prompt, p, 0);
  const EngineConfig config = testing::chi_square_engine_config(engine_config(spec_json("eagle3", head, 2)));
  for (const char* sampling : {"sampled", "argmax"}) {
    SCOPED_TRACE(sampling);
    auto engine = create_engine(testing::chi_square_engine_config(engine_config(spec_json("eagle3", head, 2)), sampling));
    const testing::EngineChiSquare r = testing::engine_chi_square(*engine, target, prompt, p, 150);
    EXPECT_EQ(r.seen, r.samples) << "a continuation outside the target's top-k";
    EXPECT_GT(r.chi.p_value, 1e-3) << "chi2 " << r.chi.statistic << " dof " << r.chi.dof;
    EXPECT_GT(r.metrics.spec_num_draft_tokens, r.samples / 2);
    EXPECT_GT(r.metrics.spec_num_accepted_tokens, 0);
    EXPECT_LT(r.metrics.spec_num_accepted_tokens, r.metrics.spec_num_draft_tokens);
  }
  // The same statistic rejects a broken verifier with these drafts.
  auto broken = testing::engine_with_verifier(config, testing::broken_samplers()[0].make());
  const testing::EngineChiSquare r = testing::engine_chi_square(*broken, target, prompt, p, 150);
  EXPECT_LT(r.chi.p_value, 1e-3) << "always-accept passed: chi2 " << r.chi.statistic;
}

TEST(EagleEngine, AHeadThatDoesNotFitIsAnErrorAtCreate) {
  ASSERT_TRUE(have_models()) << "committed embedded models or reference missing";
  auto error_of = [](const std::string& spec) {
    try {
      create_engine(engine_config(spec));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  struct Case {
    std::string name, method;
    testing::RandomEagleHead head;
    std::string says;
  };
  std::vector<Case> cases;
  {
    Case c{"hidden", "eagle3", {}, "target_hidden_size"};
    c.head.config_overrides = {{"target_hidden_size", 512}};
    cases.push_back(c);
  }
  {
    Case c{"vocab", "eagle3", {}, "vocab_size 9000 but the target has 8192"};
    c.head.config_overrides = {{"vocab_size", 9000}};
    cases.push_back(c);
  }
  {
    Case c{"no_d2t", "eagle3", {}, "no d2t map"};
    c.head.skip = {"d2t"};
    cases.push_back(c);
  }
  {
    Case c{"aux", "eagle3", {}, "aux hidden state layer 11, but the target has layers 0..7"};
    c.head.aux_layers = {2, 4, 11};
    cases.push_back(c);
  }
  {
    Case c{"fc", "eagle3", {}, "fc.weight"};
    c.head.aux_layers = {2, 4};  // fc over 2 layers, config says 3
    c.head.config_overrides = {{"eagle_config", {{"eagle_aux_hidden_state_layer_ids", {2, 4, 5}}}}};
    cases.push_back(c);
  }
  {
    Case c{"layers", "eagle3", {}, "num_hidden_layers 2"};
    c.head.config_overrides = {{"num_hidden_layers", 2}};
    cases.push_back(c);
  }
  cases.push_back(Case{"v3_as_v1", "eagle", {}, "is an EAGLE-3 head"});
  {
    Case c{"v1_as_v3", "eagle3", {}, "is not an EAGLE-3 head"};
    c.head.eagle3 = false;
    cases.push_back(c);
  }
  for (const Case& c : cases) {
    const std::string e = error_of(spec_json(c.method, temp_head("bad_" + c.name, c.head), 2));
    EXPECT_NE(e.find(c.says), std::string::npos) << c.name << ": " << e;
  }
}

}  // namespace
}  // namespace specula
