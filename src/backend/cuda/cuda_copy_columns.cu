// Backend::copy_columns as a kernel launched overlapped: in a forward (an EAGLE-3 head's input
// concat, a target's auxiliary features, MTP's concat) a cudaMemcpy2DAsync is a copy node that
// the kernels before and after it cannot overlap, each side costing a launch gap of ~1-2 us for a
// few kilobytes moved. Large copies (weights at load time) stay with the copy engines.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"

namespace specula::cuda {
namespace {

constexpr int kThreads = 256;
// Larger copies (weights at load time) go to the copy engines, which stream them at full bandwidth.
constexpr int64_t kKernelCopyBytes = 4 << 20;

// One thread a 16-byte piece (or an element, where the rows or columns are not 16-byte aligned)
// of the rows x row_bytes region.
template <class Piece>
__global__ void copy_columns_kernel(const char* __restrict__ src, int64_t src_pitch, char* __restrict__ dst,
                                    int64_t dst_pitch, int64_t rows, int64_t pieces_per_row) {
  allow_next_kernel_start();
  wait_for_previous_kernels();  // src is usually the previous kernel's output
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= rows * pieces_per_row) return;
  const int64_t row = i / pieces_per_row, piece = i % pieces_per_row;
  reinterpret_cast<Piece*>(dst + row * dst_pitch)[piece] = reinterpret_cast<const Piece*>(src + row * src_pitch)[piece];
}

template <class Piece>
cudaError_t launch_typed(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t rows,
                         int64_t row_bytes, cudaStream_t stream) {
  const int64_t pieces = row_bytes / static_cast<int64_t>(sizeof(Piece));
  const int64_t blocks = (rows * pieces + kThreads - 1) / kThreads;
  LaunchShape shape;
  shape.grid = dim3(static_cast<unsigned>(blocks));
  shape.block = dim3(kThreads);
  return launch_overlapped(copy_columns_kernel<Piece>, shape, stream, static_cast<const char*>(src), src_pitch,
                           static_cast<char*>(dst), dst_pitch, rows, pieces);
}

}  // namespace

bool device_copy_as_kernel(int64_t bytes) {
  static const bool enabled = [] {
    const char* v = std::getenv("SPECULA_DEVICE_COPY_KERNEL");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return enabled && bytes <= kKernelCopyBytes;
}

cudaError_t launch_copy_columns(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t rows,
                                int64_t row_bytes, int64_t elem_bytes, cudaStream_t stream) {
  if (rows == 0 || row_bytes == 0) return cudaSuccess;
  const uintptr_t all = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) |
                        static_cast<uintptr_t>(src_pitch) | static_cast<uintptr_t>(dst_pitch) |
                        static_cast<uintptr_t>(row_bytes);
  if (all % 16 == 0) return launch_typed<uint4>(src, src_pitch, dst, dst_pitch, rows, row_bytes, stream);
  if (all % 4 == 0) return launch_typed<uint32_t>(src, src_pitch, dst, dst_pitch, rows, row_bytes, stream);
  if (elem_bytes == 2) return launch_typed<uint16_t>(src, src_pitch, dst, dst_pitch, rows, row_bytes, stream);
  return launch_typed<uint8_t>(src, src_pitch, dst, dst_pitch, rows, row_bytes, stream);
}

}  // namespace specula::cuda
