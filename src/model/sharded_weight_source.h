// One tensor-parallel rank's view of a checkpoint: the same tensor names, each loaded as the part
// the rank holds (model/tensor_parallel_plan.h), read straight from the underlying source, so no
// rank ever holds a full copy of a sharded weight. Models load from it exactly as from the
// checkpoint, asking for their rank's shapes.
#pragma once

#include <functional>
#include <string>

#include "model/tensor_parallel_plan.h"
#include "model/weight_source.h"

namespace specula {

class ShardedWeightSource final : public WeightSource {
 public:
  using ShardOf = std::function<WeightShard(const std::string& name)>;
  ShardedWeightSource(WeightSource& base, int rank, int size, ShardOf shard_of)
      : base_(base), rank_(rank), size_(size), shard_of_(std::move(shard_of)) {}

  bool has(const std::string& name) const override { return base_.has(name); }
  // `expected` is the rank's shape; the stored tensor's is derived from the shard.
  Tensor load(const std::string& name, const Shape& expected, DType dtype, Backend& backend) override;
  // The rank's shape of a stored tensor (an FP8 weight's per-row scales follow their weight's rows).
  std::optional<Shape> stored_shape(const std::string& name) const override;
  std::vector<std::string> names() const override { return base_.names(); }
  std::string describe() const override;

 private:
  // The shard of `name`; a weight's "_scale" (FP8) is sliced with its weight's rows when it has one
  // scale per row, else replicated.
  WeightShard shard(const std::string& name) const;

  WeightSource& base_;
  int rank_, size_;
  ShardOf shard_of_;
};

}  // namespace specula
