// Memory-bound row-wise kernels: gather of rows (embedding, gather_rows), add, bias add and
// SiLU-and-multiply. Each moves its bytes in 16-byte vectors when the row length and the pointers
// allow (the widest load a thread can issue), falling back to scalar code otherwise; fp32 math.
#include <algorithm>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_utils.cuh"

namespace specula::cuda {
namespace {

constexpr int kThreads = 256;

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Enough blocks to fill every SM several times; the kernels loop over the rest (grid-stride).
int grid_for(int64_t work_items) {
  return static_cast<int>(std::clamp<int64_t>((work_items + kThreads - 1) / kThreads, 1, 8192));
}

// One block per output row: a row is a contiguous run of bytes, copied in units of U.
template <class U>
__global__ void gather_rows_kernel(const U* __restrict__ src, int64_t src_rows, int64_t row_units,
                                   const int32_t* __restrict__ idx, int64_t first_index, U* __restrict__ dst) {
  const int64_t row = blockIdx.x;
  const int64_t from = idx[row] - first_index;
  U* out = dst + row * row_units;
  if (from < 0 || from >= src_rows) {  // invalid index: a zero row (documented in cuda_kernels.h)
    for (int64_t i = threadIdx.x; i < row_units; i += blockDim.x) out[i] = U{};
    return;
  }
  const U* in = src + static_cast<int64_t>(from) * row_units;
  for (int64_t i = threadIdx.x; i < row_units; i += blockDim.x) out[i] = in[i];
}

template <class T>
__global__ void add_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, int64_t n,
                           bool vec) {
  constexpr int kN = Vec16<T>::kN;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (vec) {
    for (int64_t v = first; v < n / kN; v += stride) {
      float x[kN], y[kN];
      load_vec(a + v * kN, x);
      load_vec(b + v * kN, y);
#pragma unroll
      for (int i = 0; i < kN; ++i) x[i] += y[i];
      store_vec(out + v * kN, x);
    }
  } else {
    for (int64_t i = first; i < n; i += stride) out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
  }
}

template <class T, class B>
__global__ void add_bias_kernel(T* __restrict__ out, const B* __restrict__ bias, int64_t rows, int64_t n) {
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = from_float<T>(to_float(out[i]) + to_float(bias[i % n]));
  }
}

template <class T>
__global__ void silu_mul_kernel(const T* __restrict__ gate_up, T* __restrict__ out, int64_t rows, int64_t inter,
                                bool vec) {
  constexpr int kN = Vec16<T>::kN;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (vec) {
    const int64_t per_row = inter / kN;
    for (int64_t v = first; v < rows * per_row; v += stride) {
      const int64_t r = v / per_row, c = (v % per_row) * kN;
      float g[kN], u[kN];
      load_vec(gate_up + r * 2 * inter + c, g);
      load_vec(gate_up + r * 2 * inter + inter + c, u);
#pragma unroll
      for (int i = 0; i < kN; ++i) g[i] = silu(g[i]) * u[i];
      store_vec(out + r * inter + c, g);
    }
  } else {
    for (int64_t i = first; i < rows * inter; i += stride) {
      const int64_t r = i / inter, c = i % inter;
      out[i] = from_float<T>(silu(to_float(gate_up[r * 2 * inter + c])) * to_float(gate_up[r * 2 * inter + inter + c]));
    }
  }
}

template <class T>
cudaError_t add_typed(const void* a, const void* b, void* out, int64_t n, cudaStream_t stream) {
  const bool vec = n % Vec16<T>::kN == 0 && aligned16(a) && aligned16(b) && aligned16(out);
  add_kernel<T><<<grid_for(vec ? n / Vec16<T>::kN : n), kThreads, 0, stream>>>(
      static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n, vec);
  return cudaGetLastError();
}

template <class T>
cudaError_t silu_mul_typed(const void* gate_up, void* out, int64_t rows, int64_t inter, cudaStream_t stream) {
  const bool vec = inter % Vec16<T>::kN == 0 && aligned16(gate_up) && aligned16(out);
  silu_mul_kernel<T><<<grid_for(rows * inter / (vec ? Vec16<T>::kN : 1)), kThreads, 0, stream>>>(
      static_cast<const T*>(gate_up), static_cast<T*>(out), rows, inter, vec);
  return cudaGetLastError();
}

template <class T>
cudaError_t add_bias_typed(void* out, const void* bias, DType bias_dtype, int64_t rows, int64_t n,
                           cudaStream_t stream) {
  const int blocks = grid_for(rows * n);
  if (bias_dtype == DType::kF32) {
    add_bias_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<T*>(out), static_cast<const float*>(bias), rows, n);
  } else if (bias_dtype == DType::kBF16) {
    add_bias_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<T*>(out), static_cast<const bf16*>(bias), rows, n);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_gather_rows(const void* src, int64_t src_rows, size_t row_bytes, const int32_t* idx, int64_t n,
                               void* dst, cudaStream_t stream, int64_t first_index) {
  if (n == 0 || row_bytes == 0) return cudaSuccess;
  const int64_t grid = n;
  if (row_bytes % 16 == 0 && aligned16(src) && aligned16(dst)) {
    const int64_t units = static_cast<int64_t>(row_bytes / 16);
    gather_rows_kernel<<<grid, static_cast<int>(std::min<int64_t>(kThreads, units)), 0, stream>>>(
        static_cast<const uint4*>(src), src_rows, units, idx, first_index, static_cast<uint4*>(dst));
  } else if (row_bytes % 4 == 0 && (reinterpret_cast<uintptr_t>(src) & 3u) == 0 &&
             (reinterpret_cast<uintptr_t>(dst) & 3u) == 0) {
    const int64_t units = static_cast<int64_t>(row_bytes / 4);
    gather_rows_kernel<<<grid, static_cast<int>(std::min<int64_t>(kThreads, units)), 0, stream>>>(
        static_cast<const uint32_t*>(src), src_rows, units, idx, first_index, static_cast<uint32_t*>(dst));
  } else {
    const int64_t units = static_cast<int64_t>(row_bytes);
    gather_rows_kernel<<<grid, static_cast<int>(std::min<int64_t>(kThreads, units)), 0, stream>>>(
        static_cast<const uint8_t*>(src), src_rows, units, idx, first_index, static_cast<uint8_t*>(dst));
  }
  return cudaGetLastError();
}

cudaError_t launch_add(const void* a, const void* b, void* out, int64_t n, DType dtype, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (dtype == DType::kBF16) return add_typed<bf16>(a, b, out, n, stream);
  if (dtype == DType::kF32) return add_typed<float>(a, b, out, n, stream);
  return cudaErrorInvalidValue;
}

cudaError_t launch_add_bias(void* out, DType out_dtype, const void* bias, DType bias_dtype, int64_t rows, int64_t n,
                            cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  if (out_dtype == DType::kBF16) return add_bias_typed<bf16>(out, bias, bias_dtype, rows, n, stream);
  if (out_dtype == DType::kF32) return add_bias_typed<float>(out, bias, bias_dtype, rows, n, stream);
  return cudaErrorInvalidValue;
}

cudaError_t launch_silu_mul(const void* gate_up, void* out, int64_t rows, int64_t inter, DType dtype,
                            cudaStream_t stream) {
  if (rows == 0 || inter == 0) return cudaSuccess;
  if (dtype == DType::kBF16) return silu_mul_typed<bf16>(gate_up, out, rows, inter, stream);
  if (dtype == DType::kF32) return silu_mul_typed<float>(gate_up, out, rows, inter, stream);
  return cudaErrorInvalidValue;
}

}  // namespace specula::cuda
