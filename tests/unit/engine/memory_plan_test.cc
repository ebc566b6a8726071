// The device memory plan on the host: a "device" backend that delegates every op to the CPU and
// reports scripted memory figures. The profile step must be the largest step the engine can run
// (max_num_batched_tokens over max_num_seqs sequences, no sequence past max_model_len, the logits
// rows a step samples at most); the budget is gpu_memory_utilization of the device minus what is
// in use (memory the allocator only caches counts as free) minus the reserve; a budget below one
// max_model_len sequence is an error naming every size; the KV cache sizing takes the budget.
#include <gtest/gtest.h>

#include <deque>

#include "engine/kv_cache_sizing.h"
#include "engine/memory_plan.h"
#include "sampling/sampler.h"
#include "model/model.h"
#include "model/weight_source.h"
#include "test_paths.h"

namespace specula {
namespace {

constexpr size_t kGiB = size_t{1} << 30;

// The model's own CPU backend, plus scripted memory_info() answers.
class ScriptedDevice : public Backend {
 public:
  explicit ScriptedDevice(Backend& cpu) : cpu_(cpu) {}
  Device device() const override { return Device::kCUDA; }
  std::string name() const override { return "scripted device"; }
  DType compute_dtype() const override { return cpu_.compute_dtype(); }
  Tensor empty(Shape s, DType t) override { return cpu_.empty(std::move(s), t); }
  Tensor scratch(Shape s, DType t) override { return cpu_.scratch(std::move(s), t); }
  void reset_scratch() override { cpu_.reset_scratch(); }
  void copy(const Tensor& a, Tensor& b) override { cpu_.copy(a, b); }
  void cast(const Tensor& a, Tensor& b) override { cpu_.cast(a, b); }
  void zero(Tensor& t) override { cpu_.zero(t); }
  void synchronize() override {}
  void embedding(const Tensor& a, const Tensor& b, Tensor& c) override { cpu_.embedding(a, b, c); }
  void rms_norm(const Tensor& a, const Tensor& b, float e, Tensor& c) override { cpu_.rms_norm(a, b, e, c); }
  void add_rms_norm(Tensor& a, Tensor& b, const Tensor& c, float e) override { cpu_.add_rms_norm(a, b, c, e); }
  void linear(const Tensor& a, const Tensor& b, const Tensor* c, Tensor& d) override { cpu_.linear(a, b, c, d); }
  void rope(Tensor& a, Tensor& b, const Tensor& c, const Tensor& d, int e, bool f) override {
    cpu_.rope(a, b, c, d, e, f);
  }
  void silu_mul(const Tensor& a, Tensor& b) override { cpu_.silu_mul(a, b); }
  void add(const Tensor& a, const Tensor& b, Tensor& c) override { cpu_.add(a, b, c); }
  void write_kv_cache(const Tensor& a, const Tensor& b, KVCacheLayer& c, const Tensor& d) override {
    cpu_.write_kv_cache(a, b, c, d);
  }
  void paged_attention(const Tensor& a, const KVCacheLayer& b, const AttentionMetadata& c, float d,
                       Tensor& e) override {
    cpu_.paged_attention(a, b, c, d, e);
  }
  void gather_rows(const Tensor& a, const Tensor& b, Tensor& c) override { cpu_.gather_rows(a, b, c); }
  std::optional<DeviceMemoryInfo> memory_info() override {
    if (answers.empty()) return std::nullopt;
    DeviceMemoryInfo m = answers.front();
    answers.pop_front();
    return m;
  }
  std::deque<DeviceMemoryInfo> answers;

 private:
  Backend& cpu_;
};

// Records the shape of each forward it passes on.
class RecordingModel : public Model {
 public:
  explicit RecordingModel(Model& inner) : inner_(inner) {}
  const ModelConfig& config() const override { return inner_.config(); }
  KVCacheSpec kv_cache_spec() const override { return inner_.kv_cache_spec(); }
  ForwardOutput forward(const ForwardInput& in, std::vector<KVCacheLayer>& kv) override {
    seen.push_back(in);
    return inner_.forward(in, kv);
  }
  std::vector<ForwardInput> seen;

