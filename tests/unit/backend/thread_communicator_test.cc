// The thread communicator: every rank gets the same sum (bitwise), gathered columns land in rank
// order, collectives can be called back to back, and abort() frees ranks waiting for a failed one.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "backend/communicator.h"
#include "core/error.h"

namespace specula {
namespace {

// Runs fn(rank) on one thread per rank and waits for all.
template <class Fn>
void on_every_rank(int size, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&, r] { fn(r); });
  for (auto& t : threads) t.join();
}

TEST(ThreadCommunicator, AllReduceGivesEveryRankTheSameSum) {
  for (int size : {1, 2, 3, 4}) {
    auto comms = make_thread_communicators(size);
    std::vector<std::vector<float>> results(size);
    on_every_rank(size, [&](int r) {
      EXPECT_EQ(comms[r]->rank(), r);
      EXPECT_EQ(comms[r]->size(), size);
      for (int round = 0; round < 50; ++round) {  // back to back: no rank reads a buffer being rewritten
        std::vector<float> v(37);
        for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * static_cast<float>(r + 1) + 0.01f * i + round;
        Tensor t = Tensor::from_f32(v, {37});
        comms[r]->all_reduce_sum(t);
        for (size_t i = 0; i < v.size(); ++i) {
          float want = 0;
          for (int k = 0; k < size; ++k) want += 0.1f * static_cast<float>(k + 1) + 0.01f * i + round;
          ASSERT_NEAR(t.data_as<float>()[i], want, 1e-4) << "size " << size << " rank " << r << " round " << round;
        }
        if (round == 49) results[r] = t.to_f32_vector();
      }
    });
    for (int r = 1; r < size; ++r) EXPECT_EQ(results[r], results[0]) << "bitwise equal on every rank";
  }
}

TEST(ThreadCommunicator, AllGatherColumnsPutsRanksSideBySide) {
  const int size = 3, rows = 4, cols = 5;
  auto comms = make_thread_communicators(size);
  std::vector<Tensor> outs(size);
  on_every_rank(size, [&](int r) {
    std::vector<float> v(rows * cols);
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j) v[i * cols + j] = 100.0f * r + 10.0f * i + j;
    Tensor in = Tensor::from_f32(v, {rows, cols});
    outs[r] = Tensor::empty({rows, size * cols}, DType::kF32);
    comms[r]->all_gather_columns(in, outs[r]);
  });
  for (int r = 0; r < size; ++r)
    for (int i = 0; i < rows; ++i)
      for (int k = 0; k < size; ++k)
        for (int j = 0; j < cols; ++j)
          EXPECT_EQ(outs[r].data_as<float>()[i * size * cols + k * cols + j], 100.0f * k + 10.0f * i + j);
}

TEST(ThreadCommunicator, AbortEndsTheWaitOfTheOtherRanks) {
  auto comms = make_thread_communicators(3);
  std::vector<int> failed(3, 0);
  on_every_rank(3, [&](int r) {
    if (r == 2) {  // this rank fails before its collective
      comms[r]->abort();
      return;
    }
    Tensor t = Tensor::from_f32({1.0f});
    try {
      comms[r]->all_reduce_sum(t);
    } catch (const Error& e) {
      failed[r] = std::string(e.what()).find("another rank failed") != std::string::npos;
    }
  });
  EXPECT_EQ(failed[0], 1);
  EXPECT_EQ(failed[1], 1);
}

// A rehearsal runs each rank alone: its collectives neither wait for the other ranks nor touch
// their tensors.
TEST(ThreadCommunicator, WhileRehearsingCollectivesReturnAtOnce) {
  auto comms = make_thread_communicators(3);
  comms[1]->set_rehearsal(true);
  Tensor t = Tensor::from_f32({1.0f, 2.0f});
  comms[1]->all_reduce_sum(t);  // ranks 0 and 2 never come
  EXPECT_EQ(t.to_f32_vector(), (std::vector<float>{1.0f, 2.0f}));
  Tensor out = Tensor::from_f32({9.0f, 9.0f, 9.0f, 9.0f, 9.0f, 9.0f}, {1, 6});
  comms[1]->all_gather_columns(Tensor::from_f32({5.0f, 6.0f}, {1, 2}), out);
  EXPECT_EQ(out.to_f32_vector(), std::vector<float>(6, 9.0f));
  comms[1]->set_rehearsal(false);
}

TEST(ThreadCommunicator, TakesF32CpuTensorsOnly) {
  auto comms = make_thread_communicators(1);
  Tensor t = Tensor::from_i32({1, 2});
  EXPECT_THROW(comms[0]->all_reduce_sum(t), Error);
}

}  // namespace
}  // namespace specula
