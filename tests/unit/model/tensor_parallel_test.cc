// Tensor parallelism on the CPU: a Llama-family model split over 2 and 4 ranks (threads with the
// thread communicator) gives the logits of the whole model, step after step of chunked prefill
// and decode through the paged cache, for every variant of the family (biases on o/down, tied
// embeddings, Qwen3's q/k norms, fewer kv heads than ranks); each rank loads only its slice of
// each weight, from dummy weights and from a safetensors checkpoint; what cannot be split is a
// one-line error. DeepSeek too: MLA by heads, experts by channels.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "forward_runner.h"
#include "model/config.h"
#include "model/model.h"
#include "model/sharded_weight_source.h"
#include "model/tensor_parallel_plan.h"
#include "model/weight_source.h"
#include "test_paths.h"
#include "small_configs.h"
#include "weights_test_util.h"

namespace specula {
namespace {

using testing::PagedRunner;

ModelConfig small_config(Architecture arch) { return testing::small_llama_config(arch, /*vocab=*/96); }

struct Variant {
  const char* name;
  std::function<ModelConfig()> make;
};

std::vector<Variant> variants() {
  return {
      {"llama_gqa", [] { return small_config(Architecture::kLlama); }},
      {"llama_every_bias",
       [] {
         ModelConfig c = small_config(Architecture::kLlama);
         c.attention_bias = c.o_proj_bias = c.mlp_bias = true;
         return c;
       }},
      {"llama_mha", [] {
         ModelConfig c = small_config(Architecture::kLlama);
         c.num_key_value_heads = 4;
         return c;
       }},
      {"qwen2_bias_tied",
       [] {
         ModelConfig c = small_config(Architecture::kQwen2);
         c.attention_bias = true;
         c.tie_word_embeddings = true;
         return c;
       }},
      {"qwen3_qknorm_gqa4_one_kv_head",
       [] {
         ModelConfig c = small_config(Architecture::kQwen3);
         c.qk_norm = true;
         c.num_attention_heads = 8;
         c.num_key_value_heads = 1;  // every rank holds the one kv head
         c.head_dim = 16;
         return c;
       }},
  };
}

ModelOptions tp_options(int size) {
  ModelOptions o;
  o.tensor_parallel_size = size;
  o.make_rank_backend = [](int) { return make_cpu_backend(1); };
  return o;
}

// Logits of the same schedule (two sequences: uneven prefill chunks, then greedy decode steps
// with padding rows) on `model`; the tokens decoded are the whole model's (`follow`), so that
// every run sees the same inputs.
std::vector<std::vector<float>> run_schedule(Model& model, Backend& be, const ModelConfig& c,
                                             std::vector<std::vector<int32_t>>* follow) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(1, static_cast<int32_t>(c.vocab_size) - 1);
  PagedRunner runner(model, be, /*num_blocks=*/16, /*block_size=*/16, /*seed=*/2);
  std::vector<std::vector<float>> logits;
  for (int s = 0; s < 2; ++s) {
    std::vector<int32_t> p(s == 0 ? 21 : 9);
    for (auto& x : p) x = tok(rng);
    runner.feed(s, p);
  }
  std::vector<std::vector<float>> last(2);  // each sequence's newest logits rows
  auto run = [&](const std::vector<PagedRunner::Work>& work, int padding) {
    const auto out = runner.step(work, padding);
    for (size_t i = 0; i < work.size(); ++i) {
      last[static_cast<size_t>(work[i].seq)] = out[i];
      logits.push_back(out[i]);
    }
  };
  run({{0, 13, true}, {1, 9, true}}, 0);
  run({{0, 8, true}}, /*padding=*/3);
  const bool record = follow->empty();
  for (int step = 0; step < 5; ++step) {
    if (record) follow->emplace_back();
    std::vector<PagedRunner::Work> work;
    for (int s = 0; s < 2; ++s) {
      const std::vector<float>& l = last[static_cast<size_t>(s)];
      if (record) (*follow)[step].push_back(testing::argmax(l.data() + l.size() - c.vocab_size, c.vocab_size));
      runner.feed(s, {(*follow)[step][s]});
      work.push_back({s, 1, true});
    }
    run(work, step % 2);
  }
  return logits;
}

void expect_close(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size()) << what;
    double scale = 1, worst = 0;
    for (float x : want[i]) scale = std::max(scale, std::fabs(static_cast<double>(x)));
    for (size_t j = 0; j < got[i].size(); ++j)
      worst = std::max(worst, std::fabs(static_cast<double>(got[i][j]) - want[i][j]));
    EXPECT_LE(worst, 1e-4 * scale) << what << ", logits row " << i;
  }
}

