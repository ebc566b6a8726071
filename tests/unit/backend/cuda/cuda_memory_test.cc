// CUDA backend memory: allocator reuse and per-device figures, scratch arena address stability (and its refusal to grow
// during graph capture), copies in every direction (pageable and pinned host memory), copy_many, casts,
// zero, and argument errors.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/cuda/cuda_allocator.h"
#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"

namespace specula {
namespace {

using testing::expect_equal;
using testing::random_floats;
using testing::to_gpu;
using testing::to_host;

TEST(CudaMemory, BackendDescribesItself) {
  SKIP_WITHOUT_GPU();
  auto be = make_cuda_backend(0);
  EXPECT_EQ(be->device(), Device::kCUDA);
  EXPECT_EQ(be->compute_dtype(), DType::kBF16);
  EXPECT_NE(be->name().find("cuda:0"), std::string::npos) << be->name();
  be->synchronize();
  EXPECT_TRUE(be->idle());  // nothing issued is still running
}

TEST(CudaMemory, AllocatorReusesFreedBlocks) {
  SKIP_WITHOUT_GPU();
  auto be = make_cuda_backend(0);
  { Tensor t = be->empty({1000, 3000}, DType::kBF16); }
  // The freed block (or an equally sized cached one) serves the next request: no cudaMalloc.
  const size_t mallocs = CudaCachingAllocator::instance().stats().cuda_malloc_calls;
  Tensor again = be->empty({1000, 3000}, DType::kBF16);
  EXPECT_EQ(CudaCachingAllocator::instance().stats().cuda_malloc_calls, mallocs);
  EXPECT_GE(CudaCachingAllocator::instance().stats().in_use_bytes, again.nbytes());
}

// With one GPU per tensor-parallel rank, a device's memory plan must see only its own blocks.
TEST(CudaMemory, AllocatorCountsEachDeviceApart) {
  SKIP_WITHOUT_GPU();
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  auto gpu0 = make_cuda_backend(0), gpu1 = make_cuda_backend(1);
  const CudaCachingAllocator& a = CudaCachingAllocator::instance();
  gpu1->bind_thread();
  const size_t in_use0 = a.stats(0).in_use_bytes, in_use1 = a.stats(1).in_use_bytes;
  {
    Tensor t = gpu1->empty({64 << 20}, DType::kBF16);  // 128 MiB on GPU 1
    EXPECT_EQ(a.stats(0).in_use_bytes, in_use0);
    EXPECT_EQ(a.stats(1).in_use_bytes, in_use1 + t.nbytes());
    EXPECT_EQ(gpu0->memory_info()->allocated, in_use0);
  }
  EXPECT_EQ(a.stats(1).in_use_bytes, in_use1);
  EXPECT_GE(a.stats(1).cached_bytes, size_t{128} << 20);
  gpu0->bind_thread();
}

TEST(CudaMemory, ScratchGivesSameAddressesForSameSequenceOfRequests) {
  SKIP_WITHOUT_GPU();
  auto be = make_cuda_backend(0);
  auto step = [&](std::vector<void*>& addrs) {
    be->reset_scratch();
    addrs.clear();
    Tensor a = be->scratch({7, 33}, DType::kBF16);
    Tensor b = be->scratch({5}, DType::kI32);
    Tensor c = be->scratch({1000, 64}, DType::kF32);
    Tensor e = be->scratch({0, 16}, DType::kF32);
    be->zero(a);
    be->zero(c);
    for (Tensor* t : {&a, &b, &c, &e}) addrs.push_back(t->data());
  };
  std::vector<void*> first, second, third;
  step(first);
  step(second);
  step(third);
  EXPECT_EQ(second, third);
  for (size_t i = 1; i < third.size(); ++i) EXPECT_NE(third[i - 1], third[i]);
  for (void* p : third) EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
  be->synchronize();
}

TEST(CudaMemory, ScratchDoesNotGrowDuringGraphCapture) {
  SKIP_WITHOUT_GPU();
  auto be = make_cuda_backend(0);
  auto* cuda = dynamic_cast<CudaBackend*>(be.get());
  ASSERT_NE(cuda, nullptr);
  be->reset_scratch();
  be->scratch({1024}, DType::kF32);
  be->reset_scratch();  // the arena now holds ~1024 floats
  ASSERT_EQ(cudaStreamBeginCapture(cuda->stream(), cudaStreamCaptureModeRelaxed), cudaSuccess);
  Tensor fits = be->scratch({256}, DType::kF32);  // fine during capture
  EXPECT_THROW(be->scratch({1 << 24}, DType::kF32), Error);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(cuda->stream(), &graph), cudaSuccess);
  if (graph) cudaGraphDestroy(graph);
}

TEST(CudaMemory, CopiesInEveryDirection) {
  SKIP_WITHOUT_GPU();
  auto be = make_cuda_backend(0);
  std::mt19937 rng(1);
  std::vector<float> values = random_floats(1001, rng);
  Tensor host = Tensor::from_f32(values);
  Tensor a = be->empty({1001}, DType::kF32), b = be->empty({1001}, DType::kF32);
  be->copy(host, a);
  be->copy(a, b);  // device to device
  Tensor back = Tensor::empty({1001}, DType::kF32);
  be->copy(b, back);
  EXPECT_EQ(back.to_f32_vector(), values);

  std::vector<int64_t> longs = {5, -1, 1ll << 40, 7};
  Tensor li = to_gpu(*be, Tensor::from_i64(longs));
  Tensor lh = Tensor::empty({4}, DType::kI64);
  be->copy(li, lh);
  EXPECT_EQ(std::vector<int64_t>(lh.data_as<int64_t>(), lh.data_as<int64_t>() + 4), longs);
}

TEST(CudaMemory, DeviceCopiesOfEverySizeAndAlignment) {
  SKIP_WITHOUT_GPU();
  auto be = make_cuda_backend(0);
  std::mt19937 rng(5);
  // A kernel up to 4 MB (16-, 4- and 2-byte pieces by alignment), the copy engines beyond.
  for (int64_t n : {int64_t{3}, int64_t{8}, int64_t{1001}, int64_t{4096}, int64_t{3} << 20}) {
    for (int64_t offset : {0, 1}) {  // offset 1: 2 bytes into its buffer
      std::vector<float> values = random_floats(n, rng);
      Tensor src = to_gpu(*be, Tensor::from_f32(values), DType::kBF16);
      Tensor whole = be->empty({n + 1}, DType::kBF16);
      Tensor dst = whole.slice(offset, offset + n);
      be->copy(src, dst);
      EXPECT_EQ(to_host(*be, dst), to_host(*be, src)) << n << " elements at offset " << offset;
    }
  }
}

TEST(CudaMemory, PageableHostBufferIsReusableWhenCopyReturns) {
  SKIP_WITHOUT_GPU();
  auto be = make_cuda_backend(0);
  std::vector<float> values(1 << 20, 1.5f);
  Tensor host = Tensor::from_f32(values);
  Tensor dev = be->empty({1 << 20}, DType::kF32);
  be->copy(host, dev);
  std::fill(host.data_as<float>(), host.data_as<float>() + (1 << 20), -2.0f);  // reuse at once
  EXPECT_EQ(to_host(*be, dev), values);
}

TEST(CudaMemory, PinnedHostCopiesCompleteAfterSynchronize) {
  SKIP_WITHOUT_GPU();
  auto be = make_cuda_backend(0);
  const int64_t n = 4096;
  void* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, n * sizeof(float), cudaHostAllocDefault), cudaSuccess);
  std::shared_ptr<void> owner(pinned, [](void* p) { cudaFreeHost(p); });
  Tensor host = Tensor::from_blob(pinned, {n}, DType::kF32, Device::kCPU, owner);
  std::mt19937 rng(2);
  std::vector<float> values = random_floats(n, rng);
  std::copy(values.begin(), values.end(), host.data_as<float>());
  Tensor dev = be->empty({n}, DType::kF32);
  be->copy(host, dev);
  be->synchronize();  // the rule for pinned sources: wait before touching the buffer
  std::fill(host.data_as<float>(), host.data_as<float>() + n, 0.25f);
  be->copy(dev, host);
  be->synchronize();
  EXPECT_EQ(std::vector<float>(host.data_as<float>(), host.data_as<float>() + n), values);
}

