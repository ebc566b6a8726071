// open_safetensors_checkpoint: single and sharded layouts, dtype conversion, device upload and
// every bad-checkpoint error.
#include <gtest/gtest.h>

#include "model/safetensors.h"
#include "model/weight_source.h"
#include "weights_test_util.h"

namespace specula {
namespace {

using testing::expect_error_mentions;
using testing::MemoryBackend;
using testing::TempDir;
using testing::write_text;

Tensor stored(const std::vector<float>& v, Shape shape, DType dtype) {
  Tensor t = Tensor::empty(std::move(shape), dtype);
  convert_from_f32(v.data(), dtype, t.data(), v.size());
  return t;
}

TEST(CheckpointWeights, SingleFileConvertsEveryPair) {
  TempDir dir;
  auto v = testing::random_floats(6 * 8, 3, 2.0f);
  write_safetensors(dir / "model.safetensors", {{"w.f32", stored(v, {6, 8}, DType::kF32)},
                                               {"w.f16", stored(v, {6, 8}, DType::kF16)},
                                               {"w.bf16", stored(v, {6, 8}, DType::kBF16)}});
  auto src = open_safetensors_checkpoint(dir.path());
  EXPECT_EQ(src->names(), std::vector<std::string>({"w.bf16", "w.f16", "w.f32"}));
  EXPECT_TRUE(src->has("w.f16"));
  EXPECT_FALSE(src->has("w.f64"));
  EXPECT_NE(src->describe().find("1 file"), std::string::npos);
  MemoryBackend cpu;
  for (const char* name : {"w.f32", "w.f16", "w.bf16"}) {
    for (DType want : {DType::kF32, DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(std::string(name) + " -> " + std::string(dtype_name(want)));
      Tensor t = src->load(name, {6, 8}, want, cpu);
      EXPECT_EQ(t.dtype(), want);
      EXPECT_EQ(t.shape(), Shape({6, 8}));
      EXPECT_TRUE(t.is_cpu());
      std::vector<float> got = t.to_f32_vector();
      for (size_t i = 0; i < v.size(); ++i) {
        // Exact reference: the stored value, rounded once more to the requested dtype (RNE).
        float stored_value;
        if (std::string(name) == "w.f16") stored_value = f16_to_f32(f32_to_f16(v[i]));
        else if (std::string(name) == "w.bf16") stored_value = bf16_to_f32(f32_to_bf16(v[i]));
        else stored_value = v[i];
        float expect = stored_value;
        if (want == DType::kBF16) expect = bf16_to_f32(f32_to_bf16(stored_value));
        if (want == DType::kF16) expect = f16_to_f32(f32_to_f16(stored_value));
        ASSERT_EQ(got[i], expect) << i;
      }
    }
  }
}

TEST(CheckpointWeights, LargeTensorConvertsInParallelChunks) {
  // Several conversion chunks (16 Ki elements each) plus a ragged tail.
  TempDir dir;
  const size_t n = 5 * 16384 + 77;
  auto v = testing::random_floats(n, 9);
  write_safetensors(dir / "model.safetensors", {{"big", stored(v, {static_cast<int64_t>(n)}, DType::kBF16)}});
  MemoryBackend cpu;
  std::vector<float> got = open_safetensors_checkpoint(dir.path())->load("big", {int64_t(n)}, DType::kF32, cpu).to_f32_vector();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], bf16_to_f32(f32_to_bf16(v[i]))) << i;
}

TEST(CheckpointWeights, UnalignedDataSection) {
  // A hand-made file whose data section starts at an odd address: values must still convert.
  TempDir dir;
  std::vector<float> v = {1.5f, -2.25f, 3.0f};
  Tensor t = stored(v, {3}, DType::kBF16);
  std::string header = R"({"x":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]}})";  // 57 bytes: odd
  ASSERT_EQ(header.size() % 2, 1u);
  std::string bytes(8, '\0');
  bytes[0] = static_cast<char>(header.size());
  bytes += header + std::string(static_cast<const char*>(t.data()), 6);
  write_text(dir / "model.safetensors", bytes);
  MemoryBackend cpu;
  EXPECT_EQ(open_safetensors_checkpoint(dir.path())->load("x", {3}, DType::kF32, cpu).to_f32_vector(), v);
}

TEST(CheckpointWeights, ShardedIndex) {
  TempDir dir;
  auto a = testing::random_floats(4, 1), b = testing::random_floats(6, 2);
  write_safetensors(dir / "model-00001-of-00002.safetensors", {{"a", stored(a, {4}, DType::kF32)}});
  write_safetensors(dir / "model-00002-of-00002.safetensors", {{"b", stored(b, {2, 3}, DType::kF32)}});
  write_text(dir / "model.safetensors.index.json", R"({"metadata": {"total_size": 40},
    "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})");
  auto src = open_safetensors_checkpoint(dir.path());
  EXPECT_EQ(src->names(), std::vector<std::string>({"a", "b"}));
  EXPECT_NE(src->describe().find("2 files"), std::string::npos);
  MemoryBackend cpu;
  EXPECT_EQ(src->load("b", {2, 3}, DType::kF32, cpu).to_f32_vector(), b);
  EXPECT_EQ(src->load("a", {4}, DType::kF32, cpu).to_f32_vector(), a);
}

TEST(CheckpointWeights, ProgressCallback) {
  TempDir dir;
  write_safetensors(dir / "model.safetensors", {{"a", stored({1, 2}, {2}, DType::kF32)}, {"b", stored({3}, {1}, DType::kF32)}});
  auto src = open_safetensors_checkpoint(dir.path());
  std::vector<std::pair<size_t, size_t>> calls;
  src->on_progress = [&](size_t n, size_t bytes) { calls.emplace_back(n, bytes); };
  MemoryBackend cpu;
  src->load("a", {2}, DType::kBF16, cpu);
  src->load("b", {1}, DType::kF32, cpu);
  EXPECT_EQ(calls, (std::vector<std::pair<size_t, size_t>>{{1, 4}, {2, 8}}));
}

TEST(CheckpointWeights, DeviceUploadGoesThroughBoundedStaging) {
  testing::FakeDeviceScope device;
  TempDir dir;
  const size_t n = 40 * 1024 * 1024 / 2 + 5;  // > 64 MB of F32 after conversion: at least two chunks
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(int(i % 256) - 128);  // exact in bf16
  write_safetensors(dir / "model.safetensors", {{"w", stored(v, {int64_t(n)}, DType::kBF16)}});
  MemoryBackend gpu(Device::kCUDA);
  Tensor t = open_safetensors_checkpoint(dir.path())->load("w", {int64_t(n)}, DType::kF32, gpu);
  EXPECT_EQ(t.device(), Device::kCUDA);
  EXPECT_GE(gpu.copies, 2);
  EXPECT_EQ(gpu.copied_bytes, n * 4);
  EXPECT_EQ(gpu.syncs, gpu.copies);
  std::vector<float> got = testing::host_values(t);
  for (size_t i = 0; i < n; i += 997) ASSERT_EQ(got[i], v[i]) << i;  // all exact in bf16
  ASSERT_EQ(got[n - 1], v[n - 1]);
}

TEST(CheckpointErrors, MissingFolderOrFiles) {
  TempDir dir;
  expect_error_mentions([&] { open_safetensors_checkpoint(dir / "nope"); }, {(dir / "nope").string()});
  expect_error_mentions([&] { open_safetensors_checkpoint(dir.path()); },
                        {dir.path().string(), "model.safetensors"});
}

TEST(CheckpointErrors, MissingTensor) {
  TempDir dir;
  write_safetensors(dir / "model.safetensors", {{"a", stored({1}, {1}, DType::kF32)}});
  MemoryBackend cpu;
  auto src = open_safetensors_checkpoint(dir.path());
  expect_error_mentions([&] { src->load("model.norm.weight", {1}, DType::kF32, cpu); },
                        {dir.path().string(), "'model.norm.weight'", "not found"});
}

TEST(CheckpointErrors, WrongShape) {
  TempDir dir;
  write_safetensors(dir / "model.safetensors", {{"w", stored(std::vector<float>(6, 1.0f), {2, 3}, DType::kF32)}});
  MemoryBackend cpu;
  auto src = open_safetensors_checkpoint(dir.path());
  expect_error_mentions([&] { src->load("w", {3, 2}, DType::kF32, cpu); },
                        {(dir / "model.safetensors").string(), "'w'", "[2, 3]", "[3, 2]"});
}

TEST(CheckpointErrors, UnsupportedStoredDtype) {
  TempDir dir;
  Tensor fp8 = Tensor::zeros({4}, DType::kF8E4M3);
  Tensor i32 = Tensor::from_i32({1, 2}, {2});
  write_safetensors(dir / "model.safetensors", {{"q", fp8}, {"ids", i32}});
  std::string header = R"({"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})";
  MemoryBackend cpu;
  auto src = open_safetensors_checkpoint(dir.path());
  expect_error_mentions([&] { src->load("q", {4}, DType::kBF16, cpu); }, {"model.safetensors", "'q'", "F8_E4M3"});
  expect_error_mentions([&] { src->load("ids", {2}, DType::kF32, cpu); }, {"model.safetensors", "'ids'", "I32"});
  // The same dtype is a plain copy, whatever it is.
  EXPECT_EQ(src->load("ids", {2}, DType::kI32, cpu).to_i32_vector(), std::vector<int32_t>({1, 2}));

  TempDir dir2;
  std::string bytes(8, '\0');
  bytes[0] = static_cast<char>(header.size());
  write_text(dir2 / "model.safetensors", bytes + header + std::string(8, '\0'));
  auto src2 = open_safetensors_checkpoint(dir2.path());
  expect_error_mentions([&] { src2->load("x", {1}, DType::kF32, cpu); }, {"model.safetensors", "'x'", "F64"});
}

