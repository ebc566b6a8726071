// EAGLE head configs: the public Llama-3.1-8B EAGLE-3 head's config.json (bench/configs) read
// against its target, vLLM's default feature layers, and the head's forward against transformers
// (the trained specula-tiny-eagle3 head, tests/fixtures/embedded/specula-tiny-eagle3).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "backend/backend.h"
#include "model/config.h"
#include "model/eagle_head.h"
#include "model/safetensors.h"
#include "model/weight_source.h"
#include "test_paths.h"

namespace specula {
namespace {

std::filesystem::path bench(const std::string& name) { return testing::source_dir() / "bench" / "configs" / name; }

TEST(EagleHeadConfig, ThePublicLlama31Eagle3HeadFitsItsTarget) {
  const ModelConfig target = load_model_config(bench("Llama-3.1-8B-Instruct"));
  const EagleHeadConfig c = load_eagle_head_config(bench("EAGLE3-Llama-3.1-8B"), EagleVersion::kEagle3, target);
  EXPECT_EQ(c.version, EagleVersion::kEagle3);
  EXPECT_EQ(c.layer.hidden_size, 4096);
  EXPECT_EQ(c.layer.num_attention_heads, 32);
  EXPECT_EQ(c.layer.num_key_value_heads, 8);
  EXPECT_EQ(c.layer.head_dim, 128);
  EXPECT_EQ(c.layer.intermediate_size, 14336);
  EXPECT_EQ(c.draft_vocab_size, 31960);
  EXPECT_EQ(c.target_hidden_size, 4096);
  // No eagle_config: vLLM's low / middle / high layers of 32.
  EXPECT_EQ(c.aux_layers, (std::vector<int>{2, 16, 29}));
  EXPECT_EQ(c.feature_size(), 3 * 4096);
  // The same head under the wrong method, or for a target it was not trained for.
  EXPECT_THROW(load_eagle_head_config(bench("EAGLE3-Llama-3.1-8B"), EagleVersion::kEagle1, target), Error);
  EXPECT_THROW(load_eagle_head_config(bench("EAGLE3-Llama-3.1-8B"), EagleVersion::kEagle3,
                                      load_model_config(bench("Qwen3-8B"))),
               Error);
}

TEST(EagleHeadConfig, ThePublicLlama3_70BEagle3HeadFitsItsTarget) {
  const ModelConfig target = load_model_config(bench("Llama-3.1-70B-Instruct"));
  const EagleHeadConfig c = load_eagle_head_config(bench("EAGLE3-Llama-3.1-70B"), EagleVersion::kEagle3, target);
  EXPECT_EQ(c.layer.hidden_size, 8192);
  EXPECT_EQ(c.layer.num_attention_heads, 64);
  EXPECT_EQ(c.layer.num_key_value_heads, 8);
  EXPECT_EQ(c.layer.intermediate_size, 28672);
  EXPECT_EQ(c.draft_vocab_size, 32000);
  EXPECT_EQ(c.target_hidden_size, 8192);
  EXPECT_EQ(c.aux_layers, (std::vector<int>{2, 40, 77}));  // vLLM's low / middle / high layers of 80
  EXPECT_THROW(load_eagle_head_config(bench("EAGLE3-Llama-3.1-70B"), EagleVersion::kEagle3,
                                      load_model_config(bench("Llama-3.1-8B-Instruct"))),
               Error);
}

// One sequence's rows [first, first + n) in blocks 0, 1, 2, ... (block size 16), every row a
// logits row; the caller's host vectors stay alive while the input is used.
struct SequenceRows {
  ForwardInput in;
  std::vector<int32_t> qsl, lens;
};
SequenceRows sequence_rows(Backend& b, const std::vector<int32_t>& tokens, int first) {
  const int n = static_cast<int>(tokens.size()), len = first + n, block = 16;
  std::vector<int32_t> positions(n), rows(n), table((len + block - 1) / block);
  std::vector<int64_t> slots(n);
  std::iota(positions.begin(), positions.end(), first);
  std::iota(rows.begin(), rows.end(), 0);
  std::iota(table.begin(), table.end(), 0);
  for (int i = 0; i < n; ++i) slots[i] = first + i;
  auto up = [&](const Tensor& host) {
    Tensor t = b.empty(host.shape(), host.dtype());
    b.copy(host, t);
    return t;
  };
  SequenceRows r;
  r.qsl = {0, n};
  r.lens = {len};
  ForwardInput& in = r.in;
  in.token_ids = up(Tensor::from_i32(tokens));
  in.positions = up(Tensor::from_i32(positions));
  in.logits_indices = up(Tensor::from_i32(rows));
  in.attn.num_seqs = 1;
  in.attn.num_tokens = n;
  in.attn.max_query_len = n;
  in.attn.max_seq_len = len;
  in.attn.block_size = block;
  in.attn.query_start_loc = up(Tensor::from_i32(r.qsl));
  in.attn.seq_lens = up(Tensor::from_i32(r.lens));
  in.attn.block_tables = up(Tensor::from_i32(table, {1, static_cast<int64_t>(table.size())}));
  in.attn.slot_mapping = up(Tensor::from_i64(slots));
  in.attn.query_start_loc_host = r.qsl;
  in.attn.seq_lens_host = r.lens;
  return r;
}

std::vector<KVCacheLayer> kv_layers(Backend& b, const KVCacheSpec& spec) {
  std::vector<KVCacheLayer> kv;
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    KVCacheLayer layer{b.empty({8, 16, spec.num_kv_heads, spec.head_dim}, b.compute_dtype()),
                       b.empty({8, 16, spec.num_kv_heads, spec.v_head_dim}, b.compute_dtype())};
    b.zero(layer.k);
    b.zero(layer.v);
    kv.push_back(layer);
  }
  return kv;
}

std::vector<float> to_host(Backend& b, const Tensor& t) {
  Tensor h = Tensor::empty(t.shape(), DType::kF32);
  b.copy(t, h);
  return h.to_f32_vector();
}

// The trained head of the embedded target against transformers (tools/train/eagle3.py make_fixture,
// fp32 from the shipped bf16 weights): per prompt, fc of the target's layer-2/4/5 features, the
// top-5 draft logits of every target-fed row, and a 4-step greedy chain from the last position
// (each step reading the previous step's prenorm output). Same ids, logits within 1e-3 of scale.
TEST(EagleHead, TheTrainedHeadMatchesTransformers) {
  const auto models = testing::models_dir();
  const auto fixture = testing::fixtures_dir() / "embedded" / "specula-tiny-eagle3" / "reference.safetensors";
  if (!std::filesystem::exists(models / "specula-tiny-eagle3" / "model.safetensors")) GTEST_SKIP() << "no trained head";
  auto st = SafetensorsFile::open(fixture);
  auto read_i32 = [&](const std::string& name) {
    const SafetensorsEntry* e = st->find(name);
    SPECULA_CHECK(e != nullptr, "fixture lacks {}", name);
    std::vector<int32_t> v(e->nbytes() / 4);
    std::memcpy(v.data(), st->data(*e), e->nbytes());
    return v;
  };
  auto read_f32 = [&](const std::string& name) {
    const SafetensorsEntry* e = st->find(name);
    SPECULA_CHECK(e != nullptr, "fixture lacks {}", name);
    std::vector<float> v(e->nbytes() / 4);
    std::memcpy(v.data(), st->data(*e), e->nbytes());
    return v;
  };

  std::unique_ptr<Backend> backend = make_cpu_backend(2);
  const ModelConfig tc = load_model_config(models / "specula-tiny");
  auto target_weights = open_safetensors_checkpoint(models / "specula-tiny");
  std::unique_ptr<Model> target = create_model(tc, *target_weights, *backend);
  const EagleHeadConfig hc = load_eagle_head_config(models / "specula-tiny-eagle3", EagleVersion::kEagle3, tc);
  ASSERT_EQ(hc.aux_layers, (std::vector<int>{2, 4, 5}));
  auto head_weights = open_safetensors_checkpoint(models / "specula-tiny-eagle3");
  EagleHead head(hc, *head_weights, *backend, *target, false);
  target->set_aux_hidden_state_layers(hc.aux_layers);
  const int64_t h = head.hidden_size();

  auto expect_top5 = [&](const std::vector<float>& logits, int64_t row, const int32_t* ids, const float* want,
                         const std::string& where) {
    const int64_t v = tc.vocab_size;
    const float* got = logits.data() + row * v;
    std::vector<int32_t> order(static_cast<size_t>(v));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 5, order.end(), [&](int32_t a, int32_t b) {
      return got[a] > got[b] || (got[a] == got[b] && a < b);
    });
    const double scale = std::max(1.0, static_cast<double>(std::fabs(want[0])));
    EXPECT_EQ(order[0], ids[0]) << where << ": draft argmax";
    for (int j = 0; j < 5; ++j)
      EXPECT_NEAR(got[ids[j]], want[j], 1e-3 * scale) << where << ": logit of target id " << ids[j];
  };

  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    const std::string n = std::to_string(i);
    const std::vector<int32_t> prompt = read_i32("prompt_" + n);
    const int t = static_cast<int>(prompt.size());
    // The target over the prompt: its aux features of every position.
    std::vector<KVCacheLayer> target_kv = kv_layers(*backend, target->kv_cache_spec());
    SequenceRows rows = sequence_rows(*backend, prompt, 0);
    ForwardOutput fwd = target->forward(rows.in, target_kv);
    ASSERT_TRUE(fwd.aux_hidden_states.defined());
    ASSERT_EQ(fwd.aux_hidden_states.size(1), 3 * tc.hidden_size);
    Tensor features = backend->empty(fwd.aux_hidden_states.shape(), backend->compute_dtype());
    backend->copy(fwd.aux_hidden_states, features);
    {
      // A step whose features nobody reads leaves them out, and its logits are the same.
      const std::vector<float> with_features = to_host(*backend, fwd.logits);
      std::vector<KVCacheLayer> plain_kv = kv_layers(*backend, target->kv_cache_spec());
      ForwardInput plain = rows.in;
      plain.with_aux_hidden_states = false;
      ForwardOutput without = target->forward(plain, plain_kv);
      EXPECT_FALSE(without.aux_hidden_states.defined());
      EXPECT_EQ(to_host(*backend, without.logits), with_features);
    }

