// ShardedWeightSource: a rank's part of each tensor; see sharded_weight_source.h.
#include "model/sharded_weight_source.h"

#include <string_view>

#include "core/error.h"

namespace specula {

WeightShard ShardedWeightSource::shard(const std::string& name) const {
  constexpr std::string_view kScale = "_scale";
  if (name.size() > kScale.size() && name.compare(name.size() - kScale.size(), kScale.size(), kScale) == 0) {
    const WeightShard of_weight = shard_of_(name.substr(0, name.size() - kScale.size()));
    const std::optional<Shape> stored = base_.stored_shape(name);
    int64_t numel = 1;
    if (stored)
      for (int64_t d : *stored) numel *= d;
    if (of_weight.kind == WeightShard::Kind::kSliced && of_weight.slice.dim == 0 && numel == of_weight.full_extent)
      return WeightShard{WeightShard::Kind::kSliced, TensorSlice{0, of_weight.slice.begin, of_weight.slice.count},
                         of_weight.full_extent};
    return {};
  }
  return shard_of_(name);
}

Tensor ShardedWeightSource::load(const std::string& name, const Shape& expected, DType dtype, Backend& backend) {
  const WeightShard s = shard(name);
  switch (s.kind) {
    case WeightShard::Kind::kReplicated:
      return base_.load(name, expected, dtype, backend);
    case WeightShard::Kind::kRankZeroOnly:
      if (rank_ == 0) return base_.load(name, expected, dtype, backend);
      {
        Tensor zeros = backend.empty(expected, dtype);
        backend.zero(zeros);
        return zeros;
      }
    case WeightShard::Kind::kSliced: {
      const size_t dim = static_cast<size_t>(s.slice.dim);
      SPECULA_CHECK(dim < expected.size() && expected[dim] == s.slice.count,
                    "{}: rank {} holds {} of '{}' along dim {}, but {} was asked for", describe(), rank_,
                    s.slice.count, name, dim, shape_str(expected));
      Shape full = expected;
      full[dim] = s.full_extent;
      return base_.load_slice(name, full, s.slice, dtype, backend);
    }
  }
  throw Error("unreachable");
}

std::optional<Shape> ShardedWeightSource::stored_shape(const std::string& name) const {
  std::optional<Shape> stored = base_.stored_shape(name);
  const WeightShard s = shard(name);
  if (!stored || s.kind != WeightShard::Kind::kSliced) return stored;
  return slice_shape(*stored, s.slice);
}

std::string ShardedWeightSource::describe() const {
  return fmt::format("{}, rank {} of {}", base_.describe(), rank_, size_);
}

}  // namespace specula
