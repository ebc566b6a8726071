#include "server/thread_pool.h"

#include <thread>

#include "core/logging.h"

namespace specula::server {

// Shared with every worker, so that a worker abandoned at shutdown never touches a freed pool.
struct GrowingThreadPool::State {
  explicit State(const ThreadPoolLimits& l) : limits(l) {}
  ThreadPoolLimits limits;
  std::mutex mu;
  std::condition_variable work_cv;  // jobs or shutdown
  std::condition_variable exit_cv;  // a worker ended
  std::deque<std::function<void()>> jobs;
  size_t threads = 0;
  size_t idle = 0;
  bool shutdown = false;

  void spawn_locked(const std::shared_ptr<State>& self) {
    try {
      std::thread([self] { self->work(); }).detach();
      ++threads;
    } catch (const std::system_error& e) {
      // Out of threads: the connection waits in the queue for a free one instead.
      LOG_WARN("HTTP server could not start another worker thread ({} running): {}", threads, e.what());
      limits.max_threads = threads;
    }
  }

  void work() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      ++idle;
      const bool woke = work_cv.wait_for(lock, limits.idle_timeout, [&] { return !jobs.empty() || shutdown; });
      --idle;
      if (jobs.empty() && (shutdown || (!woke && threads > limits.initial_threads))) break;
      if (jobs.empty()) continue;
      std::function<void()> job = std::move(jobs.front());
      jobs.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
    --threads;
    exit_cv.notify_all();
  }
};

GrowingThreadPool::GrowingThreadPool(const ThreadPoolLimits& limits) : state_(std::make_shared<State>(limits)) {
  if (state_->limits.max_threads < 1) state_->limits.max_threads = 1;
  std::lock_guard<std::mutex> lock(state_->mu);
  for (size_t i = 0; i < limits.initial_threads && state_->threads < state_->limits.max_threads; ++i)
    state_->spawn_locked(state_);
}

GrowingThreadPool::~GrowingThreadPool() { shutdown(); }

void GrowingThreadPool::enqueue(std::function<void()> fn) {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.jobs.push_back(std::move(fn));
    if (!s.shutdown && s.jobs.size() > s.idle && s.threads < s.limits.max_threads) s.spawn_locked(state_);
  }
  s.work_cv.notify_one();
}

void GrowingThreadPool::shutdown() {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  if (s.shutdown) return;  // httplib shuts the queue down, then deletes it
  s.shutdown = true;
  s.work_cv.notify_all();
  if (!s.exit_cv.wait_for(lock, s.limits.join_timeout, [&] { return s.threads == 0; })) {
    const size_t busy = s.threads;
    LOG_WARN("HTTP server: {} connection(s) still busy {} ms after shutdown; not waiting for them", busy,
             s.limits.join_timeout.count());
    lock.unlock();
    if (s.limits.on_abandoned) s.limits.on_abandoned(busy);
  }
}

size_t GrowingThreadPool::num_threads() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->threads;
}

}  // namespace specula::server
