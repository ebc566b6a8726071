// The HTTP server's task queue. cpp-httplib runs each connection on a task-queue thread for its
// whole life, and a streaming response holds its thread until the stream ends, so holding 1,000
// open streams needs 1,000 threads. This pool starts small, adds a thread whenever a connection
// arrives and none is idle (up to max_threads), and retires threads idle for idle_timeout beyond
// the initial ones, so a burst does not leave thousands of threads behind.
//
// Shutdown waits at most join_timeout for the connections in flight: a client that trickles a
// header byte a second holds its thread in a read, and must not hold up the process's exit. The
// threads still busy then are abandoned (they keep the pool's state alive, never the pool); the
// owner must then exit without destroying the server they run in (on_abandoned says how many).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

#include <httplib.h>

namespace specula::server {

struct ThreadPoolLimits {
  size_t initial_threads = 8;
  size_t max_threads = 2048;
  std::chrono::milliseconds idle_timeout{30000};
  std::chrono::milliseconds join_timeout{5000};
  std::function<void(size_t)> on_abandoned;  // told how many threads shutdown gave up on
};

class GrowingThreadPool : public httplib::TaskQueue {
 public:
  explicit GrowingThreadPool(const ThreadPoolLimits& limits);
  ~GrowingThreadPool() override;

  void enqueue(std::function<void()> fn) override;
  void shutdown() override;  // runs what is queued, then waits for the threads (join_timeout)
  size_t num_threads() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace specula::server
