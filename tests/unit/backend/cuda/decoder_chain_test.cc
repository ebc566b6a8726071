// The fused greedy decode chain (Model::greedy_chain -> CudaBackend::decoder_greedy_chain, one
// persistent kernel) against the layer-by-layer forward on the embedded draft model's real
// weights: from the same prefilled caches, every step's token is the argmax of the forward's
// logits for the same input (teacher-forced with the chain's own tokens; a different token only
// where two logits are within rounding), and the K/V the chain writes equals what the forward
// writes, padding rows writing nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>

#include "model/model.h"
#include "model/weight_source.h"
#include "test_paths.h"
#include "unit/backend/cuda/cuda_test_util.h"
#include "unit/model/forward_runner.h"

namespace specula {
namespace {

constexpr int kBlockSize = 16;

void expect_chain_matches_forward(int real_rows, int padding_rows, int steps, unsigned seed) {
  SCOPED_TRACE("rows " + std::to_string(real_rows) + " + " + std::to_string(padding_rows) + " padding, steps " +
               std::to_string(steps));
  auto gpu = make_cuda_backend(0);
  const auto dir = testing::models_dir() / "specula-tiny-draft";
  auto weights = open_safetensors_checkpoint(dir);
  auto model = create_model(load_model_config(dir), *weights, *gpu);
  const int64_t vocab = model->config().vocab_size;
  // Two runners with the same seed hand out the same blocks: the chain writes one cache, the
  // layer-by-layer steps the other.
  testing::PagedRunner fused(*model, *gpu, 64, kBlockSize, seed), ref(*model, *gpu, 64, kBlockSize, seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(1, static_cast<int32_t>(vocab) - 1);
  std::vector<int64_t> lens;
  std::vector<testing::PagedRunner::Work> prefill;
  for (int r = 0; r < real_rows; ++r) {
    std::vector<int32_t> prompt(static_cast<size_t>(17 + 13 * r));
    for (int32_t& t : prompt) t = token(rng);
    fused.feed(r, prompt);
    ref.feed(r, prompt);
    lens.push_back(static_cast<int64_t>(prompt.size()));
    prefill.push_back({r, lens.back(), false});
  }
  const auto logits = fused.step(prefill);
  ref.step(prefill);

  // The chain's inputs: step s of row r decodes position len_r + s; padding rows sit at position
  // 0 without writing, attending block 0 of row 0.
  const int rows = real_rows + padding_rows;
  int width = 1;
  for (int r = 0; r < real_rows; ++r)
    width = std::max<int>(width, static_cast<int>(fused.blocks_for(r, lens[r] + steps).size()));
  for (int r = 0; r < real_rows; ++r) ref.blocks_for(r, lens[r] + steps);
  std::vector<int32_t> first(rows, 0), positions(static_cast<size_t>(steps) * rows, 0), tables(rows * width, 0);
  std::vector<int64_t> slots(static_cast<size_t>(steps) * rows, -1);
  for (int r = 0; r < rows; ++r) {
    const std::vector<int32_t>& blocks = fused.blocks_for(r < real_rows ? r : 0, r < real_rows ? lens[r] + steps : 1);
    std::copy(blocks.begin(), blocks.end(), tables.begin() + r * width);
    if (r >= real_rows) continue;
    first[r] = testing::argmax(logits[r].data(), vocab);
    for (int s = 0; s < steps; ++s) {
      const int64_t pos = lens[r] + s;
      positions[s * rows + r] = static_cast<int32_t>(pos);
      slots[s * rows + r] = int64_t{blocks[pos / kBlockSize]} * kBlockSize + pos % kBlockSize;
    }
  }
  DecoderChain chain;
  chain.rows = rows;
  chain.steps = steps;
  chain.first_tokens = testing::to_gpu(*gpu, Tensor::from_i32(first));
  chain.positions = testing::to_gpu(*gpu, Tensor::from_i32(positions));
  chain.slots = testing::to_gpu(*gpu, Tensor::from_i64(slots));
  chain.block_tables = testing::to_gpu(*gpu, Tensor::from_i32(tables, {rows, width}));
  chain.out_tokens = gpu->empty({static_cast<int64_t>(steps) * rows}, DType::kI32);
  chain.kv = &fused.kv();
  chain.block_size = kBlockSize;
  ASSERT_TRUE(model->greedy_chain(chain)) << "the CUDA backend has no fused chain for the embedded draft";
  Tensor out_host = Tensor::empty({static_cast<int64_t>(steps) * rows}, DType::kI32);
  gpu->copy(chain.out_tokens, out_host);
  gpu->synchronize();
  const int32_t* out = out_host.data_as<int32_t>();

  // Layer by layer, fed the chain's tokens.
  int exact = 0, total = 0;
  for (int s = 0; s < steps; ++s) {
    std::vector<testing::PagedRunner::Work> work;
    for (int r = 0; r < real_rows; ++r) {
      ref.feed(r, {s == 0 ? first[r] : out[(s - 1) * rows + r]});
      work.push_back({r, 1, false});
    }
    const auto step_logits = ref.step(work);
    for (int r = 0; r < real_rows; ++r) {
      const std::vector<float>& l = step_logits[r];
      const int32_t want = testing::argmax(l.data(), vocab), got = out[s * rows + r];
      ASSERT_GE(got, 0);
      ASSERT_LT(got, vocab);
      ++total;
      if (got == want) {
        ++exact;
        continue;
      }
      EXPECT_LE(l[want] - l[got], 0.05f) << "step " << s << " row " << r << ": chain " << got << ", forward " << want;
    }
  }
  EXPECT_GE(exact, total - std::max(1, total / 10)) << exact << " of " << total << " tokens equal";

  // The K/V written: the same entries (padding rows wrote nothing: block contents equal too).
  for (size_t l = 0; l < fused.kv().size(); ++l) {
    testing::expect_close(testing::to_host(*gpu, fused.kv()[l].k), testing::to_host(*gpu, ref.kv()[l].k), 1.0 / 64, 1e-2,
                          "layer " + std::to_string(l) + " K");
    testing::expect_close(testing::to_host(*gpu, fused.kv()[l].v), testing::to_host(*gpu, ref.kv()[l].v), 1.0 / 64, 1e-2,
                          "layer " + std::to_string(l) + " V");
  }
}

TEST(DecoderChain, FusedChainIsTheLayerByLayerForwardsArgmax) {
  SKIP_WITHOUT_GPU();
  expect_chain_matches_forward(1, 0, 4, 1);
  expect_chain_matches_forward(1, 0, 9, 4);
  expect_chain_matches_forward(3, 1, 5, 2);
  expect_chain_matches_forward(8, 0, 2, 3);
}

// The kernel's other lm_head path (rows read from L2 by the scalar GEMV, where the tensor-core path
// reads them from shared memory) gives the same tokens.
TEST(DecoderChain, LmHeadFromL2IsTheForwardsArgmaxToo) {
  SKIP_WITHOUT_GPU();
  struct LmHeadInL2 {  // the backend reads it on every chain; unset however the test ends
    LmHeadInL2() { setenv("SPECULA_FUSED_CHAIN_LM_HEAD", "l2", 1); }
    ~LmHeadInL2() { unsetenv("SPECULA_FUSED_CHAIN_LM_HEAD"); }
  } l2;
  expect_chain_matches_forward(1, 0, 4, 5);
  expect_chain_matches_forward(3, 1, 3, 6);
}

// Shapes the kernel is not for are declined without running anything.
TEST(DecoderChain, DeclinesMoreRowsThanTheKernelTakes) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  const auto dir = testing::models_dir() / "specula-tiny-draft";
  auto weights = open_safetensors_checkpoint(dir);
  auto model = create_model(load_model_config(dir), *weights, *gpu);
  testing::PagedRunner runner(*model, *gpu, 8, kBlockSize, 1);
  DecoderChain chain;
  chain.rows = 9;
  chain.steps = 1;
  chain.kv = &runner.kv();
  chain.block_size = kBlockSize;
  EXPECT_FALSE(model->greedy_chain(chain));
}

}  // namespace
}  // namespace specula
