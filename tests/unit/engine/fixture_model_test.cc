// Integration: real Llama-family and DeepSeek (MLA + MoE) forwards (tests/fixtures/models, written by transformers) through
// the whole engine. The greedy continuation of each reference prompt, run together with the others
// under a small token budget (chunked prefill mixed with decodes) and alone, must equal
// transformers' greedy_i.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <thread>
#include <nlohmann/json.hpp>

#include "engine/engine_core.h"
#include "engine/llm_engine.h"
#include "engine/speculator.h"
#include "sampling/sampler.h"
#include "engine_fakes.h"
#include "model/model.h"
#include "model/weight_source.h"
#include "test_paths.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

// prompt_i / greedy_i (I32) from reference.safetensors.
struct Reference {
  std::vector<std::vector<int32_t>> prompts, greedy;
};

Reference read_reference(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  EXPECT_TRUE(in.good()) << file;
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  const nlohmann::json h = nlohmann::json::parse(header);
  auto tensor = [&](const std::string& name) {
    std::vector<int32_t> v;
    if (!h.contains(name)) return v;
    const auto& t = h[name];
    EXPECT_EQ(t["dtype"], "I32");
    const uint64_t begin = t["data_offsets"][0], end = t["data_offsets"][1];
    v.resize((end - begin) / 4);
    in.seekg(static_cast<std::streamoff>(8 + header_len + begin));
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(end - begin));
    return v;
  };
  Reference r;
  for (int i = 0;; ++i) {
    std::vector<int32_t> p = tensor("prompt_" + std::to_string(i));
    if (p.empty()) break;
    r.prompts.push_back(std::move(p));
    r.greedy.push_back(tensor("greedy_" + std::to_string(i)));
  }
  return r;
}

// Runs `prompts` greedily through an EngineCore over the fixture model; returns the tokens. With
// async scheduling each decode step takes its previous step's token through the sampler's token
// feed, which this checks happened.
std::vector<std::vector<int32_t>> run_greedy(Model& model, Backend& backend, const Tokenizer& tok,
                                             const std::vector<std::vector<int32_t>>& prompts, int max_tokens,
                                             int budget, bool async = false, Speculator* speculator = nullptr) {
  EngineCoreConfig c;
  c.max_model_len = 128;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = budget;
  c.block_size = 16;
  c.num_blocks = 64;
  c.async_scheduling = async;
  c.vocab_size = model.config().vocab_size;
  auto sampler = make_cpu_sampler(backend);
  ModelRunnerConfig rc;
  rc.max_num_seqs = c.max_num_seqs;
  rc.max_num_batched_tokens = c.max_num_batched_tokens;
  rc.max_model_len = c.max_model_len;
  rc.block_size = c.block_size;
  rc.num_blocks = c.num_blocks;
  if (speculator) {
    c.num_speculative_tokens = rc.num_speculative_tokens = speculator->num_speculative_tokens();
    c.spec_adaptive = speculator->adaptive();
  }
  ModelRunner runner(model, backend, *sampler, rc);
  if (speculator) runner.set_speculator(speculator);
  EngineCore core(c, runner, tok);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;  // transformers' reference ran a fixed number of argmax steps
    streams.push_back(std::make_shared<RequestStream>());
    core.add_request(NewRequest{"r" + std::to_string(i), prompts[i], p}, streams.back());
  }
  while (core.step()) {
  }
  // Every decode step but the first takes its tokens on the device: the engine processes a step's
  // outputs while the next one runs, and schedules the one after before waiting for its tokens.
  if (async) EXPECT_GE(runner.num_fed_steps(), max_tokens - 2);
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestOutput o;
    while (streams[i]->pop(&o, std::chrono::milliseconds(0))) {
      EXPECT_FALSE(o.error.has_value()) << *o.error;
      for (const ChoiceDelta& d : o.choices) out[i].insert(out[i].end(), d.token_ids.begin(), d.token_ids.end());
    }
  }
  EXPECT_EQ(core.scheduler().kv_cache().num_free_blocks(), c.num_blocks);
  return out;
}

class FixtureModel : public ::testing::TestWithParam<std::string> {};

