// CUDA graphs of decode steps, at two levels:
//  - PaddedGraphs over a real model's forward (the Qwen3 fixture): a replay gives bit for bit the
//    logits of an eager forward of the same inputs, and follows new inputs copied into the same
//    buffers;
//  - the ModelRunner through the EngineCore: greedy continuations of several batches (sizes that
//    pad up to a captured size and ones that match one) are the same with decode graphs as
//    without, on the embedded specula-tiny model, with the device sampler; with the second set of
//    decode graphs for short sequences, which the first steps replay; with the sets captured
//    without EAGLE-3's features, which idle speculative steps replay; and on 2 GPUs with the
//    model split over them (tensor parallelism: one graph per GPU, replayed together).
#include <gtest/gtest.h>

#include <numeric>

#include "sampling/device_sampler.h"
#include "engine/engine_core.h"
#include "engine_fakes.h"
#include "backend/padded_graphs.h"
#include "model/model.h"
#include "model/weight_source.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"
#include "unit/backend/cuda/cuda_test_util.h"

namespace specula {
namespace {

namespace fs = std::filesystem;
using testing::to_gpu;
using testing::to_host;

// A decode batch of `size` sequences, sequence s with `len[s]` tokens in blocks s*4 .. s*4+3.
struct DecodeBuffers {
  Tensor tokens, positions, slots, qsl, lens, tables, logits_idx;
  ForwardInput input(int size, int max_len) const {
    ForwardInput in;
    in.token_ids = tokens.slice(0, size);
    in.positions = positions.slice(0, size);
    in.logits_indices = logits_idx.slice(0, size);
    in.attn.num_seqs = size;
    in.attn.num_tokens = size;
    in.attn.max_query_len = 1;
    in.attn.max_seq_len = max_len;
    in.attn.block_size = 16;
    in.attn.query_start_loc = qsl.slice(0, size + 1);
    in.attn.seq_lens = lens.slice(0, size);
    in.attn.slot_mapping = slots.slice(0, size);
    in.attn.block_tables = tables.slice(0, size);
    in.attn.query_start_loc_host.resize(size + 1);
    std::iota(in.attn.query_start_loc_host.begin(), in.attn.query_start_loc_host.end(), 0);
    in.attn.seq_lens_host.assign(size, max_len);
    return in;
  }
};

TEST(PaddedGraphs, ReplayEqualsEagerBitForBit) {
  SKIP_WITHOUT_GPU();
  const fs::path dir = testing::fixtures_dir() / "models" / "qwen3_yarn_tied";
  auto gpu = make_cuda_backend(0);
  auto weights = open_safetensors_checkpoint(dir);
  auto model = create_model(load_model_config(dir), *weights, *gpu);
  const KVCacheSpec spec = model->kv_cache_spec();
  const int max_seqs = 4, blocks_per_seq = 4, max_len = 64;
  std::vector<KVCacheLayer> kv;
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    kv.push_back({gpu->empty({max_seqs * blocks_per_seq, 16, spec.num_kv_heads, spec.head_dim}, DType::kBF16),
                  gpu->empty({max_seqs * blocks_per_seq, 16, spec.num_kv_heads, spec.v_head_dim}, DType::kBF16)});
    gpu->zero(kv.back().k);
    gpu->zero(kv.back().v);
  }
  // Fill the cache with a prefill of each sequence (different lengths), eagerly.
  const std::vector<int32_t> lens{9, 33, 17, 50};
  for (int s = 0; s < max_seqs; ++s) {
    std::vector<int32_t> ids(lens[s] - 1), pos(ids.size());
    std::vector<int64_t> slots(ids.size());
    for (size_t j = 0; j < ids.size(); ++j) {
      ids[j] = 3 + (static_cast<int>(j) * 37 + s * 11) % 300;
      pos[j] = static_cast<int32_t>(j);
      slots[j] = s * blocks_per_seq * 16 + static_cast<int64_t>(j);
    }
    std::vector<int32_t> table(blocks_per_seq);
    std::iota(table.begin(), table.end(), s * blocks_per_seq);
    ForwardInput in;
    in.token_ids = to_gpu(*gpu, Tensor::from_i32(ids));
    in.positions = to_gpu(*gpu, Tensor::from_i32(pos));
    in.logits_indices = to_gpu(*gpu, Tensor::from_i32({static_cast<int32_t>(ids.size()) - 1}));
    in.attn.num_seqs = 1;
    in.attn.num_tokens = static_cast<int32_t>(ids.size());
    in.attn.max_query_len = in.attn.num_tokens;
    in.attn.max_seq_len = in.attn.num_tokens;
    in.attn.query_start_loc = to_gpu(*gpu, Tensor::from_i32({0, in.attn.num_tokens}));
    in.attn.seq_lens = to_gpu(*gpu, Tensor::from_i32({in.attn.num_tokens}));
    in.attn.block_tables = to_gpu(*gpu, Tensor::from_i32(table, {1, blocks_per_seq}));
    in.attn.slot_mapping = to_gpu(*gpu, Tensor::from_i64(slots));
    in.attn.query_start_loc_host = {0, in.attn.num_tokens};
    in.attn.seq_lens_host = {in.attn.num_tokens};
    model->forward(in, kv);
  }
  // Static decode buffers: token lens[s] - 1 of each sequence.
  DecodeBuffers b;
  std::vector<int32_t> tokens, positions, qsl{0}, seq_lens, table, idx;
  std::vector<int64_t> slots;
  for (int s = 0; s < max_seqs; ++s) {
    tokens.push_back(100 + s);
    positions.push_back(lens[s] - 1);
    slots.push_back(s * blocks_per_seq * 16 + lens[s] - 1);
    qsl.push_back(s + 1);
    seq_lens.push_back(lens[s]);
    idx.push_back(s);
    for (int j = 0; j < blocks_per_seq; ++j) table.push_back(s * blocks_per_seq + j);
  }
  b.tokens = to_gpu(*gpu, Tensor::from_i32(tokens));
  b.positions = to_gpu(*gpu, Tensor::from_i32(positions));
  b.slots = to_gpu(*gpu, Tensor::from_i64(slots));
  b.qsl = to_gpu(*gpu, Tensor::from_i32(qsl));
  b.lens = to_gpu(*gpu, Tensor::from_i32(seq_lens));
  b.tables = to_gpu(*gpu, Tensor::from_i32(table, {max_seqs, blocks_per_seq}));
  b.logits_idx = to_gpu(*gpu, Tensor::from_i32(idx));