 private:
  Model& inner_;
};

DeviceMemoryInfo mem(double total, double free, double allocated, double cached) {
  return {static_cast<size_t>(total * kGiB), static_cast<size_t>(free * kGiB), static_cast<size_t>(allocated * kGiB),
          static_cast<size_t>(cached * kGiB)};
}

struct Fixture {
  std::unique_ptr<Backend> cpu = make_cpu_backend(2);
  std::unique_ptr<Model> model;
  Fixture() {
    const auto dir = testing::models_dir() / "specula-tiny";
    auto weights = open_safetensors_checkpoint(dir);
    model = create_model(load_model_config(dir), *weights, *cpu);
  }
};

TEST(MemoryPlan, ProfilesTheLargestStepAndBudgetsTheRest) {
  Fixture f;
  ScriptedDevice dev(*f.cpu);
  RecordingModel model(*f.model);
  auto sampler = make_cpu_sampler(dev);
  dev.answers.push_back(mem(80, 59, 18, 1));  // after the profile step
  MemoryPlanConfig c;
  c.max_num_batched_tokens = 100;
  c.max_num_seqs = 8;
  c.max_model_len = 64;
  c.gpu_memory_utilization = 0.9;
  c.reserve_bytes = kGiB;
  const DeviceMemoryPlan p = plan_device_memory(model, dev, *sampler, c, mem(80, 79, 0, 0), mem(80, 63, 16, 0));
  ASSERT_EQ(model.seen.size(), 1u);
  const ForwardInput& in = model.seen[0];
  EXPECT_EQ(in.token_ids.size(0), 100);
  EXPECT_EQ(in.attn.num_seqs, 8);
  EXPECT_EQ(in.logits_indices.size(0), 8) << "one sampled row per sequence";
  EXPECT_EQ(in.attn.query_start_loc_host.back(), 100);
  EXPECT_EQ(p.profiled_tokens, 100);
  EXPECT_EQ(p.total, 80 * kGiB);
  EXPECT_EQ(p.weights, 16 * kGiB);
  EXPECT_EQ(p.activations, 2 * kGiB);
  EXPECT_EQ(p.other, 2 * kGiB) << "in use (80 - 59 free - 1 cached) minus the allocator's 18";
  EXPECT_EQ(p.requested, static_cast<size_t>(0.9 * 80 * kGiB));
  EXPECT_EQ(p.kv_budget, static_cast<size_t>(0.9 * 80 * kGiB) - 20 * kGiB - kGiB);
}

TEST(MemoryPlan, NoProfiledSequenceExceedsMaxModelLenAndDraftsAddLogitsRows) {
  Fixture f;
  ScriptedDevice dev(*f.cpu);
  RecordingModel model(*f.model);
  auto sampler = make_cpu_sampler(dev);
  dev.answers.push_back(mem(80, 60, 17, 0));
  MemoryPlanConfig c;
  c.max_num_batched_tokens = 500;
  c.max_num_seqs = 4;
  c.max_model_len = 40;
  c.num_speculative_tokens = 2;
  plan_device_memory(model, dev, *sampler, c, mem(80, 79, 0, 0), mem(80, 63, 16, 0));
  const ForwardInput& in = model.seen.at(0);
  EXPECT_EQ(in.token_ids.size(0), 160) << "4 sequences of at most 40 tokens";
  EXPECT_EQ(in.attn.max_seq_len, 40);
  EXPECT_EQ(in.logits_indices.size(0), 12) << "k + 1 rows per sequence";
}

TEST(MemoryPlan, TooLittleMemoryNamesEverySize) {
  DeviceMemoryPlan p;
  p.total = 80 * kGiB;
  p.requested = 8 * kGiB;
  p.weights = 7 * kGiB;
  p.activations = kGiB / 2;
  p.other = kGiB / 4;
  p.kv_budget = kGiB / 8;
  p.profiled_tokens = 8192;
  MemoryPlanConfig c;
  c.max_model_len = 131072;
  c.block_size = 16;
  c.gpu_memory_utilization = 0.1;
  try {
    check_kv_budget_fits(p, c, 128 * 1024);  // Llama-3.1-8B: 128 KiB of K and V per token
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const char* part : {"weights 7.00 GiB", "activations 0.50 GiB", "8192 tokens", "allows 8.00 GiB",
                             "leaves 0.12 GiB", "131072 tokens", "needs 16.00 GiB", "--gpu-memory-utilization"})
      EXPECT_NE(m.find(part), std::string::npos) << part << " missing from: " << m;
  }
  p.kv_budget = 16 * kGiB;
  EXPECT_NO_THROW(check_kv_budget_fits(p, c, 128 * 1024));
}

TEST(MemoryPlan, TheKvCacheTakesTheDeviceBudget) {
  EngineConfig ec;
  ec.block_size = 16;
  const KVCacheSpec spec{32, 8, 128, 128};  // Llama-3.1-8B
  const size_t per_token = spec.bytes_per_token(DType::kBF16), per_block = per_token * 16;
  const KVCachePlan plan = plan_kv_cache(ec, per_token, Device::kCUDA, 64, 256, 10 * per_block + 5);
  EXPECT_EQ(plan.num_blocks, 10);
  EXPECT_EQ(plan.source, "gpu_memory_utilization");
  ec.num_gpu_blocks_override = 7;
  EXPECT_EQ(plan_kv_cache(ec, per_token, Device::kCUDA, 64, 256, 10 * per_block).num_blocks, 7);
  ec.num_gpu_blocks_override.reset();
  EXPECT_THROW(plan_kv_cache(ec, per_token, Device::kCUDA, 4096, 256, 100 * per_block), Error)
      << "100 blocks of 16 tokens cannot hold one 4096-token sequence";
  // An fp8 cache: the same budget holds twice the blocks.
  EXPECT_EQ(plan_kv_cache(ec, spec.bytes_per_token(DType::kF8E4M3), Device::kCUDA, 64, 256, 10 * per_block).num_blocks,
            20);
  EXPECT_GT(graph_and_buffer_reserve(MemoryPlanConfig{}, spec), size_t{128} << 20);
}

}  // namespace
}  // namespace specula
