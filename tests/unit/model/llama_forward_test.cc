// The Llama-family forward on random weights served by an in-test WeightSource: which HF tensors
// each variant loads, and that the engine's way of running a prompt (chunked prefill, then
// token-by-token decode, several sequences per batch, non-contiguous blocks, padding rows) gives
// the same logits as one prefill of the whole sequence. Agreement with transformers itself is
// checked against the committed fixtures in forward_fixtures_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "forward_runner.h"
#include "model/llama.h"
#include "model/model.h"
#include "small_configs.h"
#include "test_paths.h"

namespace specula {
namespace {

using testing::PagedRunner;

// Random weights for a Llama-family config, by HF name: norms ~1, biases small, matrices scaled
// so that activations stay O(1) and next-token distributions are far from uniform.
class RandomLlamaWeights : public WeightSource {
 public:
  RandomLlamaWeights(const ModelConfig& c, bool with_lm_head) {
    const int64_t h = c.hidden_size, nq = c.num_attention_heads * c.head_dim, nk = c.num_key_value_heads * c.head_dim,
                  in = c.intermediate_size;
    shapes_["model.embed_tokens.weight"] = {c.vocab_size, h};
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      shapes_[p + "input_layernorm.weight"] = {h};
      shapes_[p + "post_attention_layernorm.weight"] = {h};
      shapes_[p + "self_attn.q_proj.weight"] = {nq, h};
      shapes_[p + "self_attn.k_proj.weight"] = {nk, h};
      shapes_[p + "self_attn.v_proj.weight"] = {nk, h};
      shapes_[p + "self_attn.o_proj.weight"] = {h, nq};
      shapes_[p + "mlp.gate_proj.weight"] = {in, h};
      shapes_[p + "mlp.up_proj.weight"] = {in, h};
      shapes_[p + "mlp.down_proj.weight"] = {h, in};
      if (c.attention_bias) {
        shapes_[p + "self_attn.q_proj.bias"] = {nq};
        shapes_[p + "self_attn.k_proj.bias"] = {nk};
        shapes_[p + "self_attn.v_proj.bias"] = {nk};
      }
      if (c.o_proj_bias) shapes_[p + "self_attn.o_proj.bias"] = {h};
      if (c.mlp_bias) {
        shapes_[p + "mlp.gate_proj.bias"] = {in};
        shapes_[p + "mlp.up_proj.bias"] = {in};
        shapes_[p + "mlp.down_proj.bias"] = {h};
      }
      if (c.qk_norm) {
        shapes_[p + "self_attn.q_norm.weight"] = {c.head_dim};
        shapes_[p + "self_attn.k_norm.weight"] = {c.head_dim};
      }
    }
    shapes_["model.norm.weight"] = {h};
    if (with_lm_head) shapes_["lm_head.weight"] = {c.vocab_size, h};
  }

  bool has(const std::string& name) const override { return shapes_.count(name) > 0; }
  std::vector<std::string> names() const override {
    std::vector<std::string> n;
    for (const auto& [k, v] : shapes_) n.push_back(k);
    return n;
  }
  std::string describe() const override { return "random test weights"; }

  Tensor load(const std::string& name, const Shape& expected, DType dtype, Backend& backend) override {
    auto it = shapes_.find(name);
    SPECULA_CHECK(it != shapes_.end(), "random test weights: no tensor named {}", name);
    SPECULA_CHECK(it->second == expected, "random test weights: {} is {}, asked for {}", name, shape_str(it->second),
                  shape_str(expected));
    loaded_.insert(name);
    std::mt19937 rng(static_cast<unsigned>(std::hash<std::string>{}(name)));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    int64_t n = 1;
    for (int64_t d : expected) n *= d;
    std::vector<float> v(n);
    const bool is_norm = name.find("norm") != std::string::npos;
    const float scale = expected.size() == 2 ? 1.5f / std::sqrt(static_cast<float>(expected[1])) : 0.1f;
    for (auto& x : v) x = is_norm ? 1.0f + 0.2f * normal(rng) : scale * normal(rng);
    if (name == "model.embed_tokens.weight" || name == "lm_head.weight")
      for (auto& x : v) x *= 3.0f;  // peaked logits
    Tensor host = Tensor::from_f32(v, expected);
    Tensor out = backend.empty(expected, dtype);
    backend.cast(host, out);
    return out;
  }

