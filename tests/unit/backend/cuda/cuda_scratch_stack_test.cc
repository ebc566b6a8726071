// The CUDA scratch arena as a stack (scratch_mark / scratch_release): released blocks are reused
// at the same addresses step after step (what CUDA-graph replay needs), the chunk grows to the
// step's highest point only, and a release inside a captured step replays like the eager step.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"

namespace specula {
namespace {

std::vector<void*> layered_step(Backend& be, int layers, int64_t block) {
  std::vector<void*> addrs;
  be.reset_scratch();
  Tensor x = be.scratch({4096}, DType::kBF16);
  addrs.push_back(x.data());
  for (int l = 0; l < layers; ++l) {
    const size_t mark = be.scratch_mark();
    Tensor a = be.scratch({block}, DType::kBF16);
    be.zero(a);
    addrs.push_back(a.data());
    be.scratch_release(mark);
  }
  addrs.push_back(be.scratch({77}, DType::kF32).data());
  return addrs;
}

TEST(CudaScratchStack, ReleasedBlocksAreReusedAtTheSameAddresses) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  auto* cuda = dynamic_cast<CudaBackend*>(gpu.get());
  ASSERT_NE(cuda, nullptr);
  const int64_t block = 1 << 20;  // 2 MiB of bf16 per layer
  layered_step(*gpu, 12, block);
  const auto second = layered_step(*gpu, 12, block);
  EXPECT_EQ(second, layered_step(*gpu, 12, block));
  for (size_t i = 2; i + 1 < second.size(); ++i) EXPECT_EQ(second[i], second[1]) << "layer " << i - 1;
  EXPECT_LT(cuda->scratch_capacity(), size_t{4} * block * 2) << "the highest point is one block, not twelve";
  gpu->synchronize();
}

TEST(CudaScratchStack, ACapturedStepWithReleasesReplays) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  auto* cuda = dynamic_cast<CudaBackend*>(gpu.get());
  const int64_t block = 1 << 16;
  layered_step(*gpu, 4, block);  // sizes the arena
  gpu->reset_scratch();
  std::unique_ptr<DeviceGraph> graph = gpu->capture_graph([&] {
    const auto addrs = layered_step(*gpu, 4, block);
    EXPECT_EQ(addrs.size(), 6u);
  });
  ASSERT_NE(graph, nullptr);
  graph->replay();
  graph->replay();
  ASSERT_EQ(cudaStreamSynchronize(cuda->stream()), cudaSuccess);
}

}  // namespace
}  // namespace specula