  PaddedGraphs graphs(*gpu);
  std::map<int, ForwardOutput> outs;
  graphs.capture({1, 2, 4}, [&](int size) { outs[size] = model->forward(b.input(size, max_len), kv); });
  ASSERT_EQ(graphs.sizes(), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(graphs.padded_size(3), 4);
  EXPECT_EQ(graphs.padded_size(5), 0);
  for (int size : {1, 2, 4}) {
    gpu->zero(outs[size].logits);
    ASSERT_TRUE(graphs.replay(size));
    const std::vector<float> replayed = to_host(*gpu, outs[size].logits);
    const std::vector<float> eager = to_host(*gpu, model->forward(b.input(size, max_len), kv).logits);
    EXPECT_EQ(replayed, eager) << "size " << size;
  }
  // New tokens in the same buffers: the replay follows them.
  Tensor fresh = Tensor::from_i32({7, 8, 9, 10});
  gpu->copy(fresh, b.tokens);
  ASSERT_TRUE(graphs.replay(4));
  const std::vector<float> replayed = to_host(*gpu, outs[4].logits);
  EXPECT_EQ(replayed, to_host(*gpu, model->forward(b.input(4, max_len), kv).logits));
}

// Greedy continuations through EngineCore + ModelRunner on the GPU, with or without graphs.
std::vector<std::vector<int32_t>> run_greedy(Model& model, Backend& gpu, const Tokenizer& tok,
                                             const std::vector<std::vector<int32_t>>& prompts, bool graphs,
                                             size_t* num_graphs, int64_t* decode_replays = nullptr,
                                             int short_graph_len = 0, int64_t* short_replays = nullptr,
                                             Speculator* speculator = nullptr, int64_t* featureless_replays = nullptr) {
  EngineCoreConfig c;
  c.max_model_len = 256;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 64;
  c.block_size = 16;
  c.num_blocks = 256;
  c.vocab_size = model.config().vocab_size;
  auto sampler = make_sampler(gpu, c.max_num_seqs, c.vocab_size);
  ModelRunnerConfig rc;
  rc.max_num_seqs = c.max_num_seqs;
  rc.max_num_batched_tokens = c.max_num_batched_tokens;
  rc.max_model_len = c.max_model_len;
  rc.block_size = c.block_size;
  rc.num_blocks = c.num_blocks;
  rc.short_decode_graph_len = short_graph_len;
  if (speculator) {
    c.num_speculative_tokens = rc.num_speculative_tokens = speculator->num_speculative_tokens();
    c.spec_adaptive = speculator->adaptive();
  }
  ModelRunner runner(model, gpu, *sampler, rc);
  if (speculator) runner.set_speculator(speculator);
  if (graphs) *num_graphs = runner.capture_decode_graphs(PaddedGraphs::default_sizes(c.max_num_seqs));
  EngineCore core(c, runner, tok);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = 32;
    p.ignore_eos = true;
    streams.push_back(std::make_shared<RequestStream>());
    core.add_request(NewRequest{"r" + std::to_string(i), prompts[i], p}, streams.back());
  }
  while (core.step()) {
  }
  if (decode_replays) *decode_replays = runner.num_graph_replays(1);
  if (short_replays) *short_replays = runner.num_short_graph_replays();
  if (featureless_replays) *featureless_replays = runner.num_featureless_graph_replays();
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestOutput o;
    while (streams[i]->pop(&o, std::chrono::milliseconds(0))) {
      EXPECT_FALSE(o.error.has_value()) << *o.error;
      for (const ChoiceDelta& d : o.choices) out[i].insert(out[i].end(), d.token_ids.begin(), d.token_ids.end());
    }
  }
  return out;
}