TEST(CudaMemory, CopyManyUploadsPinnedRangesAsCopiesWould) {
  SKIP_WITHOUT_GPU();
  auto be = make_cuda_backend(0);
  std::mt19937 rng(4);
  // Sizes around the kernel's 16-byte vectors, an empty range, 6 bytes (3 x BF16) and a source 8
  // bytes into its buffer (not 16-byte aligned).
  std::vector<std::pair<Tensor, Tensor>> io;
  std::vector<Backend::CopyPair> pairs;
  for (int64_t n : {1, 3, 4, 5, 0, 63, 1000, 4097}) {
    Tensor host = be->empty_host({n}, DType::kI32);
    for (int64_t i = 0; i < n; ++i) host.data_as<int32_t>()[i] = static_cast<int32_t>(rng());
    Tensor dev = be->empty({n}, DType::kI32);
    pairs.push_back({host, dev});
    io.push_back({host, dev});
  }
  Tensor shorts = be->empty_host({3}, DType::kBF16);
  for (int i = 0; i < 3; ++i) shorts.data_as<uint16_t>()[i] = static_cast<uint16_t>(0x3f80 + i);
  Tensor shorts_dev = be->empty({3}, DType::kBF16);
  pairs.push_back({shorts, shorts_dev});
  Tensor wide = be->empty_host({9}, DType::kI64);
  for (int i = 0; i < 9; ++i) wide.data_as<int64_t>()[i] = (int64_t{1} << 40) + i;
  Tensor wide_dev = be->empty({8}, DType::kI64);
  pairs.push_back({wide.slice(1, 9), wide_dev});
  be->copy_many(pairs);
  be->synchronize();
  for (const auto& [host, dev] : io) {
    Tensor back = Tensor::empty({host.numel()}, DType::kI32);
    be->copy(dev, back);
    EXPECT_EQ(std::memcmp(back.data(), host.data(), host.nbytes()), 0) << host.numel() << " elements";
  }
  Tensor shorts_back = Tensor::empty({3}, DType::kBF16);
  be->copy(shorts_dev, shorts_back);
  EXPECT_EQ(std::memcmp(shorts_back.data(), shorts.data(), 6), 0);
  Tensor wide_back = Tensor::empty({8}, DType::kI64);
  be->copy(wide_dev, wide_back);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(wide_back.data_as<int64_t>()[i], (int64_t{1} << 40) + i + 1);
}

