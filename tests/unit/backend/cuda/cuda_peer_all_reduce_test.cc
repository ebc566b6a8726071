// All-reduce between GPUs (2 to 4 where there are that many): the communicators' sums, through the
// one-shot peer kernel (small tensors) and NCCL (what does not fit it), against the host's sum of
// the same bf16 values; the peer kernel's result is the fp32 sum in rank order rounded once, the
// same bits on every rank, call after call (its staging buffers alternate with the epoch).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

#include "backend/communicator.h"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace specula {
namespace {

using testing::random_bf16_values;
using testing::to_gpu;
using testing::to_host;

// Each rank all-reduces its tensor on its own thread (NCCL needs the ranks' calls to overlap).
void all_reduce(std::vector<std::unique_ptr<Backend>>& gpus, std::vector<std::unique_ptr<Communicator>>& comms,
                std::vector<Tensor>& tensors) {
  std::vector<std::thread> threads;
  for (size_t r = 0; r < gpus.size(); ++r)
    threads.emplace_back([&, r] {
      gpus[r]->bind_thread();
      comms[r]->all_reduce_sum(tensors[r]);
      gpus[r]->synchronize();
    });
  for (std::thread& t : threads) t.join();
}

void expect_sums(bool custom_all_reduce) {
  const int size = std::min(cuda_device_count(), 4);
  std::vector<std::unique_ptr<Backend>> gpus;
  std::vector<Backend*> ranks;
  for (int r = 0; r < size; ++r) {
    gpus.push_back(make_cuda_backend(r));
    ranks.push_back(gpus.back().get());
  }
  auto comms = make_communicators(ranks, custom_all_reduce);
  gpus.front()->bind_thread();
  std::mt19937 rng(11);
  // Elements: one bf16 row of 4096 (8 KB: one block of the peer kernel), 64 rows (512 KB: its
  // largest), an odd count (not whole 16-byte units: NCCL) and 128 rows (1 MB: NCCL).
  for (int64_t n : {int64_t{4096}, int64_t{64 * 4096}, int64_t{1001}, int64_t{128 * 4096}}) {
    for (int call = 0; call < 5; ++call) {  // several epochs through the same buffers
      std::vector<std::vector<float>> values;
      std::vector<Tensor> tensors;
      for (int r = 0; r < size; ++r) {
        Tensor host = random_bf16_values({n}, rng);
        values.push_back(host.to_f32_vector());
        gpus[static_cast<size_t>(r)]->bind_thread();
        tensors.push_back(to_gpu(*gpus[static_cast<size_t>(r)], host));
      }
      all_reduce(gpus, comms, tensors);
      std::vector<float> want(static_cast<size_t>(n), 0.0f);
      for (int64_t i = 0; i < n; ++i) {
        float s = 0.0f;
        for (int r = 0; r < size; ++r) s += values[static_cast<size_t>(r)][static_cast<size_t>(i)];
        want[static_cast<size_t>(i)] = bf16_to_f32(f32_to_bf16(s));
      }
      std::vector<std::vector<float>> got;
      for (int r = 0; r < size; ++r) {
        gpus[static_cast<size_t>(r)]->bind_thread();
        got.push_back(to_host(*gpus[static_cast<size_t>(r)], tensors[static_cast<size_t>(r)]));
      }
      const std::string what = "n " + std::to_string(n) + " call " + std::to_string(call);
      for (int r = 1; r < size; ++r) EXPECT_EQ(got[static_cast<size_t>(r)], got[0]) << what << ": rank " << r;
      const bool peer_path = custom_all_reduce && n * 2 % 16 == 0 && n * 2 <= (512 << 10);
      if (peer_path) {
        EXPECT_EQ(got[0], want) << what;
      } else {  // NCCL rounds to bf16 after each addition
        testing::expect_close(got[0], want, 2e-2, 5e-2, what);
      }
    }
  }
  gpus.front()->bind_thread();
}

// Back-to-back calls of sizes whose slices start at different offsets (rows of 2048 bf16, as in
// DeepSeek-V2-Lite, batches of 3, 4, 1 and 5 rows), queued with no host synchronisation between
// them: a rank that races ahead must not overwrite a staging buffer that a slower peer still reads.
TEST(PeerAllReduce, BackToBackCallsOfChangingSizes) {
  SKIP_WITHOUT_GPU();
  const int size = std::min(cuda_device_count(), 4);
  if (size < 2) GTEST_SKIP() << "needs 2 GPUs";
  std::vector<std::unique_ptr<Backend>> gpus;
  std::vector<Backend*> ranks;
  for (int r = 0; r < size; ++r) {
    gpus.push_back(make_cuda_backend(r));
    ranks.push_back(gpus.back().get());
  }
  auto comms = make_communicators(ranks, /*custom_all_reduce=*/true);
  std::mt19937 rng(5);
  constexpr int kCalls = 200;
  const int64_t rows[] = {3, 4, 1, 5};
  std::vector<std::vector<std::vector<float>>> values(static_cast<size_t>(size));  // [rank][call]
  std::vector<std::vector<Tensor>> tensors(static_cast<size_t>(size));
  for (int call = 0; call < kCalls; ++call) {
    const int64_t n = rows[call % 4] * 2048;
    for (int r = 0; r < size; ++r) {
      Tensor host = random_bf16_values({n}, rng);
      values[static_cast<size_t>(r)].push_back(host.to_f32_vector());
      gpus[static_cast<size_t>(r)]->bind_thread();
      tensors[static_cast<size_t>(r)].push_back(to_gpu(*gpus[static_cast<size_t>(r)], host));
    }
  }
  std::vector<std::thread> threads;
  for (size_t r = 0; r < gpus.size(); ++r)
    threads.emplace_back([&, r] {
      gpus[r]->bind_thread();
      for (Tensor& t : tensors[r]) comms[r]->all_reduce_sum(t);
      gpus[r]->synchronize();
    });
  for (std::thread& t : threads) t.join();
  for (int call = 0; call < kCalls; ++call) {
    const size_t c = static_cast<size_t>(call);
    std::vector<float> want(values[0][c].size(), 0.0f);
    for (size_t i = 0; i < want.size(); ++i) {
      float s = 0.0f;
      for (int r = 0; r < size; ++r) s += values[static_cast<size_t>(r)][c][i];
      want[i] = bf16_to_f32(f32_to_bf16(s));
    }
    for (int r = 0; r < size; ++r) {
      gpus[static_cast<size_t>(r)]->bind_thread();
      ASSERT_EQ(to_host(*gpus[static_cast<size_t>(r)], tensors[static_cast<size_t>(r)][c]), want)
          << "call " << call << " rank " << r;
    }
  }
  gpus.front()->bind_thread();
}

TEST(PeerAllReduce, SumsEveryRanksTensorTheSameOnEveryRank) {
  SKIP_WITHOUT_GPU();
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  expect_sums(/*custom_all_reduce=*/true);
  expect_sums(/*custom_all_reduce=*/false);
}

}  // namespace
}  // namespace specula
