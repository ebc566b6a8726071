// Shared helpers for the config/safetensors/weights tests: a temporary folder, file writing,
// and a memory-only Backend that can pose as a non-CPU device so that the staging-and-copy path
// of the weight sources is exercised without a GPU.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"
#include "core/tensor.h"
#include "model/safetensors.h"
#include "model/weight_upload.h"

namespace specula::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "specula-test-XXXXXX").string();
    char* made = ::mkdtemp(tmpl.data());
    if (made == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = made;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline void write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Host memory standing in for a device: lets tests register it as the kCUDA allocator.
class HostAsDeviceAllocator : public Allocator {
 public:
  void* allocate(size_t bytes) override { return std::malloc(bytes); }
  void deallocate(void* p, size_t) override { std::free(p); }
};

// Registers a host allocator for Device::kCUDA for the lifetime of the object (test_model does not
// link the CUDA backend, so nothing else owns that slot).
class FakeDeviceScope {
 public:
  FakeDeviceScope() { register_allocator(Device::kCUDA, &alloc_); }
  ~FakeDeviceScope() { register_allocator(Device::kCUDA, nullptr); }

 private:
  HostAsDeviceAllocator alloc_;
};

// Only memory ops; every compute op fails loudly. `device` kCUDA needs a FakeDeviceScope.
class MemoryBackend : public Backend {
 public:
  explicit MemoryBackend(Device device = Device::kCPU) : device_(device) {}
  Device device() const override { return device_; }
  std::string name() const override { return "memory-test"; }
  DType compute_dtype() const override { return device_ == Device::kCPU ? DType::kF32 : DType::kBF16; }
  Tensor empty(Shape shape, DType dtype) override { return Tensor::empty(std::move(shape), dtype, device_); }
  Tensor scratch(Shape shape, DType dtype) override { return empty(std::move(shape), dtype); }
  void reset_scratch() override {}
  void copy(const Tensor& src, Tensor& dst) override {
    SPECULA_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel(), "copy mismatch {} -> {}", src.describe(),
                  dst.describe());
    std::memcpy(dst.data(), src.data(), src.nbytes());
    ++copies;
    copied_bytes += src.nbytes();
  }
  void cast(const Tensor&, Tensor&) override { unsupported(); }
  void zero(Tensor& t) override { std::memset(t.data(), 0, t.nbytes()); }
  void synchronize() override { ++syncs; }
  void embedding(const Tensor&, const Tensor&, Tensor&) override { unsupported(); }
  void rms_norm(const Tensor&, const Tensor&, float, Tensor&) override { unsupported(); }
  void add_rms_norm(Tensor&, Tensor&, const Tensor&, float) override { unsupported(); }
  void linear(const Tensor&, const Tensor&, const Tensor*, Tensor&) override { unsupported(); }
  void rope(Tensor&, Tensor&, const Tensor&, const Tensor&, int, bool) override { unsupported(); }
  void silu_mul(const Tensor&, Tensor&) override { unsupported(); }
  void add(const Tensor&, const Tensor&, Tensor&) override { unsupported(); }
  void write_kv_cache(const Tensor&, const Tensor&, KVCacheLayer&, const Tensor&) override { unsupported(); }
  void paged_attention(const Tensor&, const KVCacheLayer&, const AttentionMetadata&, float, Tensor&) override {
    unsupported();
  }
  void gather_rows(const Tensor&, const Tensor&, Tensor&) override { unsupported(); }

  int copies = 0;
  size_t copied_bytes = 0;
  int syncs = 0;

 private:
  [[noreturn]] static void unsupported() { throw Error("MemoryBackend: compute op not available in this test"); }
  Device device_;
};

// Reads a tensor that lives in host memory (CPU, or the fake device) as floats.
inline std::vector<float> host_values(const Tensor& t) {
  Tensor view = Tensor::from_blob(t.data(), t.shape(), t.dtype(), Device::kCPU);
  return view.to_f32_vector();
}

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Every tensor of a single-file checkpoint (dir/model.safetensors), as F32 CPU tensors, in file
// order.
inline std::vector<std::pair<std::string, Tensor>> read_checkpoint_f32(const std::filesystem::path& dir) {
  auto file = SafetensorsFile::open(dir / "model.safetensors");
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& e : file->entries()) {
    Tensor t = Tensor::empty(e.shape, DType::kF32);
    convert_elements(file->data(e), *e.dtype, t.data(), DType::kF32, static_cast<size_t>(e.numel()));
    out.emplace_back(e.name, t);
  }
  return out;
}

// dir/config.json and dir/model.safetensors (tensors in their own dtypes).
inline void write_checkpoint(const std::filesystem::path& dir, const nlohmann::json& config,
                             const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump(2);
  write_safetensors(dir / "model.safetensors", tensors);
}

// Expects `fn` to throw specula::Error whose message contains every one of `parts`.
template <class Fn>
void expect_error_mentions(Fn&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected a specula::Error mentioning " << *parts.begin();
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "error should be one line: " << msg;
  }
}

}  // namespace specula::testing
