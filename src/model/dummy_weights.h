// The value rule behind `--load-format dummy` (make_dummy_weight_source in weight_source.h),
// exposed so that tests and tools can generate the same weights into any buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace specula {

// value + scale * U(-1, 1) per element, or the constant `value`.
struct DummyInit {
  enum class Kind { kConstant, kUniform };
  Kind kind = Kind::kUniform;
  float value = 0.0f;
  float scale = 0.0f;
};

// Norm gains and other 1-D weights -> 1; biases -> U(-0.02, 0.02); e_score_correction_bias ->
// U(-0.01, 0.01); matrices -> U(-1/sqrt(in), 1/sqrt(in)) with in = the last dim.
DummyInit dummy_init_for(const std::string& name, const Shape& shape);

// Writes elements [begin, begin + count) of a dummy tensor whose per-tensor hash is `base`
// straight into `out` in `dtype` (F32, F16 or BF16), in parallel. Element i's value depends only
// on (base, i), so any split into chunks gives the same tensor.
void fill_dummy_values(const DummyInit& init, uint64_t base, DType dtype, void* out, size_t begin, size_t count);

}  // namespace specula
