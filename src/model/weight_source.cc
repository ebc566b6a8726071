// WeightSource's defaults and the shape of a tensor slice.
#include "model/weight_source.h"

#include "core/error.h"

namespace specula {

Shape slice_shape(const Shape& full, const TensorSlice& slice) {
  SPECULA_CHECK(slice.dim >= 0 && slice.dim < static_cast<int>(full.size()) && slice.begin >= 0 && slice.count >= 0 &&
                    slice.begin + slice.count <= full[static_cast<size_t>(slice.dim)],
                "slice of {} indices from {} along dim {} does not fit a tensor of shape {}", slice.count, slice.begin,
                slice.dim, shape_str(full));
  Shape out = full;
  out[static_cast<size_t>(slice.dim)] = slice.count;
  return out;
}

Tensor WeightSource::load_slice(const std::string& name, const Shape& full, const TensorSlice& slice, DType dtype,
                                Backend& backend) {
  throw Error(fmt::format("{}: cannot load a slice of '{}' (tensor parallelism needs a checkpoint or dummy weights)",
                          describe(), name));
}

}  // namespace specula
