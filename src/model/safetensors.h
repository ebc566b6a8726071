// One safetensors file, memory-mapped read-only: an 8-byte little-endian header length, a JSON
// header {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then
// the data section. Opening validates the whole header (lengths, offsets, shape * dtype size,
// overlaps) so that a tensor read later can never leave the mapping; every problem is one
// specula::Error naming the file (and the tensor).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace specula {

struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;      // as stored ("BF16", "F64", ...)
  std::optional<DType> dtype;  // nullopt: a safetensors dtype specula cannot hold (F64, U32, ...)
  Shape shape;
  size_t begin = 0;            // byte offsets into the data section
  size_t end = 0;
  int64_t numel() const;
  size_t nbytes() const { return end - begin; }
};

class SafetensorsFile {
 public:
  // Maps and validates `path`; throws naming the file when it is missing, truncated or corrupt.
  static std::shared_ptr<SafetensorsFile> open(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // Tensors in file order (sorted by data offset).
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(const std::string& name) const;
  // The string-to-string __metadata__ (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor's bytes inside the mapping (valid while this object lives; may be unaligned).
  const uint8_t* data(const SafetensorsEntry& e) const { return data_ + e.begin; }
  size_t file_size() const { return size_; }

 private:
  SafetensorsFile() = default;
  void parse_header();

  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  size_t data_size_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes CPU tensors as a safetensors file (tensors in the given order, header padded to 8 bytes
// as the reference implementation does). For tests, tools and `specula` utilities.
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Byte size of one element of a safetensors dtype string, or 0 when the string is not one.
size_t safetensors_dtype_size(const std::string& dtype_name);

}  // namespace specula
