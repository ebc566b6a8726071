// Where a model's weights come from: a safetensors checkpoint (mmap'd, one file or sharded) or
// `--load-format dummy` (random, seeded, from config.json alone). Models ask for tensors by their
// checkpoint (HF) names and expected shapes; the source checks, converts and uploads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"
#include "model/config.h"

namespace specula {

// Part of a stored tensor: `count` indices from `begin` along dimension `dim`, every other
// dimension whole. What one tensor-parallel rank holds of a sharded weight.
struct TensorSlice {
  int dim = 0;
  int64_t begin = 0;
  int64_t count = 0;
};
// The shape of `slice` of a tensor of shape `full`; throws specula::Error when it does not fit.
Shape slice_shape(const Shape& full, const TensorSlice& slice);

// load() and load_slice() may run on several threads at once (the ranks of a tensor-parallel
// model load their shards together); the sources keep their bookkeeping under a lock.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool has(const std::string& name) const = 0;
  // Loads tensor `name`, checks it has shape `expected` (error naming the file, the tensor, both
  // shapes), converts to `dtype` and returns it on `backend`'s device (persistent memory).
  virtual Tensor load(const std::string& name, const Shape& expected, DType dtype, Backend& backend) = 0;
  // Loads only `slice` of tensor `name`, whose stored shape must be `full` (checked as load()
  // checks `expected`): only the slice is converted and uploaded. The default throws (a source
  // that cannot slice).
  virtual Tensor load_slice(const std::string& name, const Shape& full, const TensorSlice& slice, DType dtype,
                            Backend& backend);
  // The shape a tensor is stored with, when the source knows it before loading (a checkpoint does;
  // dummy weights have only the shapes they are asked for).
  virtual std::optional<Shape> stored_shape(const std::string& name) const { return std::nullopt; }
  // Every tensor name the source holds (dummy: none until asked).
  virtual std::vector<std::string> names() const = 0;
  // "checkpoint /models/x (2 files)" or "dummy weights (seed 0)"
  virtual std::string describe() const = 0;
  // Called after each load with (tensors loaded so far, bytes loaded so far); for progress bars.
  std::function<void(size_t tensors, size_t bytes)> on_progress;
};

// Opens model.safetensors or model.safetensors.index.json (+ shards) in `dir`. Throws
// specula::Error naming the file when it is missing or corrupt.
std::unique_ptr<WeightSource> open_safetensors_checkpoint(const std::filesystem::path& dir);

// Random weights with a sensible scale (norm weights 1, biases small, matrices ~U(-1/sqrt(in),
// 1/sqrt(in))); the same seed gives the same weights.
std::unique_ptr<WeightSource> make_dummy_weight_source(const ModelConfig& config, uint64_t seed);

}  // namespace specula
