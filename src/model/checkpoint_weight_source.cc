// WeightSource over a Hugging Face safetensors checkpoint: model.safetensors, or
// model.safetensors.index.json whose weight_map names the shard holding each tensor.
#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "core/error.h"
#include "core/logging.h"
#include "model/config_json.h"
#include "model/safetensors.h"
#include "model/weight_source.h"
#include "model/weight_upload.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

class SafetensorsCheckpoint : public WeightSource {
 public:
  explicit SafetensorsCheckpoint(const fs::path& location) {
    std::error_code ec;
    if (fs::is_regular_file(location, ec)) {
      dir_ = location.parent_path();
      add_file(SafetensorsFile::open(location));
      return;
    }
    SPECULA_CHECK(fs::is_directory(location, ec), "checkpoint {}: no such directory", location.string());
    dir_ = location;
    fs::path index = location / "model.safetensors.index.json";
    fs::path single = location / "model.safetensors";
    if (fs::exists(index, ec)) {
      open_sharded(index);
    } else if (fs::exists(single, ec)) {
      add_file(SafetensorsFile::open(single));
    } else {
      throw Error(fmt::format("checkpoint {}: neither model.safetensors nor model.safetensors.index.json found",
                              location.string()));
    }
  }

  bool has(const std::string& name) const override { return tensors_.count(name) != 0; }

  std::optional<Shape> stored_shape(const std::string& name) const override {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return std::nullopt;
    return it->second.entry->shape;
  }

  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    out.reserve(tensors_.size());
    for (const auto& [name, loc] : tensors_) out.push_back(name);
    std::sort(out.begin(), out.end());
    return out;
  }

  std::string describe() const override {
    return fmt::format("checkpoint {} ({} file{}, {} tensors)", dir_.string(), files_.size(),
                       files_.size() == 1 ? "" : "s", tensors_.size());
  }

  Tensor load(const std::string& name, const Shape& expected, DType dtype, Backend& backend) override {
    return load_part(name, expected, std::nullopt, dtype, backend);
  }

  Tensor load_slice(const std::string& name, const Shape& full, const TensorSlice& slice, DType dtype,
                    Backend& backend) override {
    return load_part(name, full, slice, dtype, backend);
  }

 private:
  // The whole tensor, or only `slice` of it, read from the mmap'd file.
  Tensor load_part(const std::string& name, const Shape& expected, const std::optional<TensorSlice>& slice,
                   DType dtype, Backend& backend) {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) {
      throw Error(fmt::format("checkpoint {}: tensor '{}' not found (the checkpoint has {} tensors)", dir_.string(),
                              name, tensors_.size()));
    }
    const SafetensorsFile& file = *it->second.file;
    const SafetensorsEntry& e = *it->second.entry;
    const std::string where = file.path().string();
    SPECULA_CHECK(e.shape == expected, "{}: tensor '{}' has shape {}, expected {}", where, name, shape_str(e.shape),
                  shape_str(expected));
    if (!e.dtype) {
      throw Error(fmt::format("{}: tensor '{}' is stored as {}, which specula does not support", where, name,
                              e.dtype_name));
    }
    const DType stored = *e.dtype;
    if (stored != dtype) {
      if (stored == DType::kF8E4M3) {
        throw Error(fmt::format("{}: tensor '{}' is stored as F8_E4M3 but config.json's quantization_config does "
                                "not say how it is scaled",
                                where, name));
      }
      if (!is_weight_float_dtype(stored) || !is_weight_float_dtype(dtype)) {
        throw Error(fmt::format("{}: tensor '{}' is stored as {} and cannot be converted to {}", where, name,
                                e.dtype_name, dtype_name(dtype)));
      }
    }
    Tensor dst = backend.empty(slice ? slice_shape(expected, *slice) : expected, dtype);
    const uint8_t* src = file.data(e);
    const size_t in_size = dtype_size(stored);
    ElementFiller whole = [&](void* out, size_t begin, size_t count) {
      convert_elements(src + begin * in_size, stored, out, dtype, count);
    };
    fill_backend_tensor(backend, dst, slice ? slice_filler(expected, *slice, dtype_size(dtype), whole) : whole);
    std::lock_guard<std::mutex> lock(progress_mu_);  // tensor-parallel ranks load at once
    ++loaded_;
    bytes_ += dst.nbytes();
    if (on_progress) on_progress(loaded_, bytes_);
    return dst;
  }

  struct Located {
    const SafetensorsFile* file;
    const SafetensorsEntry* entry;
  };

  void add_file(std::shared_ptr<SafetensorsFile> f) {
    for (const auto& e : f->entries()) {
      auto [it, inserted] = tensors_.emplace(e.name, Located{f.get(), &e});
      if (!inserted) {
        throw Error(fmt::format("checkpoint {}: tensor '{}' appears in both {} and {}", dir_.string(), e.name,
                                it->second.file->path().filename().string(), f->path().filename().string()));
      }
    }
    files_.push_back(std::move(f));
  }

  void open_sharded(const fs::path& index_path) {
    nlohmann::json index = read_json_file(index_path);
    JsonKeys keys(index, index_path.string());
    auto map = keys.get_object("weight_map");
    if (!map) keys.fail("weight_map", keys.has("weight_map") ? "is null" : "missing required key");
    // Shards in first-mention order; every value must be a relative file name.
    std::vector<std::string> shards;
    std::unordered_map<std::string, std::string> shard_of;
    for (auto it = map->json().begin(); it != map->json().end(); ++it) {
      if (!it.value().is_string()) map->fail(it.key(), "expected a shard file name, got " + describe_json_value(it.value()));
      std::string shard = it.value().get<std::string>();
      fs::path rel(shard);
      if (shard.empty() || rel.is_absolute() || rel.lexically_normal().string().rfind("..", 0) == 0)
        map->fail(it.key(), fmt::format("shard '{}' is not a file name inside the checkpoint folder", shard));
      if (std::find(shards.begin(), shards.end(), shard) == shards.end()) shards.push_back(shard);
      shard_of[it.key()] = shard;
    }
    SPECULA_CHECK(!shards.empty(), "{}: weight_map is empty", index_path.string());
    std::error_code ec;
    for (const auto& shard : shards) {
      fs::path p = dir_ / shard;
      if (!fs::exists(p, ec)) {
        std::string example;
        for (const auto& [t, s] : shard_of)
          if (s == shard && (example.empty() || t < example)) example = t;
        throw Error(fmt::format("{}: shard file {} (holding tensor '{}') is missing", index_path.string(), p.string(),
                                example));
      }
      add_file(SafetensorsFile::open(p));
    }
    for (const auto& [tensor, shard] : shard_of) {
      auto it = tensors_.find(tensor);
      if (it == tensors_.end() || it->second.file->path() != dir_ / shard) {
        throw Error(fmt::format("{}: weight_map puts tensor '{}' in {}, but that file does not hold it",
                                index_path.string(), tensor, shard));
      }
    }
  }

  fs::path dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::unordered_map<std::string, Located> tensors_;
  std::mutex progress_mu_;
  size_t loaded_ = 0;
  size_t bytes_ = 0;
};

}  // namespace

std::unique_ptr<WeightSource> open_safetensors_checkpoint(const std::filesystem::path& dir) {
  auto source = std::make_unique<SafetensorsCheckpoint>(dir);
  LOG_DEBUG("opened {}", source->describe());
  return source;
}

}  // namespace specula
