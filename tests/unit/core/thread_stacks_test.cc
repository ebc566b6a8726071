// write_thread_stacks: the stacks of the threads enrolled by name_current_thread and of those asked
// for, each under its header, none of the others (nor the threads an enrolled one starts, which
// inherit its name); the threads it interrupts carry on as before.
#include "core/thread_stacks.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <fmt/format.h>

namespace specula {
namespace {

// A thread parked in a condition wait (as a rank waits for its next job), under `name`: enrolled
// through name_current_thread, or only named (as a library names its threads).
class ParkedThread {
 public:
  explicit ParkedThread(std::string name, bool enrol = true) {
    thread_ = std::thread([this, name, enrol] {
      if (!name.empty() && enrol) name_current_thread(name);
      if (!name.empty() && !enrol) pthread_setname_np(pthread_self(), name.c_str());
      std::unique_lock<std::mutex> lock(mu_);
      tid_ = current_thread_id();
      cv_.notify_all();
      cv_.wait(lock, [&] { return released_; });
      ++woken_;
    });
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return tid_ != 0; });
  }
  ~ParkedThread() { release(); }

  pid_t tid() const { return tid_; }
  int woken() const { return woken_.load(); }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  pid_t tid_ = 0;
  bool released_ = false;
  std::atomic<int> woken_{0};
  std::thread thread_;
};

std::string report(const std::vector<pid_t>& also = {}) {
  char path[] = "/tmp/thread_stacks_XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  write_thread_stacks(fd, also);
  close(fd);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  unlink(path);
  return text.str();
}

// The frame lines under `tid`'s header, up to the next header.
int frames_of(const std::string& text, pid_t tid) {
  const size_t at = text.find(fmt::format("thread {} ", tid));
  if (at == std::string::npos) return -1;
  std::istringstream lines(text.substr(at));
  std::string line;
  std::getline(lines, line);  // the header
  int frames = 0;
  while (std::getline(lines, line) && line.rfind("thread ", 0) != 0)
    if (line.find("[0x") != std::string::npos) ++frames;
  return frames;
}

TEST(ThreadStacks, ReportsEnrolledThreadsAndThoseAskedForOnly) {
  ParkedThread rank("specula-rank1"), asked(""), other("specula-rank9", /*enrol=*/false);
  const std::string text = report({asked.tid()});
  EXPECT_NE(text.find(fmt::format("thread {} specula-rank1:", rank.tid())), std::string::npos) << text;
  EXPECT_GE(frames_of(text, rank.tid()), 3) << text;
  EXPECT_GE(frames_of(text, asked.tid()), 3) << text;
  EXPECT_EQ(frames_of(text, other.tid()), -1) << text;
  EXPECT_EQ(frames_of(text, current_thread_id()), -1) << "never the caller's own stack\n" << text;
  // The wait the rank is parked in is libc's: its frames name the library.
  EXPECT_NE(text.find("libc.so"), std::string::npos) << text;
}

// A thread started by an enrolled one carries its name but is not reported (an OpenMP pool).
TEST(ThreadStacks, NotTheThreadsAnEnrolledOneStarts) {
  std::mutex mu;
  std::condition_variable cv;
  pid_t child = 0;
  bool done = false;
  std::thread parent([&] {
    name_current_thread("specula-rank3");
    std::thread inherits([&] {
      std::unique_lock<std::mutex> lock(mu);
      child = current_thread_id();
      cv.notify_all();
      cv.wait(lock, [&] { return done; });
    });
    inherits.join();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return child != 0; });
  }
  const std::string text = report();
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
  parent.join();
  EXPECT_NE(text.find("specula-rank3:"), std::string::npos) << text;  // the parent, waiting in join
  EXPECT_EQ(frames_of(text, child), -1) << text;
}

TEST(ThreadStacks, InterruptedThreadsCarryOn) {
  ParkedThread rank("specula-rank2");
  for (int i = 0; i < 3; ++i) EXPECT_GE(frames_of(report(), rank.tid()), 3);
  EXPECT_EQ(rank.woken(), 0) << "the signal must not end the wait";
  rank.release();
  EXPECT_EQ(rank.woken(), 1);
}

TEST(ThreadStacks, NamesAreCutToTheKernelsLimit) {
  ParkedThread rank("specula-a-very-long-thread-name");
  const std::string text = report();
  EXPECT_NE(text.find(fmt::format("thread {} specula-a-very-:", rank.tid())), std::string::npos) << text;
}

}  // namespace
}  // namespace specula