// With one set of decode graphs, and with a second set captured for sequences of at most 24
// tokens: the steps of the prompts (1-9 tokens) replay it until their sequences pass 24 tokens,
// then the other set.
TEST(DecodeGraphs, GreedyContinuationsEqualEagerOnes) {
  SKIP_WITHOUT_GPU();
  const fs::path dir = testing::models_dir() / "specula-tiny";
  auto gpu = make_cuda_backend(0);
  auto weights = open_safetensors_checkpoint(dir);
  auto model = create_model(load_model_config(dir), *weights, *gpu);
  auto tok = Tokenizer::from_dir(dir);
  const std::vector<std::string> texts{"The quick brown fox", "Once upon a time, in a small village,",
                                       "def fibonacci(n):", "1, 2, 3, 4,", "The capital of France is",
                                       "Hello"};
  for (size_t batch : {1u, 3u, 4u, 6u}) {
    std::vector<std::vector<int32_t>> prompts;
    for (size_t i = 0; i < batch; ++i) prompts.push_back(tok->encode(texts[i]));
    const auto eager = run_greedy(*model, *gpu, *tok, prompts, false, nullptr);
    for (int short_graph_len : {0, 24}) {
      SCOPED_TRACE("batch " + std::to_string(batch) + ", short_decode_graph_len " + std::to_string(short_graph_len));
      size_t num_graphs = 0;
      int64_t replays = 0, short_replays = 0;
      const auto graphed =
          run_greedy(*model, *gpu, *tok, prompts, true, &num_graphs, &replays, short_graph_len, &short_replays);
      if (short_graph_len == 0) {
        EXPECT_EQ(num_graphs, 4u) << "sizes 1, 2, 4, 8";
        EXPECT_EQ(short_replays, 0);
      } else {
        EXPECT_EQ(num_graphs, 8u) << "sizes 1, 2, 4, 8 in both sets";
        EXPECT_GT(short_replays, 0) << "no step replayed a short-sequence graph";
        EXPECT_GT(replays, short_replays) << "no step replayed a graph of the other set";
      }
      for (size_t i = 0; i < batch; ++i) {
        EXPECT_EQ(eager[i].size(), 32u);
        EXPECT_EQ(graphed[i], eager[i]) << "prompt " << i;
      }
    }
  }
}