class TensorParallelForward : public ::testing::TestWithParam<Variant> {};

TEST_P(TensorParallelForward, RanksTogetherGiveTheWholeModelsLogits) {
  const ModelConfig c = GetParam().make();
  auto be = make_cpu_backend(1);
  auto weights = make_dummy_weight_source(c, 3);
  auto whole = create_model(c, *weights, *be);
  std::vector<std::vector<int32_t>> decoded;
  const auto want = run_schedule(*whole, *be, c, &decoded);
  for (int size : {2, 4}) {
    if (c.num_attention_heads % size != 0) continue;
    auto split_weights = make_dummy_weight_source(c, 3);
    auto split = create_model(c, *split_weights, *be, tp_options(size));
    const KVCacheSpec spec = split->kv_cache_spec();
    EXPECT_EQ(spec.num_kv_heads, std::max<int64_t>(1, c.num_key_value_heads / size));
    expect_close(run_schedule(*split, *be, c, &decoded), want, std::string(GetParam().name) + " tp " +
                                                                   std::to_string(size));
  }
}

// What the step watchdog logs for a split model: every rank's count of collectives entered (equal
// once a forward is done) and its device's state.
TEST(TensorParallelProgress, EveryRankReportsTheCollectivesItEntered) {
  const ModelConfig c = variants().front().make();
  auto be = make_cpu_backend(1);
  auto weights = make_dummy_weight_source(c, 3);
  auto split = create_model(c, *weights, *be, tp_options(2));
  EXPECT_EQ(split->progress(), "rank 0: 0 collectives entered, device idle; rank 1: 0 collectives entered, device idle");
  std::vector<std::vector<int32_t>> decoded;
  run_schedule(*split, *be, c, &decoded);
  const std::string p = split->progress();
  const auto count = [&](const std::string& rank) {
    const size_t at = p.find(rank + ": ");
    return at == std::string::npos ? -1 : std::stol(p.substr(at + rank.size() + 2));
  };
  EXPECT_GT(count("rank 0"), 0) << p;
  EXPECT_EQ(count("rank 0"), count("rank 1")) << p;
  auto whole_weights = make_dummy_weight_source(c, 3);
  EXPECT_EQ(create_model(c, *whole_weights, *be)->progress(), "");
}

INSTANTIATE_TEST_SUITE_P(Variants, TensorParallelForward, ::testing::ValuesIn(variants()),
                         [](const auto& info) { return std::string(info.param.name); });

// DeepSeek's real configs made small (MLA with and without q LoRA, softmax and sigmoid routing,
// a dense first layer, several shared experts): heads, every expert and the shared experts split
// over 2 and 4 ranks give the whole model's logits, with shared-expert fusion off and on.
ModelConfig small_deepseek(const std::string& name, int64_t shared) {
  return testing::shrink_deepseek_config(
      load_model_config(testing::source_dir() / "bench" / "configs" / name / "config.json"), shared, /*heads=*/4);
}

