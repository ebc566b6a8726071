// Moving weights into backend memory without materialising extra full-size copies: dtype
// conversion in parallel chunks (straight from an mmap'd checkpoint, possibly unaligned), and
// filling a device tensor through a bounded host staging buffer. Shared by the checkpoint and the
// dummy weight sources.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"
#include "model/weight_source.h"

namespace specula {

// F32, F16, BF16: the dtypes weights are converted between.
bool is_weight_float_dtype(DType t);

// Converts n elements of `src` (type `from`; any alignment) into `dst` (type `to`, aligned).
// Same dtype copies bytes; otherwise both must be weight float dtypes (or `from` F8_E4M3). Runs
// in parallel chunks through fp32 registers, never a full fp32 copy.
void convert_elements(const void* src, DType from, void* dst, DType to, size_t n);

// Writes elements [begin, begin + count) of a tensor, in the tensor's dtype, to `out`.
using ElementFiller = std::function<void(void* out, size_t begin, size_t count)>;

// The filler of `slice` of a tensor of shape `full` with `elem`-byte elements, from a filler of
// the full tensor's elements (each run of the slice that is contiguous in the full tensor is one
// call of `full_fill`).
ElementFiller slice_filler(const Shape& full, const TensorSlice& slice, size_t elem, ElementFiller full_fill);

// Fills `dst` (persistent memory of `backend`) through `fill`. CPU tensors are filled in place;
// device tensors through a host staging buffer of at most `staging_bytes`, uploaded with
// backend.copy() chunk by chunk.
void fill_backend_tensor(Backend& backend, Tensor& dst, const ElementFiller& fill, size_t staging_bytes = 64u << 20);

// Named parts of one fused tensor, stacked along dim 0: ("<module>.weight", [n_i, K]) or biases [n_i].
using StackedParts = std::vector<std::pair<std::string, Shape>>;

// A fresh `dtype` tensor on `backend` holding the parts one after another along dim 0
// ([sum n_i, ...]); `load_part(name, shape)` gives each part on the backend, which is copied into
// its rows (device to device) and then dropped, so only one part exists beside the result.
Tensor stack_rows(Backend& backend, DType dtype, const StackedParts& parts,
                  const std::function<Tensor(const std::string& name, const Shape& shape)>& load_part);

}  // namespace specula
