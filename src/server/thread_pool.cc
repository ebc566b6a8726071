#include "server/thread_pool.h"

#include "core/logging.h"

namespace specula::server {

GrowingThreadPool::GrowingThreadPool(size_t initial_threads, size_t max_threads)
    : max_threads_(max_threads < 1 ? 1 : max_threads) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < initial_threads && threads_.size() < max_threads_; ++i) spawn_locked();
}

GrowingThreadPool::~GrowingThreadPool() { shutdown(); }

void GrowingThreadPool::spawn_locked() {
  try {
    threads_.emplace_back([this] { work(); });
  } catch (const std::system_error& e) {
    // Out of threads: the connection waits in the queue for a free one instead.
    LOG_WARN("HTTP server could not start another worker thread ({} running): {}", threads_.size(), e.what());
    max_threads_ = threads_.size();
  }
}

void GrowingThreadPool::enqueue(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(fn));
    if (!shutdown_ && jobs_.size() > idle_ && threads_.size() < max_threads_) spawn_locked();
  }
  cv_.notify_one();
}

void GrowingThreadPool::shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_ && threads_.empty()) return;
    shutdown_ = true;
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (auto& t : threads) t.join();
}

size_t GrowingThreadPool::num_threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return threads_.size();
}

void GrowingThreadPool::work() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++idle_;
      cv_.wait(lock, [&] { return !jobs_.empty() || shutdown_; });
      --idle_;
      if (jobs_.empty()) return;  // shutting down and nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace specula::server
