// Device graphs (CUDA graphs) of a piece of work, one per padded batch size.
//
// Replaying a graph costs one launch however many kernels it holds, so small steps (decode at
// low batch, draft-model steps) stop paying per-kernel host work. The work must read its inputs
// from static buffers that the caller refills before each replay, and write its outputs to
// addresses that do not change between runs (the scratch arena repeats its addresses for a
// repeated sequence of requests). A batch of n rows runs as the smallest captured size >= n,
// the caller padding the rows past n with harmless values.
//
// Generic: `work(size)` is any callable that enqueues device work for `size` rows; the model
// runner captures decode forwards with it, and a proposer can capture its draft steps the same
// way. On a backend without graphs (the CPU) nothing is captured and replay() reports false.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace specula {

class PaddedGraphs {
 public:
  // How one size's work becomes a graph; by default the backend's capture_graph (a model spread
  // over several devices records through Model::capture_graph instead).
  using Recorder = std::function<std::unique_ptr<DeviceGraph>(const std::function<void()>& work)>;

  explicit PaddedGraphs(Backend& backend, Recorder record = nullptr) : backend_(backend), record_(std::move(record)) {}

  // vLLM's capture sizes: 1, 2, 4, then multiples of 8 up to max_size (and max_size itself).
  static std::vector<int> default_sizes(int max_size);

  // For each size: runs work(size) once eagerly (warm-up: it sizes the scratch arena and plans
  // the GEMMs, which capture may not do), then captures it. Throws specula::Error naming the size
  // when a capture fails; graphs captured before stay usable.
  void capture(const std::vector<int>& sizes, const std::function<void(int size)>& work);

  // The smallest captured size >= n, or 0 when none is (run eagerly then).
  int padded_size(int n) const;
  // Replays the graph of exactly `size`; false when there is none.
  bool replay(int size);

  bool empty() const { return graphs_.empty(); }
  size_t size() const { return graphs_.size(); }
  std::vector<int> sizes() const;
  void clear() { graphs_.clear(); }

 private:
  Backend& backend_;
  Recorder record_;
  std::map<int, std::unique_ptr<DeviceGraph>> graphs_;
};

}  // namespace specula
