// The scratch arena as a stack (Backend::scratch_mark / scratch_release, CPU ScratchArena):
// released memory is handed out again, the same requests with the same marks give the same
// addresses step after step, and the chunk grows to the step's highest point, not to the sum of
// everything it handed out.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"

namespace specula {
namespace {

constexpr int64_t kBlock = 1 << 16;  // floats

// A "layer loop": two buffers for the whole step, then per layer a block of temporaries released
// at its end, then the logits.
std::vector<void*> layered_step(ScratchArena& arena, int layers) {
  std::vector<void*> addrs;
  arena.reset();
  Tensor x = arena.allocate({1024}, DType::kF32), residual = arena.allocate({1024}, DType::kF32);
  addrs.push_back(x.data());
  addrs.push_back(residual.data());
  for (int l = 0; l < layers; ++l) {
    const size_t mark = arena.mark();
    Tensor a = arena.allocate({kBlock}, DType::kF32), b = arena.allocate({kBlock / 2}, DType::kF32);
    addrs.push_back(a.data());
    addrs.push_back(b.data());
    arena.release(mark);
  }
  addrs.push_back(arena.allocate({333}, DType::kF32).data());
  return addrs;
}

TEST(ScratchStack, ReleasedBlocksAreReusedAndAddressesRepeat) {
  ScratchArena arena;
  layered_step(arena, 8);  // overflows: the chunk grows at the next reset
  const auto second = layered_step(arena, 8);
  const auto third = layered_step(arena, 8);
  EXPECT_EQ(second, third);
  for (int l = 1; l < 8; ++l) {
    EXPECT_EQ(second[2 + 2 * l], second[2]) << "layer " << l << " reuses layer 0's temporaries";
    EXPECT_EQ(second[3 + 2 * l], second[3]) << "layer " << l;
  }
  EXPECT_EQ(second.back(), second[2]) << "after the last release the logits start where the blocks did";
}

TEST(ScratchStack, TheChunkHoldsTheHighestPointNotTheSum) {
  ScratchArena arena;
  layered_step(arena, 16);
  arena.reset();
  // x + residual + one block (1.5 x 256 KiB), aligned, plus a quarter of headroom: not 16 blocks.
  const size_t highest = 2 * 4096 + kBlock * 4 + kBlock * 2;
  EXPECT_GE(arena.capacity(), highest);
  EXPECT_LE(arena.capacity(), highest + highest / 4 + 4096);
}

TEST(ScratchStack, MarksAreStackPositionsOnTheBackend) {
  auto be = make_cpu_backend(1);
  be->reset_scratch();
  EXPECT_EQ(be->scratch_mark(), 0u);
  Tensor a = be->scratch({100}, DType::kF32);
  const size_t after_a = be->scratch_mark();
  EXPECT_GE(after_a, 400u);
  Tensor b = be->scratch({100}, DType::kF32);
  be->scratch_release(after_a);
  EXPECT_EQ(be->scratch_mark(), after_a);
  EXPECT_THROW(be->scratch_release(after_a + 1), Error) << "a mark above the top is a bug";
}

}  // namespace
}  // namespace specula