// A target that returns EAGLE-3's features (three aux layers, as the embedded head reads): both
// decode sets are captured once more without them, and the steps no proposer reads replay those,
// with the tokens of eager steps.
TEST(DecodeGraphs, IdleStepsReplayGraphsWithoutTheFeatures) {
  SKIP_WITHOUT_GPU();
  const fs::path dir = testing::models_dir() / "specula-tiny";
  auto gpu = make_cuda_backend(0);
  auto weights = open_safetensors_checkpoint(dir);
  auto model = create_model(load_model_config(dir), *weights, *gpu);
  model->set_aux_hidden_state_layers({2, 4, 5});
  auto tok = Tokenizer::from_dir(dir);
  std::vector<std::vector<int32_t>> prompts;
  for (const char* text : {"The quick brown fox", "def fibonacci(n):", "1, 2, 3, 4,"}) prompts.push_back(tok->encode(text));
  testing::IdleSpeculator eager_spec, graph_spec;
  const auto eager = run_greedy(*model, *gpu, *tok, prompts, false, nullptr, nullptr, 0, nullptr, &eager_spec);
  size_t num_graphs = 0;
  int64_t replays = 0, short_replays = 0, featureless = 0;
  const auto graphed = run_greedy(*model, *gpu, *tok, prompts, true, &num_graphs, &replays, 24, &short_replays,
                                  &graph_spec, &featureless);
  // Sizes 1, 2, 4, 8: decode, short decode, and each again without the features; verification of
  // 1 and 2 drafts.
  EXPECT_EQ(num_graphs, 4u * 6);
  EXPECT_GT(short_replays, 0);
  EXPECT_GT(featureless, 0);
  EXPECT_EQ(featureless, replays) << "an idle step replayed a graph that copies the features";
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(graphed[i], eager[i]) << "prompt " << i;
}

// The embedded model split over 2 GPUs: a decode graph is one graph per GPU, each rank's recorded
// on its own thread with its NCCL collectives and the copy of the step's inputs from GPU 0; the
// replayed steps give the eager steps' tokens.
TEST(DecodeGraphs, TensorParallelGraphsEqualEagerSteps) {
  SKIP_WITHOUT_GPU();
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  const fs::path dir = testing::models_dir() / "specula-tiny";
  auto gpu = make_cuda_backend(0);
  auto weights = open_safetensors_checkpoint(dir);
  ModelOptions options;
  options.tensor_parallel_size = 2;
  options.make_rank_backend = [](int rank) { return make_cuda_backend(rank); };
  auto model = create_model(load_model_config(dir), *weights, *gpu, options);
  gpu->bind_thread();
  auto tok = Tokenizer::from_dir(dir);
  std::vector<std::vector<int32_t>> prompts;
  for (const char* text : {"The quick brown fox", "def fibonacci(n):", "1, 2, 3, 4,"}) prompts.push_back(tok->encode(text));
  size_t num_graphs = 0;
  int64_t replays = 0;
  const auto eager = run_greedy(*model, *gpu, *tok, prompts, false, nullptr);
  const auto graphed = run_greedy(*model, *gpu, *tok, prompts, true, &num_graphs, &replays);
  EXPECT_EQ(num_graphs, 4u) << "sizes 1, 2, 4, 8";
  EXPECT_GT(replays, 0) << "no decode step replayed a graph";
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(eager[i].size(), 32u);
    EXPECT_EQ(graphed[i], eager[i]) << "prompt " << i;
  }
}

}  // namespace
}  // namespace specula