TEST(CudaMemory, CopyManyTakesPageableAndDeviceSourcesToo) {
  SKIP_WITHOUT_GPU();
  auto be = make_cuda_backend(0);
  // Pageable host memory is not addressable by a kernel: such a batch falls back to copies.
  Tensor pageable = Tensor::from_i32({1, 2, 3});
  Tensor from_device = to_gpu(*be, Tensor::from_i32({7, 8}));
  Tensor a = be->empty({3}, DType::kI32), b = be->empty({2}, DType::kI32);
  Tensor pinned = be->empty_host({2}, DType::kI32);
  pinned.data_as<int32_t>()[0] = 11;
  pinned.data_as<int32_t>()[1] = 12;
  Tensor c = be->empty({2}, DType::kI32);
  const std::vector<Backend::CopyPair> pairs = {{pageable, a}, {from_device, b}, {pinned, c}};
  be->copy_many(pairs);
  be->synchronize();
  Tensor back = Tensor::empty({7}, DType::kI32);
  Tensor ab = back.slice(0, 3), bb = back.slice(3, 5), cb = back.slice(5, 7);
  be->copy(a, ab);
  be->copy(b, bb);
  be->copy(c, cb);
  EXPECT_EQ(std::vector<int32_t>(back.data_as<int32_t>(), back.data_as<int32_t>() + 7),
            (std::vector<int32_t>{1, 2, 3, 7, 8, 11, 12}));
  const std::vector<Backend::CopyPair> mismatched = {{pinned, a}, {pinned, c}};
  EXPECT_THROW(be->copy_many(mismatched), Error);
}

TEST(CudaMemory, CastsBetweenFloatTypesLikeTheCpu) {
  SKIP_WITHOUT_GPU();
  auto be = make_cuda_backend(0);
  std::mt19937 rng(3);
  std::vector<float> values = random_floats(3001, rng, 70000.0f);  // beyond f16's range too
  values[0] = 1e-9f;                                               // subnormal in f16
  const DType types[] = {DType::kF32, DType::kF16, DType::kBF16};
  for (DType from : types) {
    for (DType to : types) {
      // Reference: fp32 -> from -> fp32 -> to -> fp32 on the host.
      Tensor src_host = Tensor::empty({3001}, from);
      convert_from_f32(values.data(), from, src_host.data(), values.size());
      std::vector<float> mid = src_host.to_f32_vector();
      Tensor want = Tensor::empty({3001}, to);
      convert_from_f32(mid.data(), to, want.data(), mid.size());

      Tensor src = be->empty({3001}, from), dst = be->empty({3001}, to);
      be->copy(src_host, src);
      be->cast(src, dst);
      expect_equal(to_host(*be, dst), want.to_f32_vector(),
                   std::string(dtype_name(from)) + " -> " + std::string(dtype_name(to)));
    }
  }
}

TEST(CudaMemory, ZeroClearsEveryByte) {
  SKIP_WITHOUT_GPU();
  auto be = make_cuda_backend(0);
  std::mt19937 rng(4);
  Tensor t = to_gpu(*be, Tensor::from_f32(random_floats(777, rng)));
  be->zero(t);
  EXPECT_EQ(to_host(*be, t), std::vector<float>(777, 0.0f));
}

TEST(CudaMemory, ErrorsNameTheParameter) {
  SKIP_WITHOUT_GPU();
  auto be = make_cuda_backend(0);
  Tensor a = be->empty({4, 8}, DType::kBF16);
  Tensor host = Tensor::zeros({4, 8}, DType::kF32);
  Tensor w = be->empty({8}, DType::kBF16);
  try {
    be->rms_norm(host, w, 1e-5f, a);
    FAIL() << "CPU input accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rms_norm: x must be on the GPU"), std::string::npos) << e.what();
  }
  Tensor f = be->empty({4, 8}, DType::kF32);
  EXPECT_THROW(be->copy(a, f), Error);  // dtype mismatch
  EXPECT_THROW(make_cuda_backend(1000), Error);
}

}  // namespace
}  // namespace specula
