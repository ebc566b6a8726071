#include "engine/load_progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace specula {

LoadProgress::LoadProgress(size_t total_tensors)
    : total_(total_tensors), tty_(isatty(fileno(stderr)) != 0), start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

void LoadProgress::update(size_t tensors, size_t bytes) {
  tensors_ = tensors;
  bytes_ = bytes;
  const auto now = std::chrono::steady_clock::now();
  if (tty_ && now - last_draw_ >= std::chrono::milliseconds(100)) {
    last_draw_ = now;
    draw(false);
  }
}

void LoadProgress::finish() {
  if (finished_) return;
  finished_ = true;
  draw(true);
}

void LoadProgress::draw(bool final) {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double gib = static_cast<double>(bytes_) / (1 << 30);
  std::string line;
  if (total_ > 0) {
    const size_t pct = std::min<size_t>(100, tensors_ * 100 / total_);
    const size_t filled = pct / 5;
    line = fmt::format("Loading weights: {:3}% |{}{}| {}/{} tensors, {:.2f} GiB, {:.1f} s", pct,
                       std::string(filled, '#'), std::string(20 - filled, ' '), tensors_, total_, gib, secs);
  } else {
    line = fmt::format("Loading weights: {} tensors, {:.2f} GiB, {:.1f} s", tensors_, gib, secs);
  }
  std::fprintf(stderr, "%s%s%s", tty_ ? "\r" : "", line.c_str(), final ? "\n" : "");
  std::fflush(stderr);
}

}  // namespace specula