TEST(CheckpointErrors, ShardedIndexProblems) {
  MemoryBackend cpu;
  {  // duplicate tensor across shards
    TempDir dir;
    write_safetensors(dir / "s1.safetensors", {{"a", stored({1}, {1}, DType::kF32)}});
    write_safetensors(dir / "s2.safetensors", {{"a", stored({2}, {1}, DType::kF32)}, {"b", stored({2}, {1}, DType::kF32)}});
    write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
    expect_error_mentions([&] { open_safetensors_checkpoint(dir.path()); }, {"'a'", "s1.safetensors", "s2.safetensors"});
  }
  {  // missing shard file
    TempDir dir;
    write_safetensors(dir / "s1.safetensors", {{"a", stored({1}, {1}, DType::kF32)}});
    write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
    expect_error_mentions([&] { open_safetensors_checkpoint(dir.path()); },
                          {"model.safetensors.index.json", "s2.safetensors", "'b'", "missing"});
  }
  {  // weight_map names a shard that lacks the tensor
    TempDir dir;
    write_safetensors(dir / "s1.safetensors", {{"a", stored({1}, {1}, DType::kF32)}});
    write_safetensors(dir / "s2.safetensors", {{"b", stored({1}, {1}, DType::kF32)}});
    write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"a": "s2.safetensors", "b": "s2.safetensors"}})");
    expect_error_mentions([&] { open_safetensors_checkpoint(dir.path()); },
                          {"model.safetensors.index.json", "'a'", "s2.safetensors"});
  }
  {  // corrupt index, missing weight_map, bad entries, corrupt shard
    TempDir dir;
    write_text(dir / "model.safetensors.index.json", "{");
    expect_error_mentions([&] { open_safetensors_checkpoint(dir.path()); }, {"model.safetensors.index.json", "invalid JSON"});
    write_text(dir / "model.safetensors.index.json", R"({"metadata": {}})");
    expect_error_mentions([&] { open_safetensors_checkpoint(dir.path()); }, {"model.safetensors.index.json", "'weight_map'"});
    write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"a": 3}})");
    expect_error_mentions([&] { open_safetensors_checkpoint(dir.path()); }, {"model.safetensors.index.json", "'weight_map.a'"});
    write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"a": "../x.safetensors"}})");
    expect_error_mentions([&] { open_safetensors_checkpoint(dir.path()); }, {"'weight_map.a'", "../x.safetensors"});
    write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"a": "s1.safetensors"}})");
    write_text(dir / "s1.safetensors", "short");
    expect_error_mentions([&] { open_safetensors_checkpoint(dir.path()); }, {"s1.safetensors", "truncated"});
  }
}

}  // namespace
}  // namespace specula
