// safetensors files: writer/reader round trips and every malformed-file case the reader rejects.
#include <gtest/gtest.h>

#include <cstring>

#include "model/safetensors.h"
#include "weights_test_util.h"

namespace specula {
namespace {

using testing::expect_error_mentions;
using testing::TempDir;
using testing::write_text;

// A file from a hand-written header and data section: the malformed cases need full control.
void write_raw(const std::filesystem::path& p, const std::string& header, const std::string& data,
               std::optional<uint64_t> declared_len = std::nullopt) {
  uint64_t n = declared_len.value_or(header.size());
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  write_text(p, bytes + header + data);
}

TEST(Safetensors, RoundTripEveryWeightDtype) {
  TempDir dir;
  auto f32 = testing::random_floats(12, 1);
  Tensor a = Tensor::from_f32(f32, {3, 4});
  Tensor b = Tensor::empty({5}, DType::kBF16);
  Tensor c = Tensor::empty({2, 3}, DType::kF16);
  convert_from_f32(f32.data(), DType::kBF16, b.data(), 5);
  convert_from_f32(f32.data(), DType::kF16, c.data(), 6);
  Tensor d = Tensor::from_i64({1, -2, 3}, {3});
  Tensor e = Tensor::empty({0, 4}, DType::kF32);  // empty tensors are legal
  write_safetensors(dir / "m.safetensors", {{"a", a}, {"b", b}, {"c", c}, {"d", d}, {"e", e}}, {{"format", "pt"}});

  auto file = SafetensorsFile::open(dir / "m.safetensors");
  ASSERT_EQ(file->entries().size(), 5u);
  EXPECT_EQ(file->metadata().at("format"), "pt");
  for (const auto& [name, t] : std::vector<std::pair<std::string, Tensor>>{{"a", a}, {"b", b}, {"c", c}, {"d", d}, {"e", e}}) {
    const SafetensorsEntry* entry = file->find(name);
    ASSERT_NE(entry, nullptr) << name;
    EXPECT_EQ(entry->shape, t.shape());
    ASSERT_TRUE(entry->dtype.has_value());
    EXPECT_EQ(*entry->dtype, t.dtype());
    EXPECT_EQ(entry->nbytes(), t.nbytes());
    EXPECT_EQ(std::memcmp(file->data(*entry), t.data(), t.nbytes()), 0) << name;
  }
  EXPECT_EQ(file->find("missing"), nullptr);
  // Entries come in data order.
  EXPECT_EQ(file->entries()[0].name, "a");
}

TEST(Safetensors, ReadsUnpaddedHeaderAndUnknownButValidDtypes) {
  TempDir dir;
  // 7-byte misalignment of the data section and an F64 tensor specula cannot hold (parsed, not loaded).
  std::string header = R"({"x":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},"y":{"dtype":"BF16","shape":[1],"data_offsets":[16,18]}})";
  write_raw(dir / "odd.safetensors", header, std::string(18, '\1'));
  auto file = SafetensorsFile::open(dir / "odd.safetensors");
  const SafetensorsEntry* x = file->find("x");
  ASSERT_NE(x, nullptr);
  EXPECT_FALSE(x->dtype.has_value());
  EXPECT_EQ(x->dtype_name, "F64");
  EXPECT_EQ(file->find("y")->dtype, DType::kBF16);
  EXPECT_TRUE(file->metadata().empty());
}

TEST(SafetensorsErrors, MissingFile) {
  TempDir dir;
  expect_error_mentions([&] { SafetensorsFile::open(dir / "nope.safetensors"); }, {"nope.safetensors", "cannot open"});
}

TEST(SafetensorsErrors, TruncatedBeforeHeaderLength) {
  TempDir dir;
  write_text(dir / "t.safetensors", "abc");
  expect_error_mentions([&] { SafetensorsFile::open(dir / "t.safetensors"); }, {"t.safetensors", "truncated"});
}

TEST(SafetensorsErrors, HeaderLengthBeyondFile) {
  TempDir dir;
  write_raw(dir / "h.safetensors", R"({})", "", 1000);
  expect_error_mentions([&] { SafetensorsFile::open(dir / "h.safetensors"); }, {"h.safetensors", "header length 1000"});
  write_raw(dir / "huge.safetensors", R"({})", "", uint64_t(1) << 60);
  expect_error_mentions([&] { SafetensorsFile::open(dir / "huge.safetensors"); }, {"huge.safetensors", "100 MB"});
}

TEST(SafetensorsErrors, CorruptHeaderJson) {
  TempDir dir;
  write_raw(dir / "j.safetensors", R"({"a": {"dtype": "F32", )", "");
  expect_error_mentions([&] { SafetensorsFile::open(dir / "j.safetensors"); }, {"j.safetensors", "corrupt"});
  write_raw(dir / "arr.safetensors", R"([1,2])", "");
  expect_error_mentions([&] { SafetensorsFile::open(dir / "arr.safetensors"); }, {"arr.safetensors", "not a JSON object"});
}

// A number no double holds is nlohmann's out_of_range, not a parse_error: it escaped open() as a
// bare nlohmann exception naming no file (found by tests/fuzz/safetensors_header_fuzz).
TEST(SafetensorsErrors, NumberOverflowInHeader) {
  TempDir dir;
  write_raw(dir / "big.safetensors", R"({"__metadata__": {"x": 1e400}})", "");
  expect_error_mentions([&] { SafetensorsFile::open(dir / "big.safetensors"); },
                        {"big.safetensors", "corrupt safetensors header", "number overflow"});
  write_raw(dir / "off.safetensors", R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4e999]}})", "1234");
  expect_error_mentions([&] { SafetensorsFile::open(dir / "off.safetensors"); }, {"off.safetensors", "corrupt"});
}

