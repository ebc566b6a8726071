#include "core/thread_stacks.h"

#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>

namespace specula {
namespace {

std::mutex g_enrolled_mu;
std::map<pid_t, std::string> g_enrolled;  // name_current_thread's threads, by id (names as the kernel keeps them)
std::atomic<int> g_fd{-1};           // where the signalled thread writes
std::atomic<pid_t> g_answered{0};    // the last thread that has written its stack

// Async-signal-safe: backtrace_symbols_fd allocates nothing, and backtrace's one-time load of
// the unwinder happened in install() before any signal. errno is the interrupted code's.
void on_stack_signal(int) {
  const int saved_errno = errno;
  void* frames[64];
  const int n = backtrace(frames, 64);
  const int fd = g_fd.load();
  if (fd >= 0) backtrace_symbols_fd(frames, n, fd);
  g_answered.store(static_cast<pid_t>(syscall(SYS_gettid)));
  errno = saved_errno;
}

int stack_signal() { return SIGRTMIN + 7; }  // glibc keeps the first realtime signals for itself

void install() {
  static std::once_flag once;
  std::call_once(once, [] {
    void* warm[1];
    backtrace(warm, 1);
    struct sigaction sa = {};
    sa.sa_handler = on_stack_signal;
    sa.sa_flags = SA_RESTART;  // the interrupted call resumes: the report changes nothing it sees
    sigemptyset(&sa.sa_mask);
    sigaction(stack_signal(), &sa, nullptr);
  });
}

std::string thread_name(pid_t tid) {
  std::ifstream in(fmt::format("/proc/self/task/{}/comm", tid));
  std::string name;
  std::getline(in, name);
  return name;
}

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace

void name_current_thread(const std::string& name) {
  const std::string kept = name.substr(0, 15);
  pthread_setname_np(pthread_self(), kept.c_str());
  std::lock_guard<std::mutex> lock(g_enrolled_mu);
  g_enrolled[current_thread_id()] = kept;
}

pid_t current_thread_id() { return static_cast<pid_t>(syscall(SYS_gettid)); }

int write_thread_stacks(int fd, const std::vector<pid_t>& also) {
  static std::mutex one_report;  // two engines' watchdogs may both report: one after the other
  std::lock_guard<std::mutex> report(one_report);
  install();
  const pid_t self = current_thread_id();
  std::map<pid_t, std::string> enrolled;
  {
    std::lock_guard<std::mutex> lock(g_enrolled_mu);
    enrolled = g_enrolled;
  }
  std::vector<pid_t> tids;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    const pid_t tid = static_cast<pid_t>(std::atoi(entry.path().filename().c_str()));
    if (tid == self) continue;
    // An id reused by a later thread no longer carries the enrolled name.
    const auto it = enrolled.find(tid);
    const bool asked = std::find(also.begin(), also.end(), tid) != also.end();
    if ((it != enrolled.end() && it->second == thread_name(tid)) || asked) tids.push_back(tid);
  }
  std::sort(tids.begin(), tids.end());
  int written = 0;
  g_fd.store(fd);
  for (pid_t tid : tids) {
    write_all(fd, fmt::format("thread {} {}:\n", tid, thread_name(tid)));
    g_answered.store(0);
    if (syscall(SYS_tgkill, getpid(), tid, stack_signal()) != 0) {
      write_all(fd, "  (gone)\n");
      continue;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (g_answered.load() != tid && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (g_answered.load() == tid) {
      ++written;
    } else {
      write_all(fd, "  (no answer within a second)\n");
    }
  }
  g_fd.store(-1);
  return written;
}

}  // namespace specula