  const std::set<std::string>& loaded() const { return loaded_; }

 private:
  std::map<std::string, Shape> shapes_;
  std::set<std::string> loaded_;
};

ModelConfig small_config(Architecture arch) { return testing::small_llama_config(arch); }

struct Variant {
  const char* name;
  std::function<ModelConfig()> make;
};

std::vector<Variant> variants() {
  return {
      {"llama_gqa", [] { return small_config(Architecture::kLlama); }},
      {"llama_biases_linear_rope",
       [] {
         ModelConfig c = small_config(Architecture::kLlama);
         c.attention_bias = c.o_proj_bias = c.mlp_bias = true;
         c.rope.type = RopeConfig::Type::kLinear;
         c.rope.factor = 2.0;
         return c;
       }},
      {"llama3_rope_mha",
       [] {
         ModelConfig c = small_config(Architecture::kLlama);
         c.num_key_value_heads = 4;
         c.rope.type = RopeConfig::Type::kLlama3;
         c.rope.theta = 500000.0;
         c.rope.factor = 8.0;
         c.rope.original_max_position_embeddings = 32;
         return c;
       }},
      {"qwen2_bias_tied",
       [] {
         ModelConfig c = small_config(Architecture::kQwen2);
         c.attention_bias = true;
         c.tie_word_embeddings = true;
         return c;
       }},
      {"qwen3_qknorm_headdim_yarn_gqa4",
       [] {
         ModelConfig c = small_config(Architecture::kQwen3);
         c.qk_norm = true;
         c.num_attention_heads = 8;
         c.head_dim = 16;  // != 48 / 8
         c.rope.type = RopeConfig::Type::kYarn;
         c.rope.factor = 4.0;
         c.rope.original_max_position_embeddings = 32;
         return c;
       }},
      {"mistral_partial_rotary",
       [] {
         ModelConfig c = small_config(Architecture::kMistral);
         c.rope.partial_rotary_factor = 0.5;
         return c;
       }},
  };
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

void expect_logits_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double tol = 1e-5 * std::max(1.0, max_abs(want));
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
  EXPECT_LE(worst, tol) << what;
}

class LlamaForward : public ::testing::TestWithParam<Variant> {};

TEST_P(LlamaForward, LoadsExactlyTheVariantsTensors) {
  const ModelConfig c = GetParam().make();
  auto be = make_cpu_backend(2);
  RandomLlamaWeights w(c, !c.tie_word_embeddings);
  auto model = create_model(c, w, *be);
  EXPECT_EQ(w.loaded().size(), w.names().size()) << "every tensor of the variant is used";
  KVCacheSpec spec = model->kv_cache_spec();
  EXPECT_EQ(spec.num_layers, c.num_hidden_layers);
  EXPECT_EQ(spec.num_kv_heads, c.num_key_value_heads);
  EXPECT_EQ(spec.head_dim, c.head_dim);
  EXPECT_EQ(spec.v_head_dim, c.head_dim);
}

// The engine's schedule (chunks, decode, mixed batches) must not change a single logit beyond
// float reassociation.
TEST_P(LlamaForward, ChunkedPrefillAndDecodeMatchOneShotPrefill) {
  const ModelConfig c = GetParam().make();
  auto be = make_cpu_backend(2);
  RandomLlamaWeights w(c, !c.tie_word_embeddings);
  auto model = create_model(c, w, *be);

  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(c.vocab_size) - 1);
  const std::vector<int64_t> prompt_lens = {7, 19, 33};
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t n : prompt_lens) {
    std::vector<int32_t> p(n);
    for (auto& x : p) x = tok(rng);
    prompts.push_back(p);
  }

  // Engine-style: three sequences in one batch, uneven chunks, then greedy decode together.
  PagedRunner engine(*model, *be, /*num_blocks=*/32, /*block_size=*/16, /*seed=*/3);
  for (int s = 0; s < 3; ++s) engine.feed(s, prompts[s]);
  std::vector<std::vector<float>> chunked(3);
  auto run = [&](std::vector<PagedRunner::Work> work, int padding) {
    auto out = engine.step(work, padding);
    for (size_t i = 0; i < work.size(); ++i) {
      chunked[work[i].seq].insert(chunked[work[i].seq].end(), out[i].begin(), out[i].end());
    }
  };
  run({{0, 5, true}, {1, 16, true}, {2, 3, true}}, 0);
  run({{2, 17, true}, {0, 2, true}, {1, 3, true}}, 2);  // seq 0's prompt completes; padding rows
  run({{1, 0, true}, {2, 13, true}}, 0);                // a sequence with no new rows this step
  std::vector<std::vector<int32_t>> generated(3);
  for (int step = 0; step < 6; ++step) {
    std::vector<PagedRunner::Work> work;
    for (int s = 0; s < 3; ++s) {
      const auto& l = chunked[s];
      const int32_t next = testing::argmax(l.data() + l.size() - c.vocab_size, c.vocab_size);
      generated[s].push_back(next);
      engine.feed(s, {next});
      work.push_back({s, 1, true});
    }
    run(work, step % 2);
  }

  // Reference: each full sequence (prompt + generated) as one prefill in a fresh cache.
  for (int s = 0; s < 3; ++s) {
    PagedRunner oneshot(*model, *be, 8, 16, 11);
    std::vector<int32_t> all = prompts[s];
    all.insert(all.end(), generated[s].begin(), generated[s].end());
    oneshot.feed(0, all);
    auto want = oneshot.step({{0, static_cast<int64_t>(all.size()), true}})[0];
    // chunked holds logits for every computed row: the prompt, then each decoded token.
    std::vector<float> got(chunked[s].begin(), chunked[s].begin() + want.size());
    expect_logits_close(got, want, std::string(GetParam().name) + " sequence " + std::to_string(s));
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, LlamaForward, ::testing::ValuesIn(variants()),
                         [](const auto& info) { return std::string(info.param.name); });