TEST(TensorParallelDeepseek, RanksTogetherGiveTheWholeModelsLogits) {
  auto be = make_cpu_backend(1);
  for (const auto& [name, shared] : {std::pair<std::string, int64_t>{"DeepSeek-V2-Lite", 2}, {"DeepSeek-V3", 3}}) {
    const ModelConfig c = small_deepseek(name, shared);
    for (int fusion : {0, 1}) {
      ModelOptions whole_options;
      whole_options.shared_expert_fusion = fusion;
      auto weights = make_dummy_weight_source(c, 9);
      auto whole = create_model(c, *weights, *be, whole_options);
      std::vector<std::vector<int32_t>> decoded;
      const auto want = run_schedule(*whole, *be, c, &decoded);
      for (int size : {2, 4}) {
        ModelOptions options = tp_options(size);
        options.shared_expert_fusion = fusion;
        auto split_weights = make_dummy_weight_source(c, 9);
        auto split = create_model(c, *split_weights, *be, options);
        EXPECT_EQ(split->kv_cache_spec().head_dim, c.kv_lora_rank + c.qk_rope_head_dim);  // the whole latent
        expect_close(run_schedule(*split, *be, c, &decoded), want,
                     name + " fusion " + std::to_string(fusion) + " tp " + std::to_string(size));
      }
    }
  }
}

// Rank r's part of each weight is the matching block of the whole tensor: q/k/v and gate/up rows,
// o/down columns, o/down biases on rank 0 only, lm_head and embedding rows; norms whole.
TEST(TensorParallelWeights, EachRankLoadsItsBlockOfTheWholeTensor) {
  ModelConfig c = small_config(Architecture::kLlama);
  c.o_proj_bias = c.mlp_bias = true;
  c.num_key_value_heads = 1;  // 4 ranks share it
  auto be = make_cpu_backend(1);
  auto base = make_dummy_weight_source(c, 5);
  auto whole = [&](const std::string& name, const Shape& shape) { return base->load(name, shape, DType::kF32, *be); };
  const int64_t d = c.head_dim, h = c.hidden_size, inter = c.intermediate_size, v = c.vocab_size;
  const int size = 4;
  for (int rank = 0; rank < size; ++rank) {
    ShardedWeightSource shard(*base, rank, size, [&](const std::string& n) { return llama_weight_shard(n, c, rank, size); });
    auto part = [&](const std::string& name, const Shape& shape) { return shard.load(name, shape, DType::kF32, *be); };
    const std::string p = "model.layers.1.";
    // q rows: this rank's one head
    Tensor q = whole(p + "self_attn.q_proj.weight", {4 * d, h}), q_r = part(p + "self_attn.q_proj.weight", {d, h});
    for (int64_t i = 0; i < d * h; ++i) ASSERT_EQ(q_r.data_as<float>()[i], q.data_as<float>()[rank * d * h + i]);
    // the single kv head, whole on every rank
    Tensor k = whole(p + "self_attn.k_proj.weight", {d, h}), k_r = part(p + "self_attn.k_proj.weight", {d, h});
    EXPECT_EQ(k_r.to_f32_vector(), k.to_f32_vector());
    // o_proj columns
    Tensor o = whole(p + "self_attn.o_proj.weight", {h, 4 * d}), o_r = part(p + "self_attn.o_proj.weight", {h, d});
    for (int64_t i = 0; i < h; ++i)
      for (int64_t j = 0; j < d; ++j)
        ASSERT_EQ(o_r.data_as<float>()[i * d + j], o.data_as<float>()[i * 4 * d + rank * d + j]);
    // down columns and up rows
    const int64_t ir = inter / size;
    Tensor down = whole(p + "mlp.down_proj.weight", {h, inter}), down_r = part(p + "mlp.down_proj.weight", {h, ir});
    for (int64_t i = 0; i < h; ++i)
      for (int64_t j = 0; j < ir; ++j)
        ASSERT_EQ(down_r.data_as<float>()[i * ir + j], down.data_as<float>()[i * inter + rank * ir + j]);
    Tensor up = whole(p + "mlp.up_proj.weight", {inter, h}), up_r = part(p + "mlp.up_proj.weight", {ir, h});
    for (int64_t i = 0; i < ir * h; ++i) ASSERT_EQ(up_r.data_as<float>()[i], up.data_as<float>()[rank * ir * h + i]);
    // row-parallel biases: added once, by rank 0
    Tensor ob = whole(p + "self_attn.o_proj.bias", {h}), ob_r = part(p + "self_attn.o_proj.bias", {h});
    EXPECT_EQ(ob_r.to_f32_vector(), rank == 0 ? ob.to_f32_vector() : std::vector<float>(h, 0.0f));
    // lm_head and embedding rows (vocab-parallel); the norms whole
    for (const char* name : {"lm_head.weight", "model.embed_tokens.weight"}) {
      Tensor all = whole(name, {v, h}), rows = part(name, {v / size, h});
      for (int64_t i = 0; i < v / size * h; ++i)
        ASSERT_EQ(rows.data_as<float>()[i], all.data_as<float>()[rank * (v / size) * h + i]) << name;
    }
    EXPECT_EQ(part(p + "input_layernorm.weight", {h}).to_f32_vector(),
              whole(p + "input_layernorm.weight", {h}).to_f32_vector());
  }
}