TEST(SafetensorsErrors, DataOffsetsOutsideDataSection) {
  TempDir dir;
  write_raw(dir / "o.safetensors", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(8, '\0'));
  expect_error_mentions([&] { SafetensorsFile::open(dir / "o.safetensors"); },
                        {"o.safetensors", "'w'", "outside the data section"});
}

TEST(SafetensorsErrors, OffsetsInconsistentWithShapeAndDtype) {
  TempDir dir;
  write_raw(dir / "s.safetensors", R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})", std::string(16, '\0'));
  expect_error_mentions([&] { SafetensorsFile::open(dir / "s.safetensors"); }, {"s.safetensors", "'w'", "needs 12"});
  write_raw(dir / "r.safetensors", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", std::string(16, '\0'));
  expect_error_mentions([&] { SafetensorsFile::open(dir / "r.safetensors"); }, {"r.safetensors", "'w'", "end before"});
}

TEST(SafetensorsErrors, MalformedEntries) {
  TempDir dir;
  auto check = [&](const std::string& entry, const std::string& what) {
    write_raw(dir / "e.safetensors", R"({"bad.weight":)" + entry + "}", std::string(64, '\0'));
    expect_error_mentions([&] { SafetensorsFile::open(dir / "e.safetensors"); }, {"e.safetensors", "'bad.weight'", what});
  };
  check(R"({"dtype":"Q4","shape":[1],"data_offsets":[0,1]})", "dtype 'Q4'");
  check(R"({"shape":[1],"data_offsets":[0,4]})", "dtype");
  check(R"({"dtype":"F32","data_offsets":[0,4]})", "shape");
  check(R"({"dtype":"F32","shape":[1]})", "data_offsets");
  check(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})", "negative");
  check(R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})", "data_offsets");
  check(R"({"dtype":"F32","shape":[4611686018427387904, 8],"data_offsets":[0,4]})", "too large");
  check(R"(7)", "not an object");
}

TEST(SafetensorsErrors, OverlappingTensors) {
  TempDir dir;
  write_raw(dir / "ov.safetensors",
            R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
            std::string(16, '\0'));
  expect_error_mentions([&] { SafetensorsFile::open(dir / "ov.safetensors"); }, {"ov.safetensors", "'a'", "'b'", "overlap"});
}

}  // namespace
}  // namespace specula
