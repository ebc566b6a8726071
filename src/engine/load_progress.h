// A progress bar on stderr while weights load: "Loading weights: 45% |#########           |
// 123/272 tensors, 1.20 GiB, 3.1 s". Redrawn in place at most every 100 ms on a terminal; on a
// pipe only the final line is written.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace specula {

class LoadProgress {
 public:
  explicit LoadProgress(size_t total_tensors);  // 0: unknown total (no percentage)
  void update(size_t tensors, size_t bytes);
  void finish();

 private:
  void draw(bool final);
  size_t total_;
  size_t tensors_ = 0, bytes_ = 0;
  bool tty_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace specula