// A fixture checkpoint on the CPU backend with its transformers reference.
struct LoadedFixture {
  explicit LoadedFixture(const std::string& name)
      : dir(testing::fixtures_dir() / "models" / name), ref(read_reference(dir / "reference.safetensors")),
        mc(load_model_config(dir)), backend(make_cpu_backend(0)), weights(open_safetensors_checkpoint(dir)),
        model(create_model(mc, *weights, *backend)), tok(mc.vocab_size) {}
  int num_tokens() const { return static_cast<int>(ref.greedy[0].size()); }
  fs::path dir;
  Reference ref;
  ModelConfig mc;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<WeightSource> weights;
  std::unique_ptr<Model> model;
  testing::FakeTokenizer tok;
};

TEST_P(FixtureModel, GreedyThroughTheEngineMatchesTransformers) {
  LoadedFixture f(GetParam());
  const Reference& ref = f.ref;
  ASSERT_FALSE(ref.prompts.empty());
  const int n = f.num_tokens();

  const auto together = run_greedy(*f.model, *f.backend, f.tok, ref.prompts, n, /*budget=*/16);
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    EXPECT_EQ(together[i], ref.greedy[i]) << GetParam() << " prompt " << i << " (batched, chunked)";
    // Alone, in chunks of 8: the first steps of a long prompt ask for no logits at all.
    const auto alone = run_greedy(*f.model, *f.backend, f.tok, {ref.prompts[i]}, n, /*budget=*/8);
    EXPECT_EQ(alone[0], ref.greedy[i]) << GetParam() << " prompt " << i << " (alone)";
  }
  const auto async = run_greedy(*f.model, *f.backend, f.tok, ref.prompts, n, /*budget=*/16, /*async=*/true);
  for (size_t i = 0; i < ref.prompts.size(); ++i)
    EXPECT_EQ(async[i], ref.greedy[i]) << GetParam() << " prompt " << i << " (async scheduling)";
}

// Steps the speculator skips are plain steps: the same greedy tokens, no propose() for a request
// that decoded, and under async scheduling the tokens stay on the device (fed to the next step)
// as without a speculator; either way their time reaches the cost model (record_target_step).
TEST_P(FixtureModel, StepsTheSpeculatorSkipsRunAsPlainSteps) {
  LoadedFixture f(GetParam());
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async scheduling" : "synchronous");
    testing::IdleSpeculator spec;
    const auto out =
        run_greedy(*f.model, *f.backend, f.tok, f.ref.prompts, f.num_tokens(), /*budget=*/16, async, &spec);
    for (size_t i = 0; i < f.ref.prompts.size(); ++i)
      EXPECT_EQ(out[i], f.ref.greedy[i]) << GetParam() << " prompt " << i;
    EXPECT_GT(spec.skipped, 0);
    EXPECT_GT(spec.target_steps, 0) << "plain steps teach the cost model (deferred ones too)";
    EXPECT_EQ(spec.decoding_proposals, 0);
    EXPECT_EQ(spec.verifications, 0);
    EXPECT_EQ(spec.odd_calls, 0) << "a multi-row or negative target step, or a skip of no decoding request";
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, FixtureModel,
                         ::testing::Values("llama", "llama3_rope_new_style", "llama3_rope_old_style",
                                           "llama_linear_rope_type_key", "mistral_sharded", "qwen2_bias_tied",
                                           "qwen3_qknorm_headdim", "qwen3_yarn_tied", "deepseek_v2_greedy",
                                           "deepseek_v2_group_limited", "deepseek_v3", "deepseek_v3_no_qlora"));