    // Step 0: every position p reads feat(p) and token p + 1 (the target's greedy token after the
    // prompt for the last row).
    std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
    next.push_back(read_i32("next_token_" + n)[0]);
    std::vector<KVCacheLayer> head_kv = kv_layers(*backend, head.kv_cache_spec());
    SequenceRows head_rows = sequence_rows(*backend, next, 0);
    EagleForwardInput in;
    in.rows = head_rows.in;
    in.hidden = features;
    backend->reset_scratch();
    EagleForwardOutput out = head.forward(in, head_kv[0]);
    const std::vector<float> logits = to_host(*backend, out.logits);
    const std::vector<int32_t> ids0 = read_i32("step0_top5_ids_" + n);
    const std::vector<float> want0 = read_f32("step0_top5_logits_" + n);
    for (int p = 0; p < t; ++p) expect_top5(logits, p, &ids0[p * 5], &want0[p * 5], "row " + std::to_string(p));

    // The chain: draft 1 is row T-1's argmax; step j reads the previous step's prenorm at its row.
    const std::vector<int32_t> chain = read_i32("chain_tokens_" + n);
    const std::vector<int32_t> chain_ids = read_i32("chain_top5_ids_" + n);
    const std::vector<float> chain_logits = read_f32("chain_top5_logits_" + n);
    expect_top5(logits, t - 1, &chain_ids[0], &chain_logits[0], "chain step 1");
    Tensor prenorm = backend->empty({1, h}, backend->compute_dtype());
    backend->copy(out.prenorm.slice(t - 1, t), prenorm);
    for (size_t j = 1; j < chain.size(); ++j) {
      SequenceRows step = sequence_rows(*backend, {chain[j - 1]}, t - 1 + static_cast<int>(j));
      EagleForwardInput s;
      s.rows = step.in;
      s.hidden = prenorm;
      s.from_target = false;
      backend->reset_scratch();
      EagleForwardOutput o = head.forward(s, head_kv[0]);
      const std::vector<float> l = to_host(*backend, o.logits);
      expect_top5(l, 0, &chain_ids[j * 5], &chain_logits[j * 5], "chain step " + std::to_string(j + 1));
      EXPECT_EQ(*std::max_element(l.begin(), l.end()), l[chain[j]]) << "chain step " << j + 1;
      backend->copy(o.prenorm, prenorm);
    }
  }
}

}  // namespace
}  // namespace specula
