// CPU backend memory: scratch arena address stability, copies, casts, zero, and refusals.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "cpu_test_util.h"

namespace specula {
namespace {

using testing::random_tensor;

TEST(CpuMemory, BackendDescribesItself) {
  auto be = make_cpu_backend(2);
  EXPECT_EQ(be->device(), Device::kCPU);
  EXPECT_EQ(be->compute_dtype(), DType::kF32);
  EXPECT_NE(be->name().find("cpu"), std::string::npos);
}

TEST(CpuMemory, ScratchGivesSameAddressesForSameSequenceOfRequests) {
  auto be = make_cpu_backend(1);
  auto step = [&](std::vector<void*>& addrs) {
    be->reset_scratch();
    addrs.clear();
    Tensor a = be->scratch({7, 33}, DType::kF32);
    Tensor b = be->scratch({5}, DType::kI32);
    Tensor c = be->scratch({1000, 64}, DType::kF32);
    // Every allocation is usable and disjoint from the others.
    std::memset(a.data(), 1, a.nbytes());
    std::memset(b.data(), 2, b.nbytes());
    std::memset(c.data(), 3, c.nbytes());
    EXPECT_EQ(static_cast<unsigned char*>(a.data())[a.nbytes() - 1], 1);
    EXPECT_EQ(static_cast<unsigned char*>(b.data())[b.nbytes() - 1], 2);
    for (Tensor* t : {&a, &b, &c}) addrs.push_back(t->data());
  };
  std::vector<void*> first, second, third;
  step(first);   // may overflow into separate allocations: the arena grows at the next reset
  step(second);  // now all from the arena
  step(third);
  EXPECT_EQ(second, third);
  EXPECT_NE(second[0], second[1]);
  EXPECT_NE(second[1], second[2]);
  // 64-byte alignment of every scratch tensor.
  for (void* p : third) EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
}

TEST(CpuMemory, ScratchOfZeroElementsIsDefined) {
  auto be = make_cpu_backend(1);
  Tensor t = be->scratch({0, 16}, DType::kF32);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.numel(), 0);
}

TEST(CpuMemory, CopyAndZero) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(1);
  Tensor src = random_tensor({3, 5}, rng);
  Tensor dst = be->empty({15}, DType::kF32);
  be->copy(src, dst);
  EXPECT_EQ(dst.to_f32_vector(), src.to_f32_vector());
  be->zero(dst);
  for (float v : dst.to_f32_vector()) EXPECT_EQ(v, 0.0f);
}

TEST(CpuMemory, CopyRefusesMismatchAndOtherDevices) {
  auto be = make_cpu_backend(1);
  Tensor a = Tensor::zeros({4}, DType::kF32);
  Tensor b = Tensor::zeros({5}, DType::kF32);
  Tensor c = Tensor::zeros({4}, DType::kI32);
  EXPECT_THROW(be->copy(a, b), Error);
  EXPECT_THROW(be->copy(a, c), Error);
  float fake[4];
  Tensor gpu = Tensor::from_blob(fake, {4}, DType::kF32, Device::kCUDA);
  try {
    be->copy(a, gpu);
    FAIL() << "copy to a CUDA tensor must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
  }
}

TEST(CpuMemory, CopyManyCopiesEachPairAndRefusesAMismatch) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(3);
  Tensor a = random_tensor({7}, rng);
  Tensor ids = Tensor::from_i32({4, -1, 9});
  Tensor a_dst = be->empty({7}, DType::kF32), ids_dst = be->empty({3}, DType::kI32);
  const std::vector<Backend::CopyPair> pairs = {{a, a_dst}, {ids, ids_dst}};
  be->copy_many(pairs);
  EXPECT_EQ(a_dst.to_f32_vector(), a.to_f32_vector());
  EXPECT_EQ(std::vector<int32_t>(ids_dst.data_as<int32_t>(), ids_dst.data_as<int32_t>() + 3),
            (std::vector<int32_t>{4, -1, 9}));
  const std::vector<Backend::CopyPair> mismatched = {{a, ids_dst}};
  EXPECT_THROW(be->copy_many(mismatched), Error);
}

TEST(CpuMemory, CastRoundsLikeTheDtypeConversions) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(2);
  const int64_t n = 20000;  // large enough for the threaded path
  Tensor src = random_tensor({n}, rng, 100.0f);
  Tensor bf = be->empty({n}, DType::kBF16);
  Tensor f16 = be->empty({n}, DType::kF16);
  be->cast(src, bf);
  be->cast(src, f16);
  const float* s = src.data_as<float>();
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(bf.data_as<uint16_t>()[i], f32_to_bf16(s[i])) << i;
    ASSERT_EQ(f16.data_as<uint16_t>()[i], f32_to_f16(s[i])) << i;
  }
  Tensor back = be->empty({n}, DType::kF32);
  be->cast(bf, back);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(back.data_as<float>()[i], bf16_to_f32(f32_to_bf16(s[i])));
  Tensor ints = Tensor::zeros({n}, DType::kI32);
  EXPECT_THROW(be->cast(src, ints), Error);
}

}  // namespace
}  // namespace specula
