// The HTTP server's task queue. cpp-httplib runs each connection on a task-queue thread for its
// whole life, and a streaming response holds its thread until the stream ends, so holding 1,000
// open streams needs 1,000 threads. This pool starts small and adds a thread whenever a
// connection arrives and none is idle (up to max_threads), so an idle server holds few threads.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <httplib.h>

namespace specula::server {

class GrowingThreadPool : public httplib::TaskQueue {
 public:
  GrowingThreadPool(size_t initial_threads, size_t max_threads);
  ~GrowingThreadPool() override;

  void enqueue(std::function<void()> fn) override;
  void shutdown() override;  // runs what is queued, then joins every thread
  size_t num_threads() const;

 private:
  void spawn_locked();
  void work();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  size_t max_threads_;
  bool shutdown_ = false;
};

}  // namespace specula::server
