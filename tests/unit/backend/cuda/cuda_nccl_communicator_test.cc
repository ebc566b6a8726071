// NCCL communicators start with the memory our caching allocator holds for reuse handed back to
// the driver: NCCL allocates outside it, and an earlier engine's freed KV cache would otherwise
// leave it nothing.
#include <gtest/gtest.h>

#include "backend/communicator.h"
#include "backend/cuda/cuda_allocator.h"
#include "cuda_test_util.h"

namespace specula {
namespace {

TEST(NcclCommunicators, StartWithTheAllocatorsCachedMemoryReturned) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend(0);
  gpu->bind_thread();
  CudaCachingAllocator& allocator = CudaCachingAllocator::instance();
  { Tensor freed = gpu->empty({int64_t{256} << 20}, DType::kU8); }
  ASSERT_GE(allocator.stats(0).cached_bytes, size_t{256} << 20);
  std::vector<Backend*> ranks{gpu.get()};
  auto comms = make_communicators(ranks, /*custom_all_reduce=*/false);
  ASSERT_EQ(comms.size(), 1u);
  EXPECT_EQ(allocator.stats(0).cached_bytes, 0u);
}

}  // namespace
}  // namespace specula