// A checkpoint's slices are read from the file: rows and columns of a stored tensor.
TEST(TensorParallelWeights, CheckpointSlicesAreTheStoredTensorsBlocks) {
  testing::TempDir dir;
  std::vector<float> values(6 * 5);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  testing::write_checkpoint(dir.path(), nlohmann::json::object(), {{"w", Tensor::from_f32(values, {6, 5})}});
  auto source = open_safetensors_checkpoint(dir.path());
  auto be = make_cpu_backend(1);
  Tensor rows = source->load_slice("w", {6, 5}, TensorSlice{0, 2, 3}, DType::kF32, *be);
  EXPECT_EQ(rows.shape(), Shape({3, 5}));
  for (int64_t i = 0; i < 15; ++i) EXPECT_EQ(rows.data_as<float>()[i], values[10 + i]);
  Tensor cols = source->load_slice("w", {6, 5}, TensorSlice{1, 1, 2}, DType::kF32, *be);
  EXPECT_EQ(cols.shape(), Shape({6, 2}));
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 2; ++j) EXPECT_EQ(cols.data_as<float>()[i * 2 + j], values[i * 5 + 1 + j]);
  testing::expect_error_mentions([&] { source->load_slice("w", {6, 4}, TensorSlice{1, 0, 2}, DType::kF32, *be); },
                                 {"'w'", "[6, 5]", "[6, 4]"});
  testing::expect_error_mentions([&] { source->load_slice("w", {6, 5}, TensorSlice{1, 4, 2}, DType::kF32, *be); },
                                 {"does not fit"});
}

TEST(TensorParallelErrors, WhatCannotBeSplitIsNamed) {
  auto be = make_cpu_backend(1);
  auto make = [&](const ModelConfig& c, int size) {
    auto w = make_dummy_weight_source(c, 0);
    return create_model(c, *w, *be, tp_options(size));
  };
  const ModelConfig c = small_config(Architecture::kLlama);
  testing::expect_error_mentions([&] { make(c, 3); }, {"--tensor-parallel-size 3", "num_attention_heads (4)"});
  ModelConfig odd_vocab = c;
  odd_vocab.vocab_size = 97;
  testing::expect_error_mentions([&] { make(odd_vocab, 2); }, {"vocab_size (97)", "not divisible by 2"});
  ModelConfig kv3 = small_config(Architecture::kLlama);
  kv3.num_attention_heads = 6;
  kv3.num_key_value_heads = 3;
  kv3.intermediate_size = 96;
  testing::expect_error_mentions([&] { make(kv3, 2); }, {"num_key_value_heads (3)", "divide or be divisible by 2"});
  ModelConfig inter = c;
  inter.intermediate_size = 81;
  testing::expect_error_mentions([&] { make(inter, 2); }, {"intermediate_size (81)"});
  ModelConfig deepseek = small_deepseek("DeepSeek-V3", 1);
  deepseek.moe_intermediate_size = 22;
  testing::expect_error_mentions([&] { check_tensor_parallel(deepseek, 4); }, {"moe_intermediate_size (22)"});
}

}  // namespace
}  // namespace specula