// The public entry point: LLMEngine::create on a fixture checkpoint (with a real tokenizer from
// the fetched cache), requests added from several threads, streamed back.
TEST(LLMEngineCreate, ServesTheFixtureLlamaGreedily) {
  const fs::path tok_dir = testing::tokenizer_cache_dir() / "llama3";
  if (!fs::exists(tok_dir / "tokenizer.json")) GTEST_SKIP() << "run scripts/fetch_tokenizers.sh first";
  const fs::path dir = testing::fixtures_dir() / "models" / "llama";
  const Reference ref = read_reference(dir / "reference.safetensors");
  EngineConfig ec;
  ec.model = dir.string();
  ec.tokenizer = tok_dir.string();
  ec.device = "cpu";
  ec.max_num_seqs = 4;
  ec.max_num_batched_tokens = 16;
  auto engine = LLMEngine::create(ec);
  EXPECT_EQ(engine->max_model_len(), 256);
  engine->start();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.ignore_eos = true;
    p.max_tokens = static_cast<int>(ref.greedy[i].size());
    streams.push_back(engine->add_request(NewRequest{"r" + std::to_string(i), ref.prompts[i], p}));
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    std::vector<int32_t> tokens;
    RequestOutput o;
    while (streams[i]->pop(&o, std::chrono::seconds(60))) {
      ASSERT_FALSE(o.error.has_value()) << *o.error;
      for (const ChoiceDelta& d : o.choices) tokens.insert(tokens.end(), d.token_ids.begin(), d.token_ids.end());
      if (o.finished) break;
    }
    EXPECT_EQ(tokens, ref.greedy[i]) << "prompt " << i;
  }
  // The loop publishes metrics after the step whose outputs we just read: wait for it.
  EngineMetrics m = engine->metrics();
  for (int i = 0; i < 6000 && (m.num_requests_running > 0 || m.generation_tokens_total < 72); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    m = engine->metrics();
  }
  EXPECT_EQ(m.generation_tokens_total, 3 * 24);
  EXPECT_EQ(m.num_requests_running, 0);
  EXPECT_EQ(m.kv_cache_usage, 0.0);
  engine->shutdown();
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

// The embedded specula-tiny (Qwen3, real tokenizer) through LLMEngine::create: both reference
// prompts plus a repeat of each (prefix-cache hits), all at once; every copy must continue
// exactly as transformers did, and the streamed text must be the tokenizer's decode of it.
TEST(EmbeddedModel, SpeculaTinyGreedyThroughTheEngine) {
  const fs::path model_dir = testing::models_dir() / "specula-tiny";
  const fs::path ref_file = testing::fixtures_dir() / "embedded" / "specula-tiny" / "reference.safetensors";
  ASSERT_TRUE(fs::exists(model_dir / "model.safetensors") && fs::exists(ref_file)) << "committed specula-tiny or its reference missing";
  const Reference ref = read_reference(ref_file);
  ASSERT_EQ(ref.prompts.size(), 2u);
  EngineConfig ec;
  ec.model = model_dir.string();
  ec.device = "cpu";
  ec.max_num_seqs = 8;
  ec.max_model_len = 512;
  ec.max_num_batched_tokens = 64;  // chunked prefill of the ~50-token prompts alongside decodes
  auto engine = LLMEngine::create(ec);
  engine->start();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int copy = 0; copy < 2; ++copy) {
    for (size_t i = 0; i < ref.prompts.size(); ++i) {
      SamplingParams p;
      p.temperature = 0.0f;
      p.ignore_eos = true;
      p.max_tokens = static_cast<int>(ref.greedy[i].size());
      streams.push_back(engine->add_request(
          NewRequest{"r" + std::to_string(copy) + "_" + std::to_string(i), ref.prompts[i], p}));
    }
  }
  int cached = 0;
  for (size_t k = 0; k < streams.size(); ++k) {
    const size_t i = k % ref.prompts.size();
    std::vector<int32_t> tokens;
    std::string text;
    RequestOutput o;
    while (streams[k]->pop(&o, std::chrono::seconds(60))) {
      ASSERT_FALSE(o.error.has_value()) << *o.error;
      cached = std::max(cached, o.num_cached_tokens);
      for (const ChoiceDelta& d : o.choices) {
        tokens.insert(tokens.end(), d.token_ids.begin(), d.token_ids.end());
        text += d.text;
      }
      if (o.finished) break;
    }
    EXPECT_EQ(tokens, ref.greedy[i]) << "request " << k;
    EXPECT_EQ(text, engine->tokenizer().decode(ref.greedy[i])) << "request " << k;
  }
  EXPECT_GT(cached, 0) << "the repeated prompts should hit the prefix cache";
  engine->shutdown();
}

}  // namespace
}  // namespace specula
