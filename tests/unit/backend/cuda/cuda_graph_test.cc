// A whole decode step of a real model (the Qwen3 fixture through create_model) captured into a
// CUDA graph and replayed: the capture itself proves that the forward pass neither allocates nor
// synchronises nor reads the device from the host (global capture mode rejects all three), and
// the replay must produce bit-for-bit the eager step's logits; replayed again after new inputs
// are copied into the same buffers, it must follow them (the scratch arena handed the captured
// kernels the same addresses).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <numeric>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "model/config.h"
#include "model/model.h"
#include "test_paths.h"

namespace specula {
namespace {

using testing::to_gpu;
using testing::to_host;

struct Step {
  ForwardInput in;
  std::vector<int32_t> tokens, positions, lens;
  std::vector<int64_t> slots;
};

// One sequence in blocks 0, 1, 2, ... of the cache (block size 16).
void fill_step(Backend& gpu, Step& s, const std::vector<int32_t>& tokens, int32_t first_position, int32_t blocks) {
  const int32_t t = static_cast<int32_t>(tokens.size()), len = first_position + t;
  s.tokens = tokens;
  s.positions.resize(t);
  std::iota(s.positions.begin(), s.positions.end(), first_position);
  s.slots.assign(s.positions.begin(), s.positions.end());
  std::vector<int32_t> table(blocks);
  std::iota(table.begin(), table.end(), 0);
  s.in.token_ids = to_gpu(gpu, Tensor::from_i32(s.tokens));
  s.in.positions = to_gpu(gpu, Tensor::from_i32(s.positions));
  s.in.logits_indices = to_gpu(gpu, Tensor::from_i32({t - 1}));
  s.in.attn.num_seqs = 1;
  s.in.attn.num_tokens = t;
  s.in.attn.max_query_len = t;
  s.in.attn.max_seq_len = len;
  s.in.attn.block_size = 16;
  s.in.attn.query_start_loc = to_gpu(gpu, Tensor::from_i32({0, t}));
  s.in.attn.seq_lens = to_gpu(gpu, Tensor::from_i32({len}));
  s.in.attn.block_tables = to_gpu(gpu, Tensor::from_i32(table, {1, blocks}));
  s.in.attn.slot_mapping = to_gpu(gpu, Tensor::from_i64(s.slots));
  s.in.attn.query_start_loc_host = {0, t};
  s.in.attn.seq_lens_host = {len};
}

TEST(CudaGraph, WholeDecodeStepReplaysLikeEager) {
  SKIP_WITHOUT_GPU();
  const auto dir = specula::testing::fixtures_dir() / "models" / "qwen3_yarn_tied";
  ModelConfig config = load_model_config(dir);
  auto weights = open_safetensors_checkpoint(dir);
  auto gpu = make_cuda_backend(0);
  auto* cuda = dynamic_cast<CudaBackend*>(gpu.get());
  ASSERT_NE(cuda, nullptr);
  auto model = create_model(config, *weights, *gpu);
  const KVCacheSpec spec = model->kv_cache_spec();
  const int32_t blocks = 8;
  std::vector<KVCacheLayer> kv;
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    kv.push_back({gpu->empty({blocks, 16, spec.num_kv_heads, spec.head_dim}, DType::kBF16),
                  gpu->empty({blocks, 16, spec.num_kv_heads, spec.v_head_dim}, DType::kBF16)});
    gpu->zero(kv.back().k);
    gpu->zero(kv.back().v);
  }
  // Prefill 40 tokens eagerly, then decode token 40.
  std::vector<int32_t> prompt(40);
  for (int i = 0; i < 40; ++i) prompt[i] = 3 + (i * 37) % 300;
  Step prefill, decode;
  fill_step(*gpu, prefill, prompt, 0, blocks);
  model->forward(prefill.in, kv);
  fill_step(*gpu, decode, {17}, 40, blocks);
  ForwardOutput eager_out = model->forward(decode.in, kv);  // also sizes the scratch arena
  const std::vector<float> eager = to_host(*gpu, eager_out.logits);

  cudaStream_t stream = cuda->stream();
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  ForwardOutput captured_out;
  try {
    captured_out = model->forward(decode.in, kv);
  } catch (const Error& e) {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream, &g);
    if (g) cudaGraphDestroy(g);
    FAIL() << "forward during capture: " << e.what();
  }
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  EXPECT_EQ(captured_out.logits.data(), eager_out.logits.data()) << "the arena must repeat its addresses";

  gpu->zero(captured_out.logits);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  EXPECT_EQ(to_host(*gpu, captured_out.logits), eager) << "replay differs from the eager step";

  // New inputs in the same buffers (another token), replayed: equal to the eager step on them.
  Tensor token = Tensor::from_i32({123});
  gpu->copy(token, decode.in.token_ids);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  const std::vector<float> replayed = to_host(*gpu, captured_out.logits);
  const std::vector<float> eager_new = to_host(*gpu, model->forward(decode.in, kv).logits);
  EXPECT_EQ(replayed, eager_new);
  EXPECT_NE(replayed, eager) << "the replay ignored the new token";

  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace
}  // namespace specula
