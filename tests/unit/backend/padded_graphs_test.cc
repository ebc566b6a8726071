// PaddedGraphs, the "capture a callable per padded batch size" utility, on host-side fakes: the
// capture sizes (vLLM's), warm-up then capture per size, the smallest covering size for a batch,
// replay of exactly the captured work, errors naming the size, and nothing captured on a backend
// without graphs (the CPU).
#include <gtest/gtest.h>

#include <map>

#include "backend/backend.h"
#include "backend/padded_graphs.h"

namespace specula {
namespace {

TEST(PaddedGraphs, DefaultSizesAreVllmsCaptureSizes) {
  EXPECT_EQ(PaddedGraphs::default_sizes(1), (std::vector<int>{1}));
  EXPECT_EQ(PaddedGraphs::default_sizes(3), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(PaddedGraphs::default_sizes(8), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(PaddedGraphs::default_sizes(20), (std::vector<int>{1, 2, 4, 8, 16, 20}));
  const std::vector<int> s = PaddedGraphs::default_sizes(256);
  EXPECT_EQ(s.size(), 35u);  // 1, 2, 4, then 8, 16, ..., 256
  EXPECT_EQ(s[3], 8);
  EXPECT_EQ(s.back(), 256);
  EXPECT_TRUE(PaddedGraphs::default_sizes(0).empty());
}

// A CPU backend whose "graphs" run the work once at capture (as stream capture records it) and
// report their capture index when replayed.
class RecordingBackend : public Backend {
 public:
  RecordingBackend() : cpu_(make_cpu_backend(1)) {}
  Device device() const override { return Device::kCPU; }
  std::string name() const override { return "recording"; }
  DType compute_dtype() const override { return DType::kF32; }
  Tensor empty(Shape s, DType t) override { return cpu_->empty(std::move(s), t); }
  Tensor scratch(Shape s, DType t) override { return cpu_->scratch(std::move(s), t); }
  void reset_scratch() override { ++resets; }
  void copy(const Tensor& a, Tensor& b) override { cpu_->copy(a, b); }
  void cast(const Tensor& a, Tensor& b) override { cpu_->cast(a, b); }
  void zero(Tensor& t) override { cpu_->zero(t); }
  void synchronize() override {}
  void embedding(const Tensor&, const Tensor&, Tensor&) override {}
  void rms_norm(const Tensor&, const Tensor&, float, Tensor&) override {}
  void add_rms_norm(Tensor&, Tensor&, const Tensor&, float) override {}
  void linear(const Tensor&, const Tensor&, const Tensor*, Tensor&) override {}
  void rope(Tensor&, Tensor&, const Tensor&, const Tensor&, int, bool) override {}
  void silu_mul(const Tensor&, Tensor&) override {}
  void add(const Tensor&, const Tensor&, Tensor&) override {}
  void write_kv_cache(const Tensor&, const Tensor&, KVCacheLayer&, const Tensor&) override {}
  void paged_attention(const Tensor&, const KVCacheLayer&, const AttentionMetadata&, float, Tensor&) override {}
  void gather_rows(const Tensor&, const Tensor&, Tensor&) override {}

  std::unique_ptr<DeviceGraph> capture_graph(const std::function<void()>& work) override {
    struct Recorded : DeviceGraph {
      RecordingBackend* be = nullptr;
      int id = 0;
      void replay() override { be->replayed.push_back(id); }
    };
    capturing = true;
    work();
    capturing = false;
    auto g = std::make_unique<Recorded>();
    g->be = this;
    g->id = captures++;
    return g;
  }
  bool capturing = false;
  int resets = 0;
  int captures = 0;
  std::vector<int> replayed;

 private:
  std::unique_ptr<Backend> cpu_;
};

TEST(PaddedGraphs, WarmsUpThenCapturesEachSizeAndReplaysTheRightOne) {
  RecordingBackend be;
  PaddedGraphs graphs(be);
  std::vector<std::pair<int, bool>> calls;  // (size, during capture)
  graphs.capture({1, 2, 4, 8}, [&](int size) { calls.push_back({size, be.capturing}); });
  ASSERT_EQ(calls.size(), 8u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(calls[2 * i], (std::pair<int, bool>{1 << i, false})) << "warm-up, eagerly";
    EXPECT_EQ(calls[2 * i + 1], (std::pair<int, bool>{1 << i, true})) << "then the capture";
  }
  EXPECT_EQ(be.resets, 4) << "the arena may grow between warm-up and capture";
  EXPECT_EQ(graphs.sizes(), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(graphs.padded_size(1), 1);
  EXPECT_EQ(graphs.padded_size(3), 4);
  EXPECT_EQ(graphs.padded_size(5), 8);
  EXPECT_EQ(graphs.padded_size(9), 0) << "larger batches run eagerly";
  EXPECT_TRUE(graphs.replay(4));
  EXPECT_TRUE(graphs.replay(1));
  EXPECT_EQ(be.replayed, (std::vector<int>{2, 0})) << "the graph captured for 4, then the one for 1";
  EXPECT_FALSE(graphs.replay(3)) << "only captured sizes replay";
}

TEST(PaddedGraphs, AFailedCaptureNamesTheSizeAndKeepsTheEarlierGraphs) {
  RecordingBackend be;
  PaddedGraphs graphs(be);
  try {
    graphs.capture({1, 2, 4}, [&](int size) {
      if (size == 4 && be.capturing) throw Error("it synchronised");
    });
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch size 4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("it synchronised"), std::string::npos) << e.what();
  }
  EXPECT_EQ(graphs.sizes(), (std::vector<int>{1, 2}));
}

TEST(PaddedGraphs, TheCpuBackendCapturesNothing) {
  auto cpu = make_cpu_backend(1);
  PaddedGraphs graphs(*cpu);
  int runs = 0;
  graphs.capture({1, 2}, [&](int) { ++runs; });
  EXPECT_TRUE(graphs.empty());
  EXPECT_EQ(graphs.padded_size(1), 0);
  EXPECT_FALSE(graphs.replay(1));
  EXPECT_EQ(runs, 1) << "one warm-up run, then the backend reports it has no graphs";
}

}  // namespace
}  // namespace specula