// --load-format dummy: a real config.json alone must give a runnable model (finite logits).
TEST(LlamaForwardDummy, EveryLlamaFamilyFixtureConfigRunsOnDummyWeights) {
  auto be = make_cpu_backend(2);
  for (const char* variant : {"llama", "llama_linear_rope_type_key", "qwen2_bias_tied", "qwen3_qknorm_headdim",
                              "qwen3_yarn_tied", "mistral_sharded"}) {
    ModelConfig c = load_model_config(specula::testing::fixtures_dir() / "models" / variant);
    auto w = make_dummy_weight_source(c, 0);
    auto model = create_model(c, *w, *be);
    PagedRunner r(*model, *be, 4, 16);
    r.feed(0, {1, 5, 9, 13, 17});
    auto logits = r.step({{0, 5, true}})[0];
    ASSERT_EQ(logits.size(), static_cast<size_t>(5 * c.vocab_size)) << variant;
    for (float x : logits) ASSERT_TRUE(std::isfinite(x)) << variant;
    EXPECT_GT(max_abs(logits), 0.0) << variant;
  }
}

TEST(LlamaForwardErrors, MissingTensorIsNamed) {
  ModelConfig c = small_config(Architecture::kLlama);
  auto be = make_cpu_backend(1);
  RandomLlamaWeights w(c, /*with_lm_head=*/false);  // untied config, but no lm_head.weight
  try {
    create_model(c, w, *be);
    FAIL() << "expected an error for the missing lm_head.weight";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lm_head.weight"), std::string::npos) << e.what();
  }
}

TEST(LlamaForwardErrors, BadHeadCountsAndArchitectures) {
  auto be = make_cpu_backend(1);
  ModelConfig c = small_config(Architecture::kLlama);
  c.num_key_value_heads = 3;  // 4 query heads cannot share 3 kv heads
  RandomLlamaWeights w(c, true);
  EXPECT_THROW(create_model(c, w, *be), Error);
  ModelConfig d = small_config(Architecture::kDeepseekV3);
  RandomLlamaWeights wd(d, true);
  EXPECT_THROW(create_model(d, wd, *be), Error);
}

TEST(LlamaForwardErrors, PositionPastTheRopeTableIsAnError) {
  ModelConfig c = small_config(Architecture::kLlama);
  c.max_position_embeddings = 8;
  auto be = make_cpu_backend(1);
  RandomLlamaWeights w(c, true);
  auto model = create_model(c, w, *be);
  PagedRunner r(*model, *be, 4, 16);
  r.feed(0, std::vector<int32_t>(9, 5));
  EXPECT_THROW(r.step({{0, 9, false}}), Error);
}

}  // namespace
}  // namespace specula
