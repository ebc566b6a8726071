// A DeepSeek forward step (specula-tiny-moe with shared-expert fusion, through create_model)
// captured into a CUDA graph and replayed. Global capture mode rejects allocation, synchronisation
// and host reads of device memory, so a clean capture proves that the MLA ops (copy_columns,
// head_linear, the MLA cache write and attention with its split-KV merge) and the MoE ops
// (moe_route, both fused_moe paths) are graph-safe; the replay must reproduce the eager step's
// logits bit for bit, and follow new inputs copied into the same buffers. Two steps: a decode row
// after a 300-token prompt (fused_moe's GEMV path; attention splits the keys) and a 30-token chunk
// (the sort + grouped-GEMM path).
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

constexpr int32_t kBlocks = 24;  // one sequence in blocks 0..23 (384 tokens)

struct Step {
  ForwardInput in;
};

// Tokens at positions first.. of the one sequence.
Step make_step(Backend& gpu, const std::vector<int32_t>& tokens, int32_t first) {
  const int32_t t = static_cast<int32_t>(tokens.size()), len = first + t;
  std::vector<int32_t> positions(t), table(kBlocks);
  std::iota(positions.begin(), positions.end(), first);
  std::iota(table.begin(), table.end(), 0);
  std::vector<int64_t> slots(positions.begin(), positions.end());
  Step s;
  s.in.token_ids = to_gpu(gpu, Tensor::from_i32(tokens));
  s.in.positions = to_gpu(gpu, Tensor::from_i32(positions));
  s.in.logits_indices = to_gpu(gpu, Tensor::from_i32({t - 1}));
  s.in.attn.num_seqs = 1;
  s.in.attn.num_tokens = t;
  s.in.attn.max_query_len = t;
  s.in.attn.max_seq_len = len;
  s.in.attn.block_size = 16;
  s.in.attn.query_start_loc = to_gpu(gpu, Tensor::from_i32({0, t}));
  s.in.attn.seq_lens = to_gpu(gpu, Tensor::from_i32({len}));
  s.in.attn.block_tables = to_gpu(gpu, Tensor::from_i32(table, {1, kBlocks}));
  s.in.attn.slot_mapping = to_gpu(gpu, Tensor::from_i64(slots));
  s.in.attn.query_start_loc_host = {0, t};
  s.in.attn.seq_lens_host = {len};
  return s;
}

std::vector<int32_t> tokens(int n, int salt) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = 5 + (i * 131 + salt * 17) % 8000;
  return v;
}

class DeepseekGraph : public ::testing::TestWithParam<int> {};  // the captured step's length

TEST_P(DeepseekGraph, StepReplaysLikeEager) {
  SKIP_WITHOUT_GPU();
  const int step_len = GetParam();
  const auto dir = specula::testing::models_dir() / "specula-tiny-moe";
  ModelConfig config = load_model_config(dir);
  auto weights = open_safetensors_checkpoint(dir);
  auto gpu = make_cuda_backend(0);
  auto* cuda = dynamic_cast<CudaBackend*>(gpu.get());
  ASSERT_NE(cuda, nullptr);
  auto model = create_model(config, *weights, *gpu, ModelOptions{1});
  const KVCacheSpec spec = model->kv_cache_spec();
  std::vector<KVCacheLayer> kv;
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    kv.push_back({gpu->empty({kBlocks, 16, spec.num_kv_heads, spec.head_dim}, DType::kBF16), Tensor()});
    gpu->zero(kv.back().k);
  }
  const int prompt_len = 300;
  Step prefill = make_step(*gpu, tokens(prompt_len, 1), 0);
  model->forward(prefill.in, kv);
  Step step = make_step(*gpu, tokens(step_len, 2), prompt_len);
  ForwardOutput eager_out = model->forward(step.in, kv);  // also sizes the scratch arena
  const std::vector<float> eager = to_host(*gpu, eager_out.logits);

  cudaStream_t stream = cuda->stream();
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  ForwardOutput captured_out;
  try {
    captured_out = model->forward(step.in, kv);
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

  // Other tokens in the same buffers, replayed: equal to the eager step on them.
  Tensor other = Tensor::from_i32(tokens(step_len, 3));
  gpu->copy(other, step.in.token_ids);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  const std::vector<float> replayed = to_host(*gpu, captured_out.logits);
  const std::vector<float> eager_new = to_host(*gpu, model->forward(step.in, kv).logits);
  EXPECT_EQ(replayed, eager_new);
  EXPECT_NE(replayed, eager) << "the replay ignored the new tokens";

  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

INSTANTIATE_TEST_SUITE_P(Deepseek, DeepseekGraph, ::testing::Values(1, 30),
                         [](const auto& info) { return "step_of_" + std::to_string(info.param) + "_tokens"; });

}  // namespace
}  // namespace specula
