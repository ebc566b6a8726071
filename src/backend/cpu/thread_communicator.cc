// Communicator over threads of one process: the ranks' tensors are host memory, so a collective
// is a rendezvous (every rank posts its tensor), the reads of the others' tensors, and a second
// rendezvous before anyone may write its own again.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

#include "backend/communicator.h"
#include "core/error.h"

namespace specula {
namespace {

// A reusable barrier that abort() can break: every waiter, now or later, throws.
class AbortableBarrier {
 public:
  explicit AbortableBarrier(int parties) : parties_(parties) {}

  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mu_);
    check_not_aborted();
    const uint64_t generation = generation_;
    if (++arrived_ == parties_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation || aborted_; });
    if (generation_ == generation) check_not_aborted();
  }

  void abort() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }

 private:
  void check_not_aborted() const {
    SPECULA_CHECK(!aborted_, "tensor parallel: another rank failed; this collective cannot complete");
  }

  std::mutex mu_;
  std::condition_variable cv_;
  const int parties_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
};

struct Group {
  explicit Group(int size) : barrier(size), posted(static_cast<size_t>(size)) {}
  AbortableBarrier barrier;
  std::vector<const Tensor*> posted;  // rank k's operand while a collective runs
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<Group> group, int rank) : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(group_->posted.size()); }

  void all_reduce_sum(Tensor& t) override {
    check_f32(t, "all_reduce_sum");
    if (rehearsing_) return;
    count_entered();
    post(t);
    const int64_t n = t.numel();
    for (const Tensor* other : group_->posted)
      SPECULA_CHECK(other->numel() == n, "tensor parallel all_reduce_sum: rank {} has {} elements, another rank {}",
                    rank_, n, other->numel());
    // Every rank adds the same operands in the same (rank) order: identical results everywhere.
    sum_.assign(static_cast<size_t>(n), 0.0f);
    for (const Tensor* other : group_->posted) {
      const float* src = other->data_as<const float>();
      for (int64_t i = 0; i < n; ++i) sum_[static_cast<size_t>(i)] += src[i];
    }
    group_->barrier.arrive_and_wait();  // every rank has read every operand
    std::memcpy(t.data(), sum_.data(), static_cast<size_t>(n) * sizeof(float));
  }

  void all_gather_columns(const Tensor& in, Tensor& out) override {
    check_f32(in, "all_gather_columns");
    check_f32(out, "all_gather_columns");
    const int64_t rows = in.ndim() == 0 ? 1 : in.numel() / std::max<int64_t>(1, in.size(-1));
    const int64_t cols = in.ndim() == 0 ? 1 : in.size(-1);
    SPECULA_CHECK(out.numel() == rows * cols * size(),
                  "tensor parallel all_gather_columns: out {} must hold {} ranks' {}", out.describe(), size(),
                  in.describe());
    if (rehearsing_) return;
    count_entered();
    post(in);
    const int64_t out_cols = cols * size();
    float* dst = out.data_as<float>();
    for (int k = 0; k < size(); ++k) {
      const Tensor* block = group_->posted[static_cast<size_t>(k)];
      SPECULA_CHECK(block->numel() == rows * cols, "tensor parallel all_gather_columns: rank {} gives {}, rank {} {}",
                    k, block->describe(), rank_, in.describe());
      const float* src = block->data_as<const float>();
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(dst + r * out_cols + k * cols, src + r * cols, static_cast<size_t>(cols) * sizeof(float));
    }
    group_->barrier.arrive_and_wait();  // every rank has read every block
  }

  void abort() override { group_->barrier.abort(); }

 private:
  static void check_f32(const Tensor& t, const char* op) {
    SPECULA_CHECK(t.defined() && t.is_cpu() && t.dtype() == DType::kF32,
                  "tensor parallel {}: the thread communicator takes F32 CPU tensors, got {}", op, t.describe());
  }

  // Publishes this rank's operand and waits until every rank has published its own.
  void post(const Tensor& t) {
    group_->posted[static_cast<size_t>(rank_)] = &t;
    group_->barrier.arrive_and_wait();
  }

  std::shared_ptr<Group> group_;
  int rank_;
  std::vector<float> sum_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_thread_communicators(int size) {
  SPECULA_CHECK(size >= 1, "tensor parallel: {} ranks", size);
  auto group = std::make_shared<Group>(size);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int k = 0; k < size; ++k) out.push_back(std::make_unique<ThreadCommunicator>(group, k));
  return out;
}

}  // namespace specula
